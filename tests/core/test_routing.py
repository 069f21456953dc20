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
    seats: int | None = None                  # max_num_seqs, where the instance reports it
    dec: list = field(default_factory=list)   # (slack, context, tpot)
    pre: list = field(default_factory=list)   # unfinished prefills: (slack, prompt, tpot)
    estimator: object = field(default_factory=PROFILE.estimator)

    def decodes(self, now):
        a = np.array(self.dec, dtype=float).reshape(len(self.dec), 3)
        return a[:, 0], a[:, 1], a[:, 2]

    def prefills(self, now):
        a = np.array(self.pre, dtype=float).reshape(len(self.pre), 3)
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
        g = make_router("gorouting", seed=7, fallback="random")     # Alg. 2 line 19 as printed
        pool = [_loaded(g, i, 100.0) for i in range(4)]          # nobody can meet a 2 s TTFT
        picks.append([g.route(req(level=1, prompt=200), pool, 0.0) for _ in range(6)])
    assert picks[0] == picks[1] and len(set(picks[0])) > 1


def test_gorouting_no_gain_anywhere_falls_back_to_the_least_loaded_by_default():
    g = make_router("gorouting", seed=7)
    pool = [_loaded(g, 0, 100.0), _loaded(g, 1, 40.0), _loaded(g, 2, 60.0), _loaded(g, 3, 40.0)]  # none meets 2 s
    assert [g.route(req(level=1, prompt=200), pool, 0.0) for _ in range(3)] == [1, 1, 1]   # argmin EXEC, ties low
    with pytest.raises(ValueError, match="fallback"):
        make_router("gorouting", fallback="first")


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
    dl1, tpot = np.array([r.deadline(1)] * 2), np.array([r.tpot_slo] * 2)
    assert g._phi(pre, dl1, tpot, 0.5, 0.0) == pytest.approx(0.5 + 2 * est.beta * est.t_c)   # φp


def _decoding(g, load, n, level=5, tag="d"):
    """`n` requests at `level` dispatched to `load` and past their first token."""
    for k in range(n):
        r = req(f"{tag}{load.index}{k}", level=level, prompt=50)
        g.on_dispatch(r, load.index, 0.0, load)
        g.on_first_token(r, load.index, 0.1)


@pytest.mark.parametrize("seat_aware", [True, False])
def test_gorouting_counts_the_requests_waiting_for_a_seat_on_a_full_instance(seat_aware):
    """Two instances, every seat (4) held by a decode; instance 0 also holds 10 requests
    queued 4.8 s ago. They wait for a seat, so the elapsed time must not be taken off their
    prefill (the printed lag compensation lets them vanish: both instances then look alike
    but for n_d·b_d). The new call goes to instance 1 although it runs 5 % slower (β 1.05);
    with seat_aware=False, the rule as printed, the instance with 10 calls waiting looks
    the lighter one."""
    g = make_router("gorouting", seat_aware=seat_aware, seat_wait=False)
    pool = [FakeLoad(0, seats=4), FakeLoad(1, seats=4)]
    pool[1].estimator.beta = 1.05
    for load in pool:
        _decoding(g, load, 4)
    for k in range(10):
        g.on_dispatch(req(f"w{k}", level=5, prompt=50, arrival=0.2), 0, 0.2, pool[0])
    new = req("new", level=5, prompt=50, arrival=5.0)
    waiting = 10 * pool[0].estimator.prefill_time(50)
    assert g.exec_time(pool[0], 5.0, new) == pytest.approx(
        (waiting if seat_aware else 0.0) + 4 * pool[0].estimator.decode_time(50))
    if seat_aware:
        assert g.route(new, pool, 5.0) == 1
    else:
        assert g.exec_time(pool[0], 5.0, new) < g.exec_time(pool[1], 5.0, new)
    # a decode that finishes frees a seat: the first queued request runs, and the 4.9 s since
    # the queue's last update come off its prefill (all of it) and off no other
    g.on_finish(req("d00", level=5, prompt=50), 0, 5.0)
    if seat_aware:
        assert g.exec_time(pool[0], 5.1, new) == pytest.approx(
            waiting - pool[0].estimator.prefill_time(50) + 3 * pool[0].estimator.decode_time(50))


