"""What the simulated scheduler is told (oracle / predicted / noisy) versus the truth it is
judged by (gold level, true output length), and the TPOT definitions."""
import numpy as np
import pytest

from triage.classes import load_classes
from triage.policies import make_policy
from triage.profiles import load_profile
from triage.sim.inputs import (Mode, TextPool, apply_inputs, classifier_figures, draw_texts, noisy_levels,
                               noisy_lengths, parse_mode)
from triage.sim.metrics import as_gold, slo_met, summarize, tpot_value
from triage.sim.simulator import make_request, simulate
from triage.sim.traces import TraceRequest, poisson_trace


@pytest.mark.parametrize("text, mode", [
    ("oracle", Mode("oracle")), ("predicted", Mode("predicted")), ("noisy:0.2", Mode("noisy", 0.2)),
    ("noisy:0", Mode("noisy", 0.0)), ("noisy:1", Mode("noisy", 1.0)), (None, Mode("oracle")),
])
def test_parse_mode(text, mode):
    assert parse_mode(text) == mode


@pytest.mark.parametrize("bad", ["noisy", "noisy:", "noisy:x", "noisy:1.5", "noisy:-0.1", "gold", "noisy:nan"])
def test_bad_modes_are_clear_errors(bad):
    with pytest.raises(ValueError, match="noisy:E|oracle, predicted"):
        parse_mode(bad)


def test_noisy_levels_follow_the_documented_rule():
    gold = np.tile([1, 2, 3, 4, 5], 4000)
    assert (noisy_levels(gold, 0.0) == gold).all()
    seen = noisy_levels(gold, 0.2, seed=1)
    wrong = seen != gold
    assert abs(wrong.mean() - 0.2) < 0.01
    assert (np.abs(seen - gold)[wrong] == 1).all(), "every mistake is one level off (adjacent)"
    assert (seen[gold == 1] >= 1).all() and (seen[gold == 5] <= 5).all()
    assert (seen[(gold == 1) & wrong] == 2).all() and (seen[(gold == 5) & wrong] == 4).all()
    mid = (gold == 3) & wrong
    assert abs((seen[mid] == 4).mean() - 0.5) < 0.05, "up and down with equal odds in the middle"
    # common draws: the requests mistaken at 0.1 are among those mistaken at 0.2
    wrong_01 = noisy_levels(gold, 0.1, seed=1) != gold
    assert (wrong_01 <= wrong).all()
    assert (noisy_levels(gold, 0.2, seed=1) == seen).all(), "seeded"


def test_noisy_lengths_double_or_halve():
    true = np.full(10000, 100)
    seen = noisy_lengths(true, 0.3, seed=0)
    assert set(np.unique(seen)) == {50, 100, 200}
    assert abs((seen != true).mean() - 0.3) < 0.02


