"""The order check: urgency inversions read off recorded times (triage/order_audit.py)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.order_audit import Served, order_audit


def call(i, level, known, first, ended=None, instance=None):
    return Served(f"r{i}", level, known, first, ended if ended is not None else (first or 0) + 1.0, instance)


def test_a_less_urgent_call_started_after_an_esi1_call_was_known_is_an_inversion():
    # the ESI-1 call known at 0.0 waited until 3.0; a level-5 call that came at 0.5 had its
    # first token at 2.0: the engine started it while the ESI-1 call waited
    rep = order_audit([call(1, 1, 0.0, 3.0), call(2, 5, 0.5, 2.0)], tolerance_s=1.0)
    assert rep["ok"] is False
    assert rep["inversions"] == 1 and rep["esi1"] == {"calls": 1, "overtaken": 1, "overtaken_by_later": 1}
    assert rep["per_level"]["1"]["overtaken_by_levels"] == {"5": 1}
    assert rep["inversions_by_later"] == 1   # it came after the ESI-1 call: the queue was jumped
    w = rep["worst"][0]
    assert w["id"] == "r1" and w["first_overtaker"]["id"] == "r2" and w["waited_after_s"] == pytest.approx(1.0)


def test_what_the_design_allows_is_not_counted():
    calls = [
        call(1, 1, 10.0, 11.02),      # ESI-1, first token 1.02 s after it was known
        call(2, 5, 9.0, 10.20),       # its first token within the tolerance: it was running already
        call(3, 4, 10.1, 11.0),       # in the ESI-1 call's step: first tokens 20 ms apart (a tie)
        call(4, 3, 11.0, 11.5),       # after the ESI-1 call's first token
        call(5, 2, 0.0, 12.0, instance="b"),   # waited on another engine: no pair with engine None
        call(6, 5, 0.0, 11.0, instance="a"),
    ]
    rep = order_audit(calls, tolerance_s=0.5, tie_s=0.05)
    assert rep["inversions"] == 0 and rep["ok"] is True
    assert rep["per_level"]["1"] == {"calls": 1, "overtaken": 0, "overtaken_by_later": 0, "overtaken_by_levels": {}}


def test_an_overtaker_that_was_there_first_is_told_apart_from_one_that_came_later():
    # an ESI-1 call known at 1.0 waited until 5.0; a level-5 call there since 0.0 had its first
    # token at 2.5 (a long step may have begun its prefill before the ESI-1 call came), and a
    # level-4 call that came at 1.5 had its first token at 3.0 (it jumped the queue)
    rep = order_audit([call(1, 1, 1.0, 5.0), call(2, 5, 0.0, 2.5), call(3, 4, 1.5, 3.0)], tolerance_s=1.0)
    assert rep["inversions"] == 2 and rep["inversions_by_later"] == 1
    assert rep["esi1"] == {"calls": 1, "overtaken": 1, "overtaken_by_later": 1}
    assert rep["worst"][0]["overtaken_by"] == 2 and rep["worst"][0]["overtaken_by_later"] == 1
    only_earlier = order_audit([call(1, 1, 1.0, 5.0), call(2, 5, 0.0, 2.5)], tolerance_s=1.0)
    assert only_earlier["esi1"] == {"calls": 1, "overtaken": 1, "overtaken_by_later": 0}


def test_a_call_that_never_had_a_first_token_waited_until_it_ended():
    # a level-2 call shed at 5.0 after waiting since 0; a level-4 call known at 1.0 served at 3.0
    rep = order_audit([call(1, 2, 0.0, None, ended=5.0), call(2, 4, 1.0, 3.0)], tolerance_s=1.0)
    assert rep["inversions"] == 1 and rep["ok"] is True   # ok speaks for ESI-1 only
    assert rep["per_level"]["2"]["overtaken"] == 1


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError):
        order_audit([], tolerance_s=-1)


def brute_force(calls, tol, tie):
    """(inversions, of them by a later call, calls overtaken by a later call)"""
    n = later = 0
    jumped = set()
    for a in calls:
        for b in calls:
            if a.level < b.level and a.instance == b.instance and b.first_token is not None \
                    and a.left_queue is not None \
                    and b.first_token > a.known + tol and b.first_token < a.left_queue - tie:
                n += 1
                if b.known > a.known:
                    later += 1
                    jumped.add(a.id)
    return n, later, len(jumped)


times = st.floats(0, 20, allow_nan=False).map(lambda x: round(x, 2))


@st.composite
def calls_st(draw):
    out = []
    for i in range(draw(st.integers(0, 25))):
        known = draw(times)
        first = draw(st.one_of(st.none(), times.map(lambda d: known + d)))
        ended = (first if first is not None else known) + draw(times)
        out.append(Served(f"r{i}", draw(st.integers(1, 5)), known, first, ended, draw(st.sampled_from([None, "a"]))))
    return out


@settings(max_examples=300, deadline=None)
@given(calls_st(), st.sampled_from([0.0, 0.3, 1.0]), st.sampled_from([0.0, 0.05]))
def test_the_sweep_counts_exactly_the_pairs_a_pairwise_check_finds(calls, tol, tie):
    rep = order_audit(calls, tolerance_s=tol, tie_s=tie)
    assert (rep["inversions"], rep["inversions_by_later"], rep["overtaken_by_later"]) == brute_force(calls, tol, tie)
    assert rep["ok"] == (rep["esi1"]["overtaken"] == 0)