@pytest.mark.parametrize("seat_wait", [True, False])
def test_gorouting_sends_a_call_that_must_wait_for_a_seat_where_one_frees_first(seat_wait):
    """Two full instances (4 seats, 4 decodes, 2 calls queued each, alike but for the
    decodes' progress): instance 1's calls have 5 tokens left of their predicted 50,
    instance 0's all 50, and instance 1 runs 5 % slower. A new call finds no seat on
    either; on instance 1 one frees ten times sooner, so it goes there. EXEC adds the wait:
    k = 3 releases of the 6 ahead, over the 4·rest + 2·50 tokens they still produce at one
    token per seat per step. Without the wait the prefill queues decide (instance 0, β)."""
    g = make_router("gorouting", view="level", seat_wait=seat_wait)
    pool = [FakeLoad(0, seats=4), FakeLoad(1, seats=4)]
    pool[1].estimator.beta = 1.05
    for load in pool:
        _decoding(g, load, 4)
        for k in range(2):
            g.on_dispatch(req(f"w{load.index}{k}", level=5, prompt=50, arrival=1.0), load.index, 1.0, load)
    for r, _ in g._map[1].dec.values():
        r.generated = 45
    new = req("new", level=5, prompt=50, arrival=1.0)
    est = pool[0].estimator
    wait = 3 / 6 * (4 * 50 + 2 * 50) * (est.beta * est.t_c / 4 + est.decode_time(50))
    queue = 2 * est.prefill_time(50) + 4 * est.decode_time(50)
    assert g.exec_time(pool[0], 1.0, new) == pytest.approx(queue + (wait if seat_wait else 0.0))
    assert g.route(new, pool, 1.0) == (1 if seat_wait else 0)
    # an ESI-1 call: level-5 decodes give way, a seat is free on both, no wait anywhere
    urgent = req("u", level=1, prompt=50, arrival=1.0)
    assert g._ahead(pool[0], urgent)[5] == g._ahead(pool[1], urgent)[5] == 0.0


def test_gorouting_less_urgent_decodes_do_not_hold_a_seat_against_an_urgent_request():
    """Level view: a level-2 call waits behind the level-1 and -2 calls queued, and for seats
    only behind decodes at least as urgent (the local policy evicts level-5 ones for it)."""
    g = make_router("gorouting", view="level")
    load = FakeLoad(0, seats=2)
    _decoding(g, load, 2)
    g.on_dispatch(req("u", level=1, prompt=50), 0, 0.2, load)
    g.on_dispatch(req("lo", level=5, prompt=50), 0, 0.2, load)
    assert g._ahead(load, req("new", level=2))[4] == 1           # the level-1 call has a seat
    assert g._ahead(load, req("new5", level=5))[4] == 0          # behind two level-5 decodes: none


def test_gorouting_spreads_urgent_calls_between_instances_it_cannot_tell_apart():
    """Two light instances whose EXECs differ by less than one step's fixed cost (here by
    β 1.00 against 1.02): an ESI-1 call goes to the one with fewer calls at least as urgent
    in flight, not to the lowest index; a clear difference in EXEC still decides."""
    g = make_router("gorouting", view="level")
    pool = [FakeLoad(0), FakeLoad(1)]
    pool[1].estimator.beta = 1.02
    for load in pool:
        _decoding(g, load, 3)
    _decoding(g, pool[0], 2, level=1, tag="u")               # instance 0 already serves two ESI-1 calls
    _decoding(g, pool[1], 2, level=5, tag="v")               # instance 1 as many, at ESI-5
    new = req("new", level=1, prompt=50, arrival=1.0)
    assert 0 < g.exec_time(pool[1], 1.0, new) - g.exec_time(pool[0], 1.0, new) < PROFILE.estimator().t_c
    assert g.route(new, pool, 1.0) == 1
    g.on_dispatch(req("big", level=1, prompt=3000, arrival=1.0), 1, 1.0, pool[1])   # now 1 is clearly busier
    assert g.route(req("next", level=1, prompt=50, arrival=1.0), pool, 1.0) == 0


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


# --- seed 000's own examples -------------------------------------------------------------------
def _toy_load(index: int, role: str):
    """An instance on a toy latency model: 1 ms per prefill token, a negligible step cost."""
    from triage.estimators import ProServeEstimator

    est = ProServeEstimator(a_p=0.0, b_p=0.0, c_p=1e-3, a_d=0.0, b_d=0.0, t_c=1e-6)
    return FakeLoad(index, role=role, estimator=est)


