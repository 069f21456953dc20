"""Routers: round_robin, min_load, pab (seed 002 §3.4), gorouting (seed 000 Alg. 2)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from triage.classes import load_classes
from triage.profiles import load_profile
from triage.request import Request
from triage.routing import ROUTERS, make_router
from triage.routing.pab import prefill_admission_budget
from triage.policies.fairbatching import linear_step_model

PROFILE = load_profile("a5000-qwen1.5-7b")
CLASSES = load_classes().scaled(PROFILE.slo_scale)


@dataclass
class FakeLoad:
    index: int
    role: str = "mixed"
    n_waiting: int = 0
    n_running: int = 0
    n_decoding: int = 0
    free_blocks: int = 1000
    prefill_tokens: int = 0
    dec: list = field(default_factory=list)   # (slack, context, tpot)
    estimator: object = field(default_factory=PROFILE.estimator)

    def decodes(self, now):
        a = np.array(self.dec, dtype=float).reshape(len(self.dec), 3)
        return a[:, 0], a[:, 1], a[:, 2]


def req(rid="x", level=3, prompt=500, arrival=0.0) -> Request:
    c = CLASSES.get(level)
    return Request(id=rid, arrival=arrival, prompt_len=prompt, predicted_level=level, ttft_slo=c.ttft,
                   tpot_slo=c.tpot, weight=c.weight, predicted_output_len=50, output_len=50)


def test_registry_and_unknown_name():
    assert set(ROUTERS) == {"round_robin", "min_load", "pab", "gorouting"}
    with pytest.raises(ValueError, match="unknown router"):
        make_router("nope")


def test_round_robin_cycles_both_pools():
    rr = make_router("round_robin")
    pool = [FakeLoad(i) for i in range(3)]
    assert [rr.route(req(), pool, 0.0) for _ in range(5)] == [0, 1, 2, 0, 1]
    rr = make_router("round_robin")
    assert [rr.route_pd(req(), pool[:2], pool, 0.0) for _ in range(3)] == [(0, 0), (1, 1), (0, 2)]


def test_min_load_uses_weighted_request_counts():
    pool = [FakeLoad(0, n_waiting=1, n_running=0), FakeLoad(1, n_waiting=0, n_running=3), FakeLoad(2, n_waiting=0, n_running=3)]
    assert make_router("min_load").route(req(), pool, 0.0) == 1     # 4·1 > 3; tie → lowest index


def test_pab_formula_and_choice():
    est = PROFILE.estimator()
    a, b, c = linear_step_model(est)
    empty = FakeLoad(0)
    assert prefill_admission_budget(empty, 2.0, 0.0) == pytest.approx((2.0 - a) / (b + c))
    queued = FakeLoad(1, prefill_tokens=3000)
    assert prefill_admission_budget(queued, 2.0, 0.0) == pytest.approx((2.0 - a) / (b + c) - 3000)
    # decodes reserve time: more (and tighter) decodes leave less budget
    busy = FakeLoad(2, dec=[(0.1, 1000, 0.2)] * 50)
    assert prefill_admission_budget(busy, 2.0, 0.0) < prefill_admission_budget(empty, 2.0, 0.0)
    assert make_router("pab").route(req(), [queued, busy, empty], 0.0) == 2


# --- gorouting ------------------------------------------------------------------------------
def _loaded(router, index, seconds, now=0.0, role="mixed"):
    """An instance whose PrefillQueueMap holds `seconds` of predicted prefill."""
    load = FakeLoad(index, role=role)
    n_tok = int(seconds / PROFILE.estimator().prefill_time(1000) * 1000)
    if n_tok:
        router.on_dispatch(req(f"q{index}", level=5, prompt=n_tok, arrival=now), index, now, load)
    return load


def test_gorouting_light_instance_gets_the_most_idle():
    g = make_router("gorouting", mu=0.25, lam=0.75)
    pool = [_loaded(g, 0, 0.5), _loaded(g, 1, 0.0), _loaded(g, 2, 0.2)]
    assert g.route(req(level=3, prompt=200), pool, 0.0) == 1


def test_gorouting_packs_the_heaviest_non_heavy_instance():
    g = make_router("gorouting", mu=0.01, lam=0.75)         # nobody is "light"
    slo = CLASSES.get(3).ttft                                # 8 s
    pool = [_loaded(g, 0, 0.3 * slo), _loaded(g, 1, 0.6 * slo), _loaded(g, 2, 0.9 * slo)]
    # all three meet the SLO (Δ equal), instance 2 would be heavy (> λ·TTFT): pick 1
    assert g.route(req(level=3, prompt=200), pool, 0.0) == 1


def test_gorouting_all_heavy_falls_back_to_least_loaded():
    g = make_router("gorouting", mu=0.01, lam=0.05)
    slo = CLASSES.get(3).ttft
    pool = [_loaded(g, 0, 0.5 * slo), _loaded(g, 1, 0.3 * slo), _loaded(g, 2, 0.4 * slo)]
    assert g.route(req(level=3, prompt=200), pool, 0.0) == 1


def test_gorouting_no_gain_anywhere_is_a_seeded_random_pick():
    picks = []
    for _ in range(2):
        g = make_router("gorouting", seed=7)
        pool = [_loaded(g, i, 100.0) for i in range(4)]          # nobody can meet a 2 s TTFT
        picks.append([g.route(req(level=1, prompt=200), pool, 0.0) for _ in range(6)])
    assert picks[0] == picks[1] and len(set(picks[0])) > 1


def test_gorouting_candidates_only_where_the_request_gains():
    g = make_router("gorouting", mu=0.0, lam=10.0)
    slo = CLASSES.get(1).ttft                                # 2 s
    pool = [_loaded(g, 0, 5.0), _loaded(g, 1, 1.0)]          # only instance 1 can meet it
    assert g.route(req(level=1, prompt=200), pool, 0.0) == 1


def test_gorouting_timestamp_lag_compensation_and_queue_upkeep():
    g = make_router("gorouting")
    load = _loaded(g, 0, 1.0, now=10.0)
    e0 = g.exec_time(load, 10.0)
    assert e0 == pytest.approx(1.0, rel=0.05)
    assert g.exec_time(load, 10.4) == pytest.approx(e0 - 0.4)         # elapsed since ts_p subtracted
    assert g.exec_time(load, 20.0) == 0.0
    r = next(iter(g._map[0].reqs.values()))[0]
    g.on_first_token(r, 0, 10.5)
    assert g._map[0].reqs == {} and g._map[0].n_d == 1
    g.on_finish(r, 0, 11.0)
    assert g._map[0].n_d == 0


def test_gorouting_colocated_exec_counts_decodes_at_their_contexts_and_pd_uses_phi_p():
    """Co-located ESTIMATEEXEC adds n_d·b_d, b_d at the mean context of the instance's
    decoding requests (a 12k-token conversation costs more per step than a 100-token one);
    a prefill instance's EXEC has no decode term, and its gain uses φp."""
    g = make_router("gorouting")
    long_i, short_i, pre = FakeLoad(0), FakeLoad(1), FakeLoad(2, role="prefill")
    for load, prompt in ((long_i, 12_000), (short_i, 100), (pre, 12_000)):
        r = req(f"d{load.index}", prompt=prompt)
        g.on_dispatch(r, load.index, 0.0, load)
        g.on_first_token(r, load.index, 1.0)                 # now decoding: n_d = 1
    est = long_i.estimator
    assert g.exec_time(long_i, 1.0) == pytest.approx(est.decode_time(12_000))
    assert g.exec_time(short_i, 1.0) == pytest.approx(est.decode_time(100))
    assert g.exec_time(long_i, 1.0) > g.exec_time(short_i, 1.0)
    assert g.exec_time(pre, 1.0) == 0.0
    g.on_finish(req("d0", prompt=12_000), 0, 2.0)
    assert g.exec_time(long_i, 2.0) == 0.0 and g._map[0].ctx_d == 0
    r = req(level=3, prompt=500)
    assert g._phi(pre, [r, r], 0.5, 0.0) == pytest.approx(0.5 + 2 * est.beta * est.t_c)   # φp


