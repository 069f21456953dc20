"""Rules that need no model: vital-sign parsing, ESI floors, escalation, calibration, metrics."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from predictors.calibration import expected_calibration_error, fit_temperature, nll
from predictors.evaluate import ktas_text, semigran_report
from predictors.metrics import bucket_report, urgency_report
from predictors.model import bucket_of, clean_text, softmax
from predictors.urgency import bayes_threshold, choose_escalate_below, decide
from predictors.vitals import Vitals, danger_zone_limits, parse_vitals, safety_floor


@pytest.mark.parametrize("text, expect", [
    ("abd pain, age 67, SBP 85 DBP 50 HR 110 RR 22 BT 36.8 SpO2 95, mental: alert",
     dict(age=67, sbp=85, dbp=50, hr=110, rr=22, bt=36.8, spo2=95, avpu="A")),
    ("45F c/o dizziness x1d. BP 128/80 HR 88 RR 18 T 36.8 SpO2 98% RA. mental alert",
     dict(age=45, sbp=128, dbp=80, hr=88, rr=18, bt=36.8, spo2=98, avpu="A")),
    ("pt 5 y/o M, CC: fever; V/S 100/60-150-32-38.9, sat 91; AVPU V",
     dict(age=5, sbp=100, dbp=60, hr=150, rr=32, bt=38.9, spo2=91, avpu="V")),
    ("dyspnea, age 80, mental: responds to pain only", dict(age=80, avpu="P")),
    # a chief complaint that says "mental" before the AVPU reading (KTAS nurses write both)
    ("mental change, age 76, mental: unresponsive", dict(age=76, avpu="U")),
    ("altered mental change, age 68, BT 37.3, mental: pain", dict(age=68, bt=37.3, avpu="P")),
    ("mental status change, SBP 150 DBP 100 HR 84, mental: alert", dict(sbp=150, dbp=100, hr=84, avpu="A")),
    ("my dad, heart rate of 135, resp rate 32, sats 88, blood pressure 85/50",        # spelled out by a caller
     dict(hr=135, rr=32, spo2=88, sbp=85, dbp=50)),
    ("pulse 40, oxygen saturation 84", dict(hr=40, spo2=84)),
    ("my dad has chest pain", dict()),
    ("", dict()),
])
def test_parse_vitals(text, expect):
    v = parse_vitals(text)
    for k in ("age", "sbp", "dbp", "hr", "rr", "bt", "spo2", "avpu"):
        assert getattr(v, k) == expect.get(k), k


@pytest.mark.parametrize("text", [
    "please send HR 2 copies of the signed contract",          # human resources
    "PR 12 broke the build, can you revert it",                 # pull request
    "we sat 45 people at the gala dinner",
    "oxygen is 21 percent of the air we breathe",
    "the mental pain of losing a job is real, write me a poem about it",
    "set the pulse 30 times a second in the LED driver",
    "add RR 5 to the rota for saturday",
    "Model T 20 horsepower, how fast could it go",
])
def test_everyday_words_are_not_vital_signs(text):
    """Keywords that are also office or code words count only beside another vital sign,
    so paperwork and chat never trip an ESI floor (revision 4, non-dispatch traffic)."""
    v = parse_vitals(text)
    assert not v.any(), v
    assert safety_floor(v, 3).level == 5 and safety_floor(v, 5).level == 5
    assert decide(np.array([0.0, 0.0, 0.0, 0.0, 1.0]), text, escalate_below=0.16).level == 5


@pytest.mark.parametrize("text, expect", [
    ("HR 30, BP 80/40, mental: pain", dict(hr=30, sbp=80, dbp=40, avpu="P")),   # the same keywords in a vitals line
    ("67M c/o dyspnea. HR 120 RR 30 T 37.9. mental pain", dict(age=67, hr=120, rr=30, bt=37.9, avpu="P")),
    ("my dad, oxygen 85, heart rate of 130", dict(hr=130, spo2=85)),
    ("heart rate of 190", dict(hr=190)),                                          # unambiguous on its own
    ("sats 88 and pulse 130", dict(hr=130, spo2=88)),
])
def test_ambiguous_keywords_count_beside_another_vital(text, expect):
    v = parse_vitals(text)
    for k in ("age", "sbp", "dbp", "hr", "rr", "bt", "spo2", "avpu"):
        assert getattr(v, k) == expect.get(k), k


def test_danger_zone_limits_by_age():
    assert danger_zone_limits(1) == (160, 40)
    assert danger_zone_limits(5) == (140, 30)
    assert danger_zone_limits(40) == (100, 20)
    assert danger_zone_limits(None) == (100, 20)


@pytest.mark.parametrize("v, model_level, floor", [
    (Vitals(avpu="U"), 4, 1),
    (Vitals(avpu="P"), 2, 1),
    (Vitals(spo2=80), 3, 1),
    (Vitals(age=50, sbp=65), 3, 1),
    (Vitals(avpu="V"), 5, 2),
    (Vitals(spo2=90), 4, 2),
    (Vitals(spo2=89), 4, 1),           # ESI v4 decision point A names SpO2 < 90 (85 before revision 5)
    (Vitals(spo2=86), 3, 1),
    (Vitals(spo2=91), 5, 2),
    (Vitals(gcs=8), 5, 1),             # unresponsive
    (Vitals(gcs=9), 5, 5),
    (Vitals(age=50, sbp=85), 4, 2),
    (Vitals(age=50, hr=120), 3, 2),    # decision point D applies to level-3 candidates
    (Vitals(age=50, hr=120), 4, 5),    # ... and not to 0-1 resource patients
    (Vitals(age=50, rr=24), 3, 2),
    (Vitals(age=5, hr=130), 3, 5),     # normal for a 5-year-old
    (Vitals(age=5, hr=150), 3, 2),
    (Vitals(age=1, rr=38), 3, 5),
    (Vitals(age=50, sbp=130, hr=80, rr=16, spo2=98, avpu="A"), 3, 5),
])
def test_safety_floor(v, model_level, floor):
    assert safety_floor(v, model_level).level == floor


def test_gcs_is_read_beside_another_vital_sign_only():
    """"GCS" is also Google Cloud Storage: a Glasgow Coma Scale counts only in a vitals line."""
    assert parse_vitals("fall from height, GCS 6, age 71, SBP 123 DBP 77 HR 80 RR 20").gcs == 6
    assert safety_floor(parse_vitals("MVA, GCS 7, BP 130/80 HR 90"), 3).level == 1
    assert parse_vitals("please upload GCS 3 files to the bucket").gcs is None
    assert parse_vitals("GCS 25, HR 80").gcs is None  # not a Glasgow score


@given(st.text(max_size=300))
@settings(max_examples=200, deadline=None)
def test_parser_and_floor_total(text):
    v = parse_vitals(text)
    f = safety_floor(v, 3)
    assert f.level in (1, 2, 5)


def test_decide_escalates_only_when_mass_on_1_2_reaches_threshold():
    p = np.array([0.05, 0.20, 0.60, 0.10, 0.05])
    d = decide(p, "no vitals here", escalate_below=0.3, use_vitals=False)
    assert (d.level, d.predicted_level, d.escalated) == (3, 3, False)
    d = decide(p, "no vitals here", escalate_below=0.25, use_vitals=False)
    assert (d.level, d.predicted_level, d.escalated) == (2, 3, True)
    d = decide(np.array([0.2, 0.1, 0.6, 0.05, 0.05]), "", escalate_below=0.25, use_vitals=False)
    assert d.level == 1
    d = decide(p, "", escalate_below=None, use_vitals=False)
    assert d.level == 3


def test_decide_never_lowers_urgency():
    p = np.array([0.9, 0.05, 0.03, 0.01, 0.01])
    d = decide(p, "SBP 130 HR 70 RR 16 SpO2 99, mental: alert", escalate_below=0.2)
    assert d.level == 1


def test_decide_applies_vitals_floor():
    p = np.array([0.01, 0.04, 0.85, 0.05, 0.05])
    d = decide(p, "abd pain, age 67, SBP 85 DBP 50 HR 90 RR 18, mental: alert", escalate_below=0.3)
    assert d.level == 2 and d.predicted_level == 3 and any("SBP<90" in r for r in d.reasons)
    d = decide(p, "abd pain, age 67, SBP 120 HR 90 RR 18, mental: unresponsive", escalate_below=0.3)
    assert d.level == 1


def test_choose_escalate_below_prefers_fewer_misses():
    # two critical patients whose model mass on 1-2 is 0.35 and 0.45; three non-critical with 0.05
    probs = np.array([[0.05, 0.30, 0.60, 0.03, 0.02], [0.05, 0.40, 0.50, 0.03, 0.02]] + [[0.01, 0.04, 0.90, 0.03, 0.02]] * 3)
    t, table = choose_escalate_below(probs, [""] * 5, [2, 2, 3, 3, 3])
    assert t <= 0.34 and table[t]["under"] == 0
    assert bayes_threshold(5.0) == pytest.approx(1 / 6)


def test_escalate_below_is_never_above_the_bayes_threshold():
    """Validation where every critical patient is confidently called 1-2 would let a free
    search pick any threshold; the rule keeps its safety margin anyway."""
    probs = np.array([[0.1, 0.8, 0.06, 0.02, 0.02]] * 3 + [[0.01, 0.29, 0.66, 0.02, 0.02]] + [[0.01, 0.04, 0.9, 0.03, 0.02]] * 4)
    t, table = choose_escalate_below(probs, [""] * 8, [2, 2, 2, 3, 3, 3, 3, 3])
    assert t <= bayes_threshold(5.0)
    assert table[0.5]["cost"] < table[t]["cost"]  # what an unconstrained search would have preferred
    assert decide(probs[3], "", t).level == 2  # P(1-2) = 0.30 > 1/6: escalated


def test_temperature_scaling_recovers_known_temperature():
    rng = np.random.default_rng(0)
    true_logits = rng.normal(size=(4000, 5)) * 2.0
    p = softmax(true_logits)
    labels = np.array([rng.choice(5, p=row) for row in p])
    t = fit_temperature(true_logits * 3.0, labels)  # model 3x over-confident
    assert t == pytest.approx(3.0, rel=0.1)
    assert nll(true_logits * 3.0, labels, t) < nll(true_logits * 3.0, labels, 1.0)
    before = expected_calibration_error(softmax(true_logits * 3.0), labels)
    after = expected_calibration_error(softmax(true_logits * 3.0, t), labels)
    assert after < before


def test_urgency_report_definitions():
    gold = [1, 1, 2, 2, 3, 4, 5, 5]
    pred = [1, 2, 2, 4, 2, 4, 5, 4]
    r = urgency_report(gold, pred)
    assert r["n"] == 8
    assert r["accuracy"] == pytest.approx(4 / 8)
    assert r["under_triage_1_2"] == pytest.approx(2 / 4)  # 1->2 and 2->4
    assert r["critical_to_3plus"] == pytest.approx(1 / 4)
    assert r["level1_recall"] == pytest.approx(1 / 2)
    assert r["over_triage"] == pytest.approx(2 / 8)  # 3->2 and 5->4
    assert sum(map(sum, r["confusion"])) == 8 and r["confusion"][0] == [1, 1, 0, 0, 0]
    assert 0 <= r["macro_f1"] <= 1


def test_bucket_report_and_bucket_of():
    edges = [64, 128, 256, 512]
    assert [bucket_of(t, edges) for t in (0, 63, 64, 127, 128, 511, 512, 9999)] == [0, 0, 1, 1, 2, 3, 4, 4]
    r = bucket_report([0, 1, 2, 4], [0, 2, 2, 2], 5)
    assert r["accuracy"] == 0.5 and r["within_one_bucket"] == 0.75


def test_ordinal_bucket_leans_to_the_middle_only_as_far_misses_cost_more():
    import numpy as np

    from predictors.model import ordinal_bucket
    from predictors.train import choose_far_cost

    torn = [0.45, 0.1, 0.45 - 1e-9]          # unsure between the shortest and the longest bucket
    assert ordinal_bucket(torn, 1.0).tolist() == [0]                  # far_cost 1: the argmax
    assert ordinal_bucket(torn, 2.0).tolist() == [1]                  # the middle is a safer bet (0.9 < 1.0)
    sure = [0.8, 0.15, 0.05]
    assert ordinal_bucket(sure, 4.0).tolist() == [0]                  # a confident head is not overruled
    gold = np.array([0, 2, 0, 2])
    probs = np.array([[0.45, 0.1, 0.45]] * 4) + np.array([[0.01, 0, -0.01], [-0.01, 0, 0.01]] * 2)
    assert choose_far_cost(probs, gold, target=0.5) == 1.0            # the argmax already has 4/4 exact
    probs = probs[:, ::-1]                                            # now the argmax is always two buckets off
    c = choose_far_cost(probs, gold, target=0.9)
    assert c > 1.0 and (abs(ordinal_bucket(probs, c) - gold) <= 1).all()


def test_semigran_mapping():
    r = semigran_report(["em", "em", "ne", "ne", "sc"], [2, 3, 4, 5, 5])
    assert r["accuracy"] == pytest.approx(3 / 5)
    assert r["under_triage_1_2"] == pytest.approx(0.5)
    assert r["confusion"][0] == [0, 1, 1, 0, 0]


def test_ktas_text_uses_only_triage_fields():
    row = {"Chief_complain": "abd pain", "Age": "67", "SBP": "85", "DBP": "50", "HR": "110", "RR": "22", "BT": "36.8",
           "Saturation": "", "Pain": "1", "NRS_pain": "7", "Mental": "1", "Diagnosis in ED": "Appendicitis", "KTAS_expert": "2"}
    t = ktas_text(row)
    assert t == "abd pain, age 67, SBP 85 DBP 50 HR 110 RR 22 BT 36.8, NRS 7, mental: alert"
    assert "Appendicitis" not in t
    assert ktas_text({"Chief_complain": "??", "RR": "??", "NRS_pain": "#BOÞ!", "Pain": "1"}).startswith("chief complaint not recorded")


def test_clean_text():
    assert clean_text(None) == ""
    assert clean_text("a\x00b") == "a b"
    assert len(clean_text("x" * 100_000)) == 4000


def test_avpu_after_a_mental_chief_complaint_fires_decision_point_a():
    """"mental change" as the complaint must not hide the AVPU reading that follows it: an
    unresponsive patient is level 1 whatever the complaint says (ESI decision point A)."""
    for text in ("mental change, age 79, SBP 160 DBP 90 HR 88, mental: unresponsive",
                 "mental change, age 77, mental: pain"):
        assert safety_floor(parse_vitals(text), 2).level == 1, text
    assert safety_floor(parse_vitals("mental change, age 83, SBP 150 DBP 100 HR 84, mental: alert"), 2).level > 1