def _toy_req(rid: str, ms: int, slo: float = 0.7) -> Request:
    return Request(id=rid, arrival=0.0, prompt_len=ms, predicted_level=3, ttft_slo=slo, tpot_slo=0.05,
                   weight=1.0, predicted_output_len=10, output_len=10)


@pytest.mark.parametrize("role", ["prefill", "mixed"])
def test_gorouting_reproduces_fig8_over_balancing_example(role):
    """Seed 000 §3.3, Fig. 8: instance A has 400 ms of prefill queued, B 200 ms; R1
    (200 ms) arrives, then R2 (400 ms); TTFT SLO 700 ms. Min-Load sends R1 to B and R2
    then misses on either instance; GoRouting sends R1 to A (600 ms ≤ 700) and keeps B for
    R2 (600 ms). That takes λ ≥ 6/7: with λ = 0.75 A is "heavy" and R1 goes to B."""
    def run(**params):
        g = make_router("gorouting", **params)
        a, b = _toy_load(0, role), _toy_load(1, role)
        g.on_dispatch(_toy_req("qa", 400), 0, 0.0, a)
        g.on_dispatch(_toy_req("qb", 200), 1, 0.0, b)
        r1, r2 = _toy_req("R1", 200), _toy_req("R2", 400)
        p1 = g.route(r1, [a, b], 0.0)
        g.on_dispatch(r1, p1, 0.0, (a, b)[p1])
        p2 = g.route(r2, [a, b], 0.0)
        return p1, p2, g

    p1, p2, g = run()                                        # the defaults
    assert (p1, p2) == (0, 1)
    assert g.exec_time(_toy_load(0, role), 0.0) == pytest.approx(0.6)       # A: 400 + 200 ms
    assert g.lam >= 6 / 7
    assert run(lam=0.75)[0] == 1                             # the old default over-balances
    assert run(lam=6 / 7 + 1e-9)[:2] == (0, 1)               # the bound is tight


def test_gorouting_keeps_the_eta_floor_when_a_queued_request_is_overdue():
    """Alg. 1 line 7 (t_budget ← max(t_min, η)): a queued request already past its
    deadline must not make φa infinite. Without the floor every instance holding an
    overdue request scored Δ = 0 and routing fell back to a random pick (line 19) under
    exactly the overload where the choice matters."""
    g = make_router("gorouting", mu=0.0)
    est = PROFILE.estimator()
    pool = [FakeLoad(i) for i in range(4)]
    for i, load in enumerate(pool):                          # every instance: one ESI-5 request, overdue at t=100
        g.on_dispatch(req(f"old{i}", level=5, prompt=200, arrival=0.0), i, 0.0, load)
    seconds = [3.0, 0.5, 6.0, 4.0]                           # plus this much ESI-3 prefill queued
    for i, s in enumerate(seconds):
        n_tok = int(s / est.prefill_time(1000) * 1000)
        g.on_dispatch(req(f"w{i}", level=3, prompt=n_tok, arrival=99.0), i, 100.0, pool[i])
    new = req("new", level=2, prompt=500, arrival=100.0)     # ESI-2: TTFT SLO 4 s
    _, dl1, _, tpot, _, _ = g._ahead(pool[1], new)
    assert (dl1 < 100.0).any()
    assert np.isfinite(g._phi(pool[1], dl1, tpot, 0.5, 100.0))
    picks = {g.route(new, pool, 100.0) for _ in range(8)}
    assert picks == {1}                                      # the one instance where it meets its SLO, every time


