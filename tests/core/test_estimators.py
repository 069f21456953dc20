import numpy as np
import pytest

from triage.estimators import ProServeEstimator, SlidingServeEstimator, Work
from triage.profiles import available_profiles, load_profile

TRUE = dict(a_p=2e-8, b_p=4e-8, c_p=1e-4, a_d=3e-7, b_d=2e-4, t_c=0.02)


def batches(n, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        works = [Work(int(rng.integers(16, 512)), int(rng.integers(0, 1024))) for _ in range(rng.integers(0, 3))]
        works += [Work(1, int(rng.integers(64, 2048))) for _ in range(rng.integers(1, 32))]
        yield works


def test_proserve_fit_recovers_coefficients():
    truth = ProServeEstimator(**TRUE)
    samples = [(w, truth.batch_time(w)) for w in batches(300)]
    est = ProServeEstimator(0, 0, 0, 0, 0, 0)
    est.fit(samples)
    for k, v in TRUE.items():
        assert getattr(est, k) == pytest.approx(v, rel=1e-3)


def test_slidingserve_fit_is_accurate_per_scenario():
    truth = ProServeEstimator(**TRUE)
    samples = [(w, truth.batch_time(w)) for w in batches(400, seed=1)]
    est = SlidingServeEstimator({"global": [0.0] * 8})
    est.fit(samples[:300])
    assert {"decode", "mixed"} <= set(est.models)
    errs = [abs(est.batch_time(w) - t) / t for w, t in samples[300:]]
    assert np.mean(errs) < 0.02


def test_max_chunk_inverts_request_time():
    est = ProServeEstimator(**TRUE)
    for lkv in (0, 500):
        for budget in (0.001, 0.01, 0.05):
            k = est.max_chunk(lkv, budget, 4096)
            assert est.request_time(k, lkv) <= budget
            assert k == 4096 or est.request_time(k + 1, lkv) > budget
    assert est.time_to_budget(est.t_c) == 0  # nothing fits in the fixed cost alone


def test_online_correction_tracks_a_slower_machine():
    est = ProServeEstimator(**TRUE)
    for w in batches(100, seed=2):
        pred = est.uncorrected_batch_time(w)
        est.observe(pred, 1.5 * pred)
    assert est.beta == pytest.approx(1.5, rel=0.02)
    w = next(batches(1, seed=3))
    assert est.batch_time(w) == pytest.approx(1.5 * est.uncorrected_batch_time(w), rel=0.02)


def test_a_few_slow_steps_do_not_shorten_the_steps_after_them():
    """Live, the first steps of a burst ran 1.1-2.2x their prediction while the front end
    classified the arriving calls on the same two cores; a window mean carried them into beta
    for the next ~30 steps, each planned ~20 % shorter than the machine needed (its steps ran
    at 0.71-0.87 of their prediction, docs/measurements/single-engine.md, 35th day). beta takes
    the window's median: a spike of 8 steps in 32 moves it by under 3 %, while a lasting change
    of the machine's speed is still followed."""
    est = ProServeEstimator(**TRUE)
    steps = list(batches(140, seed=4))
    for k, w in enumerate(steps[:100]):
        pred = est.uncorrected_batch_time(w)
        est.observe(pred, (2.0 if 60 <= k < 68 else 1.0) * pred)    # a transient 2x spike
        if k >= 68:
            assert est.beta == pytest.approx(1.0, rel=0.03), k
    for w in steps[100:]:                                            # the machine slows down for good
        pred = est.uncorrected_batch_time(w)
        est.observe(pred, 1.5 * pred)
    assert est.beta == pytest.approx(1.5, rel=0.05)


@pytest.mark.parametrize("name", available_profiles())
def test_every_shipped_profile_loads_and_predicts(name):
    prof = load_profile(name)
    est = prof.estimator()
    assert est.batch_time([Work(128, 0), Work(1, 500)]) > 0
    assert prof.num_blocks > 0 and prof.block_size > 0 and prof.limits.max_num_seqs > 0


def test_published_profile_coefficients_are_kept_verbatim():
    raw = load_profile("a100-qwen1.5-7b").raw
    assert raw["published"]["prefill_alpha1"] == 5.135e-7
    assert raw["published"]["decode_gamma2"] == 1.330e-2
    assert raw["estimator"]["a_p"] == 5.135e-7 and raw["estimator"]["t_c"] == 1.330e-2


def test_unknown_profile_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="available"):
        load_profile("no-such-profile")


