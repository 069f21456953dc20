"""The simulator's step-time truth is not the scheduler's estimator: a known bias is
learned online (seed 000 §4.1's β), measured residuals replace lognormal noise."""
import numpy as np
import pytest

from triage.classes import load_classes
from triage.estimators import Work
from triage.policies import make_policy
from triage.profiles import load_profile
from triage.sim.simulator import Instance, simulate
from triage.sim.traces import poisson_trace
from triage.sim.truth import MeasuredTruth, ModelTruth, cell, samples_path, truth_for


def run(profile, truth, bias, n=300, seed=0):
    classes = load_classes().scaled(profile.slo_scale)
    trace = poisson_trace(n, rate=1.0, seed=seed, prompt=(32, 400), output=(8, 120))
    return simulate(trace, make_policy("fcfs"), profile, classes, seed=seed, truth=truth, bias=bias)


@pytest.mark.parametrize("bias", [1.3, 0.75])
def test_a_known_bias_is_corrected_online_to_under_5_percent(bias):
    prof = load_profile("vllm-cpu-smollm2")
    rng = np.random.default_rng(0)
    res = run(prof, ModelTruth(prof.estimator(), rng, noise_cv=0.0, bias=bias), 1.0)
    e = res.estimator
    assert e["mape_uncorrected"] == pytest.approx(abs(1 - 1 / bias), abs=1e-4), "the estimator alone is off by the bias"
    assert e["mape_corrected"] < 0.05
    assert e["beta_final"] == pytest.approx(bias, rel=0.01)


def test_a_prefill_cost_the_profile_underrates_is_learnt_as_the_live_scheduler_learns_it():
    """A machine whose prompt tokens cost twice the profile's and whose decodes cost the
    same: no single β fits both kinds of step, so the simulated scheduler learns the prefill
    share ρ as well (as the live engine's does, `learn_shape`): ρ comes out at 2, β stays
    at 1, and the corrected predictions' error is a tenth of the fitted model's (which is
    off on every step with a prompt in it)."""
    prof = load_profile("vllm-cpu-smollm2")
    fitted = prof.estimator()
    slow_prefill = type(fitted)(a_p=2 * fitted.a_p, b_p=2 * fitted.b_p, c_p=2 * fitted.c_p,
                                a_d=fitted.a_d, b_d=fitted.b_d, t_c=fitted.t_c)
    e = run(prof, ModelTruth(slow_prefill, np.random.default_rng(0), noise_cv=0.0), 1.0, n=400).estimator
    assert e["rho_final"] == pytest.approx(2.0, rel=0.05) and e["beta_final"] == pytest.approx(1.0, rel=0.02)
    assert e["mape_uncorrected"] > 0.03 and e["mape_corrected"] < e["mape_uncorrected"] / 10


def test_measured_truth_with_a_bias_is_corrected_to_under_5_percent_aggregate_error():
    """With the engine's real residuals per-step error stays at the noise level, but β
    learns the bias: the corrected predictions' total over the run is within 5 %."""
    prof = load_profile("vllm-cpu-smollm2")
    classes = load_classes().scaled(prof.slo_scale)
    inst = Instance(make_policy("fcfs"), prof, classes, np.random.default_rng(1), truth="measured", bias=1.4)
    assert isinstance(inst.truth, MeasuredTruth)
    est, truth = inst.state.estimator, inst.truth
    works = [[Work(1, 100 + 5 * k)] * (1 + k % 8) for k in range(600)]
    pred_raw = pred_cor = real = 0.0
    for k, w in enumerate(works):
        t = truth.time(w)
        p = est.uncorrected_batch_time(w)
        if k >= 100:                     # after a warm-up of 100 steps
            pred_raw, pred_cor, real = pred_raw + p, pred_cor + est.beta * p, real + t
        est.observe(p, t)
    assert abs(pred_raw - real) / real > 0.25
    assert abs(pred_cor - real) / real < 0.05


def test_auto_truth_is_measured_where_the_profile_has_samples():
    cpu, a5000 = load_profile("vllm-cpu-smollm2"), load_profile("a5000-qwen1.5-7b")
    assert samples_path(cpu.name).exists()
    t = truth_for(cpu, np.random.default_rng(0))
    assert isinstance(t, MeasuredTruth) and t.n_samples > 300
    d = t.describe()
    assert d["kind"] == "measured" and 0.0 < d["residual_mape"] < 0.5
    assert isinstance(truth_for(a5000, np.random.default_rng(0)), ModelTruth)
    with pytest.raises(ValueError, match="no measured steps"):
        truth_for(a5000, np.random.default_rng(0), "measured")
    with pytest.raises(ValueError, match="unknown truth"):
        truth_for(a5000, np.random.default_rng(0), "oracle")


def test_measured_residuals_come_from_steps_of_the_same_shape():
    prof = load_profile("vllm-cpu-smollm2")
    fitted = prof.estimator()
    decode = [([Work(1, 100)] * 4, 0.09)] * 10          # 4 decodes: measured 0.09 s
    prefill = [([Work(300, 0)], 0.5)] * 10              # one 300-token prefill: 0.5 s
    t = MeasuredTruth(fitted, np.random.default_rng(0), decode + prefill)
    assert cell([Work(1, 100)] * 4) == ("decode", 3, 0) and cell([Work(300, 0), Work(1, 50)])[0] == "mixed"
    assert t.time([Work(1, 100)] * 4) == pytest.approx(0.09)
    assert t.time([Work(300, 0)]) == pytest.approx(0.5)
    # a shape never measured falls back to its scenario's residuals
    ratio = 0.09 / fitted._batch_time([Work(1, 100)] * 4)
    assert t.time([Work(1, 900)] * 20) == pytest.approx(fitted._batch_time([Work(1, 900)] * 20) * ratio)


def test_the_model_truth_is_unchanged_for_published_profiles():
    """a5000's truth is its own model × lognormal noise, as before (same stream)."""
    prof = load_profile("a5000-qwen1.5-7b")
    res = run(prof, "auto", 1.0, n=80)
    assert res.estimator["truth"]["kind"] == "model"
    assert res.estimator["mape_uncorrected"] < 0.05, "only 3 % noise separates truth and estimator"