def test_decode_pool_by_free_blocks():
    g = make_router("gorouting")
    dec = [FakeLoad(0, free_blocks=10), FakeLoad(1, free_blocks=500), FakeLoad(2, free_blocks=500)]
    assert g.pick_decode(req(), dec, 0.0) == 1


def test_gorouting_models_the_queue_the_local_scheduler_serves():
    """Behind a class-aware local scheduler (triage: queue_order "level") an ESI-1 request
    does not wait for the ESI-5 prefills queued on an instance; behind fcfs it waits for
    everything queued there. An ESI-5 request waits behind everything in either view."""
    from triage.policies.base import POLICIES

    assert POLICIES["triage"].queue_order == "level" and POLICIES["fcfs"].queue_order == "arrival"

    def pick(policy: str, level: int) -> int:
        g = make_router("gorouting")
        g.bind_policy(POLICIES[policy]())
        low = _loaded(g, 0, 3.0)                             # 3 s of ESI-5 prefill queued
        urgent = FakeLoad(1)                                 # 1 s of ESI-1 prefill queued
        g.on_dispatch(req("u1", level=1, prompt=int(1.0 / PROFILE.estimator().prefill_time(1000) * 1000)), 1, 0.0, urgent)
        return g.route(req(level=level, prompt=200), [low, urgent], 0.0)

    assert pick("fcfs", 1) == 1          # 3 s queued would miss the 2 s TTFT: the 1 s queue
    assert pick("triage", 1) == 0        # nothing as urgent queued on instance 0: the most idle for it
    assert pick("triage", 5) == 1        # an ESI-5 request waits behind both queues: the shorter
    g = make_router("gorouting", view="arrival")
    g.bind_policy(POLICIES["triage"]())
    assert not g.by_level                # an explicit view wins over the policy's
    with pytest.raises(ValueError, match="view"):
        make_router("gorouting", view="sideways")