def _machine(prefill_factor: float, speed: float = 1.0) -> ProServeEstimator:
    """The profile's model on a machine `speed` times slower whose prompts cost
    `prefill_factor` times the profile's relative to its decodes."""
    t = dict(TRUE)
    for k in ("a_p", "b_p", "c_p"):
        t[k] *= prefill_factor
    return ProServeEstimator(**{k: v * speed for k, v in t.items()})


def _prompt_heavy(seed=5):
    rng = np.random.default_rng(seed)
    return [[Work(int(rng.integers(100, 400)), 0) for _ in range(3)] + [Work(1, 512)] for _ in range(20)]


@pytest.mark.parametrize("factor,speed", [(0.35, 1.0), (2.5, 0.6)])
def test_learn_shape_finds_a_machine_where_prompts_cost_differently(factor, speed):
    """A profile from one CPU on another: a scalar beta fitted mostly on decode steps leaves
    prompt-heavy steps 15-60 % off; with learn_shape the prefill ratio rho is learnt and they
    are predicted within 5 %."""
    truth = _machine(factor, speed)
    plain, shaped = ProServeEstimator(**TRUE), ProServeEstimator(**TRUE)
    shaped.learn_shape = True
    for w in batches(400, seed=3):
        for est in (plain, shaped):
            est.observe_batch(w, truth.batch_time(w))
    assert shaped.rho == pytest.approx(factor, rel=0.05)
    err = lambda est: max(abs(est.batch_time(w) / truth.batch_time(w) - 1) for w in _prompt_heavy())  # noqa: E731
    assert err(shaped) < 0.05
    assert err(plain) > 0.15


def test_learn_shape_leaves_rho_alone_when_steps_cannot_tell_the_parts_apart():
    """Only decode steps: no prefill share to fit, rho stays 1 and beta does the work."""
    truth = _machine(0.3, 2.0)
    est = ProServeEstimator(**TRUE)
    est.learn_shape = True
    for _ in range(200):
        w = [Work(1, 700)] * 16
        est.observe_batch(w, truth.batch_time(w))
    assert est.rho == 1.0 and est.beta == pytest.approx(2.0, rel=0.02)


def test_learnt_rho_is_the_least_squares_fit_of_noisy_steps():
    """The live fit of rho (solved in closed form after every step) gives what numpy's
    least squares gives on the same window of noisy measured steps."""
    from triage.estimators.base import RHO_RANGE

    truth = _machine(1.8, 1.3)
    rng = np.random.default_rng(11)
    est = ProServeEstimator(**TRUE)
    est.learn_shape = True
    est.theta = 0.0                      # no momentum: rho is this window's fit alone
    rows = []
    for w in batches(120, seed=7):
        real = truth.batch_time(w) * float(rng.uniform(0.85, 1.15))
        est.observe_batch(w, real)
        rows.append((*est.split(w), real))
    a = np.asarray(rows[-64:])
    wts = 1.0 / a[:, 2]
    (b1, b2), *_ = np.linalg.lstsq(a[:, :2] * wts[:, None], a[:, 2] * wts, rcond=None)
    expected = min(RHO_RANGE[1], max(RHO_RANGE[0], b2 / b1))
    assert est.rho == pytest.approx(expected, rel=1e-9)
    assert est.rho == pytest.approx(1.8, rel=0.15)