def test_pab_sums_decode_and_prefill_as_appendix_a_and_keeps_negative_slack():
    """App. A.7 sums over DUP = Decode ∪ Prefill: a queued prefill will decode inside the
    new request's TTFT window too, so it reserves decode steps as well as its prompt; the
    minimum slack enters as printed (an overdue request, slack < 0, reserves more steps)."""
    est = PROFILE.estimator()
    a, b, c = linear_step_model(est)
    ttft = 2.0
    only_prompt = FakeLoad(0, prefill_tokens=500)
    with_dup = FakeLoad(1, prefill_tokens=500, pre=[(1.0, 500, 0.2)])
    got = prefill_admission_budget(with_dup, ttft, 0.0)
    steps = (ttft - 1.0) / 0.2 + 1
    want = (ttft - steps * a - (ttft - 1.0) / 0.2 * (b + 500 * c)) / (b + c) - 500
    assert got == pytest.approx(want)
    assert got < prefill_admission_budget(only_prompt, ttft, 0.0)
    late = FakeLoad(2, dec=[(-0.5, 1000, 0.2)])
    steps_late = (ttft + 0.5) / 0.2 + 1                      # not clamped to (ttft - 0)/tpot + 1
    want_late = (ttft - steps_late * a - (ttft + 0.5) / 0.2 * (b + 1000 * c)) / (b + c)
    assert prefill_admission_budget(late, ttft, 0.0) == pytest.approx(want_late)
    # a request ahead of its window (slack > TTFT) reserves no decode steps (N_i = 0 by A.3)
    # (the step count keeps a floor of one: the step that runs the new prefill)
    ahead = FakeLoad(3, dec=[(5.0, 1000, 0.2)])
    assert prefill_admission_budget(ahead, ttft, 0.0) == pytest.approx((ttft - a) / (b + c))


def test_fb_pab_rejects_when_no_instance_has_budget_for_the_prompt():
    from triage.routing import REJECT

    full = FakeLoad(0, prefill_tokens=10**6)
    r = req(prompt=800, level=3)
    assert make_router("pab").route(r, [full], 0.0) == 0                  # plain PAB routes anyway
    rej = make_router("pab", reject=True)
    assert rej.route(r, [full], 0.0) == REJECT and rej.rejected == 1
    assert rej.route(r, [full, FakeLoad(1)], 0.0) == 1                    # room elsewhere: admitted there


def _reference_gain(g, p, reqs, exec_s, now):
    """ESTIMATEGAIN written out request by request, as the seed prints it (the router keeps
    its queues as numpy columns instead)."""
    est = p.estimator
    t_c = est.beta * est.t_c
    remain = min((r.deadline(1) - now for r in reqs), default=np.inf)
    t_budget = max(min(remain, min((r.tpot_slo for r in reqs), default=np.inf)), g.eta)
    phi = (np.inf if exec_s > 0 else 0.0) if not t_budget > t_c else t_budget / (t_budget - t_c) * exec_s
    return sum(r.weight for r in reqs if now + phi < r.deadline(1))


@pytest.mark.parametrize("view", ["arrival", "level"])
def test_gorouting_gains_equal_the_request_by_request_sum_as_queues_grow_and_drain(view):
    """Over a stream of dispatches, first tokens and finishes on three instances, every
    instance's Δ (line 4-5) equals the per-request sum, and each pick is Alg. 2's."""
    rng = np.random.default_rng(3)
    g = make_router("gorouting", view=view)
    pool = [FakeLoad(i) for i in range(3)]
    where: dict[str, tuple[Request, int]] = {}
    for k in range(300):
        now = 0.05 * k
        new = req(f"r{k}", level=int(rng.integers(1, 6)), prompt=int(rng.integers(20, 2000)), arrival=now)
        for p in pool:
            q = [r for r, _ in g._q(p).reqs.values() if view == "arrival" or r.level <= new.level]
            e = g.exec_time(p, now, new)
            e_req = e + p.estimator.prefill_time(new.need, new.computed)
            _, dl1, w, tpot, _, _ = g._ahead(p, new)
            assert g.estimate_gain(p, dl1, w, tpot, e, now) == pytest.approx(_reference_gain(g, p, q, e, now))
            post = g.estimate_gain(p, np.append(dl1, new.deadline(1)), np.append(w, new.weight),
                                   np.append(tpot, new.tpot_slo), e_req, now)
            assert post == pytest.approx(_reference_gain(g, p, [*q, new], e_req, now))
        i = g.route(new, pool, now)
        g.on_dispatch(new, i, now, pool[i])
        where[new.id] = (new, i)
        for rid in [rid for rid in where if rng.random() < 0.05]:   # some first tokens, some finishes
            r, j = where.pop(rid)
            g.on_first_token(r, j, now)
            if rng.random() < 0.5:
                g.on_finish(r, j, now)
