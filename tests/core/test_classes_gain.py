import pytest

from triage.classes import ClassError, PriorityClass, PriorityClasses, load_classes
from triage.gain import request_gain, slo_met
from tests.core.factories import classes, make_request


def test_default_classes_follow_esi_order():
    c = load_classes()
    assert c.levels == (1, 2, 3, 4, 5)
    weights = [c.get(lv).weight for lv in c.levels]
    ttfts = [c.get(lv).ttft for lv in c.levels]
    assert weights == sorted(weights, reverse=True), "level 1 must weigh most"
    assert ttfts == sorted(ttfts), "level 1 must have the tightest TTFT SLO"


@pytest.mark.parametrize("row, msg", [
    (dict(level=0, name="x", weight=1, ttft=1, tpot=1), "level"),
    (dict(level=1, name="", weight=1, ttft=1, tpot=1), "name"),
    (dict(level=1, name="x", weight=0, ttft=1, tpot=1), "weight"),
    (dict(level=1, name="x", weight=1, ttft=-1, tpot=1), "SLO"),
])
def test_invalid_class_rows_are_refused(row, msg):
    with pytest.raises(ClassError, match=msg):
        PriorityClasses.from_dict({"classes": [row]})


def test_duplicate_levels_are_refused():
    row = dict(level=1, name="x", weight=1, ttft=1, tpot=1)
    with pytest.raises(ClassError, match="duplicate"):
        PriorityClasses.from_dict({"classes": [row, row]})


def test_edit_bumps_version_and_scaling_scales_slos():
    c = classes()
    e = c.edited({1: PriorityClass(1, "only", 3.0, 1.0, 0.1)})
    assert e.version == c.version + 1 and e.levels == (1,)
    s = c.scaled(2.0)
    assert s.get(3).ttft == 2 * c.get(3).ttft and s.get(3).tpot == 2 * c.get(3).tpot


def test_envelope_deadlines():
    r = make_request(level=2, arrival=10.0)
    assert r.deadline(1) == pytest.approx(10.0 + 2.0)
    assert r.deadline(5) == pytest.approx(10.0 + 2.0 + 4 * 0.15)
    r.generated = 3
    assert r.next_deadline == pytest.approx(r.deadline(4))


def test_tdg_counts_only_tokens_before_their_deadline():
    c = classes()
    r = make_request(level=1, output=3, arrival=0.0)   # deadlines 1.0, 1.1, 1.2; weight 16
    r.token_times = [0.5, 1.15, 1.19]                   # token 2 late
    g = request_gain(r, c)
    assert g.ideal == pytest.approx(16 * (c.w_first + 2 * c.w_decode))
    assert g.gain == pytest.approx(16 * (c.w_first + c.w_decode))
    assert not g.slo_met  # TPOT gap 0.65 > 0.1


def test_slo_met_needs_ttft_and_max_tpot_and_all_tokens():
    r = make_request(level=3, output=3, arrival=0.0)    # TTFT 4 s, TPOT 0.2 s
    r.token_times = [1.0, 1.1, 1.25]
    assert slo_met(r)
    r.token_times = [1.0, 1.1, 1.35]                    # one gap of 0.25
    assert not slo_met(r)
    r.token_times = [1.0, 1.1]                          # unfinished
    assert not slo_met(r)


def test_unserved_request_earns_nothing_but_counts_in_ideal():
    c = classes()
    r = make_request(level=5, output=10)
    g = request_gain(r, c)
    assert g.gain == 0 and g.ideal > 0 and not g.slo_met