def pool():
    gold = [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    level = [1, 2, 2, 3, 3, 3, 4, 5, 5, 5]      # text 1 (gold 1) under-triaged to 2; text 3 (gold 2) to 3
    length = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
    return TextPool("toy", gold, ["dispatch"] * 10, level, length)


def test_texts_are_drawn_by_gold_level_and_seeded():
    p = pool()
    levels = [1, 2, 3, 4, 5] * 20
    picks = draw_texts(levels, p, seed=0)
    assert [p.gold[i] for i in picks] == levels
    assert (draw_texts(levels, p, seed=0) == picks).all()
    assert len(set(picks.tolist())) == 10
    with pytest.raises(ValueError, match="no text of gold level"):
        draw_texts([1, 2], TextPool("ones", [1, 1]), seed=0)


def test_predicted_inputs_change_what_the_scheduler_sees_not_the_truth():
    trace = poisson_trace(200, rate=2.0, seed=3)
    out, info = apply_inputs(trace, levels="predicted", lengths="predicted", pool=pool(), seed=0)
    assert [t.level for t in out] == [t.level for t in trace], "gold levels are the trace's"
    assert [t.output_len for t in out] == [t.output_len for t in trace], "the engine produces the true length"
    assert all(40 <= t.scheduler_output <= 49 for t in out)
    assert info["levels"] == "predicted" and info["texts"] == "toy"
    c = info["classifier"]
    assert 0 < c["accuracy"] < 1 and 0 < c["under_triage_1_2"] < 1
    assert c["distinct_texts"]["n"] == 10 and c["distinct_texts"]["accuracy"] == 0.7
    # oracle: nothing changes, no classifier figures
    same, info0 = apply_inputs(trace)
    assert same == trace and "classifier" not in info0
    with pytest.raises(ValueError, match="text pool"):
        apply_inputs(trace, levels="predicted")


def test_classifier_figures():
    f = classifier_figures([1, 1, 2, 3, 5], [1, 3, 2, 2, 5], ["dispatch"] * 4 + ["chat"])
    assert f["n"] == 4 and f["accuracy"] == 0.5 and f["under_triage_1_2"] == round(1 / 3, 4)
    assert f["over_triage"] == 0.25 and f["chat_n"] == 1 and f["esi1_recall"] == 0.5


def test_the_scheduler_gets_the_told_level_and_length_the_engine_the_true_one():
    classes = load_classes()
    t = TraceRequest(0.0, 100, 50, 1, seen_level=4, seen_output=7)
    r = make_request(0, t, classes)
    assert r.level == 4 and r.ttft_slo == classes.get(4).ttft, "SLOs of the level it was told, as in production"
    assert r.predicted_output_len == 7 and r.output_len == 50
    capped = TraceRequest(0.0, 100, 58, 1, seen_output=500, max_tokens=64)
    assert make_request(1, capped, classes).predicted_output_len == 64, "never beyond the client's max_tokens"
    prof = load_profile()
    res = simulate([t, TraceRequest(0.5, 80, 20, 3)], make_policy("fcfs"), prof, classes.scaled(prof.slo_scale))
    done = {r.id: r for r in res.requests}
    assert done["r0"].generated == 50 and done["r0"].predicted_output_len == 7
    assert res.gold == {"r0": 1, "r1": 3}


def test_results_are_grouped_and_judged_by_gold_level():
    classes = load_classes()
    t = TraceRequest(0.0, 100, 3, 1, seen_level=5)          # an ESI-1 call the classifier put at 5
    r = make_request(0, t, classes)
    slow = classes.get(1).ttft + 0.5                        # late for ESI-1, in time for ESI-5
    r.token_times = [slow, slow + 0.01, slow + 0.02]
    r.generated = 3
    assert slo_met(r) and not slo_met(as_gold(r, 1, classes))
    s = summarize([r], classes, gold={"r0": 1})
    assert list(s["per_class"]) == ["1"] and s["per_class"]["1"]["slo_attainment"] == 0.0
    assert s["per_class"]["1"]["seen_other_level"] == 1
    assert summarize([r], classes)["per_class"]["5"]["slo_attainment"] == 1.0


def test_tpot_definitions():
    t = [1.0, 1.1, 1.2, 2.2, 2.3]          # one 1 s stall after the third token
    assert tpot_value(t, "mean") == pytest.approx(1.3 / 4)
    assert tpot_value(t, "max-gap") == pytest.approx(1.0)
    assert tpot_value(t, "running") == pytest.approx(max(0.1, 0.2 / 2, 1.2 / 3, 1.3 / 4))
    assert tpot_value([1.0], "mean") is None
    classes = load_classes()
    r = make_request(0, TraceRequest(0.0, 10, 5, 3), classes)
    r.generated = 5
    tp = classes.get(3).tpot
    r.token_times = [0.1, 0.1 + tp * 0.5, 0.1 + tp, 0.1 + tp * 2.8, 0.1 + tp * 3.2]   # mean < SLO, one gap 1.8×
    assert slo_met(r, "mean") and not slo_met(r, "max-gap")
    s = summarize([r], classes, tpot_metric="mean")
    assert s["tpot_metric"] == "mean" and s["slo_attainment"] == 1.0
    assert summarize([r], classes, tpot_metric="max-gap")["slo_attainment"] == 0.0
    with pytest.raises(ValueError, match="tpot-metric"):
        summarize([r], classes, tpot_metric="median")


def test_max_gap_is_reported_beside_for_esi_1_and_2():
    classes = load_classes()
    prof = load_profile()
    trace = poisson_trace(60, rate=2.0, seed=1, mix=(0.3, 0.3, 0.2, 0.1, 0.1))
    res = simulate(trace, make_policy("fcfs"), prof, classes.scaled(prof.slo_scale))
    s = summarize(res.requests, classes.scaled(prof.slo_scale), gold=res.gold)
    assert "slo_attainment_max_gap" in s["per_class"]["1"] and "slo_attainment_max_gap" in s["per_class"]["2"]
    assert "slo_attainment_max_gap" not in s["per_class"]["3"]
    assert s["per_class"]["1"]["slo_attainment_max_gap"] <= s["per_class"]["1"]["slo_attainment"]
