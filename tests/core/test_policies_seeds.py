"""Seed policies (fairbatching, sedf, slidingserve, vtc, edf, sjf): behaviour tables on
constructed states, ablation directions, and a seeded end-to-end run per policy."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from triage.classes import load_classes
from triage.kv import CacheCosts, KVCache
from triage.policies import make_policy
from triage.profiles import Limits, load_profile
from triage.request import KVResidency, Request, Stage
from triage.sim.simulator import simulate
from triage.sim.traces import poisson_trace
from triage.state import EngineState

SEED_POLICIES = ["edf", "sjf", "vtc", "fairbatching", "sedf", "slidingserve"]
PROFILE = load_profile("a5000-qwen1.5-7b")
CLASSES = load_classes().scaled(PROFILE.slo_scale)
NOW = 100.0


def make_state(num_blocks: int = 1000, limits: Limits | None = None, estimator: str = "proserve") -> EngineState:
    est = PROFILE.estimator(estimator)
    truth = PROFILE.estimator()
    return EngineState(KVCache(num_blocks, PROFILE.block_size), est, CLASSES, limits or PROFILE.limits,
                       CacheCosts.from_estimator(truth, PROFILE.kv_load_per_token))


_seq = iter(range(10**9))


def make_request(*, level: int = 3, prompt: int = 200, arrival: float = NOW - 0.1, output: int = 100,
                 predicted: int | None = None, rid: str | None = None) -> Request:
    c = CLASSES.get(level)
    s = next(_seq)
    return Request(id=rid or f"q{s}", arrival=arrival, prompt_len=prompt, predicted_level=level,
                   ttft_slo=c.ttft, tpot_slo=c.tpot, weight=c.weight,
                   predicted_output_len=predicted if predicted is not None else output, output_len=output, seq=s)


def add_waiting(st: EngineState, **kw) -> Request:
    r = make_request(**kw)
    st.add(r)
    return r


def add_decoding(st: EngineState, *, generated: int = 10, last_token: float | None = None, **kw) -> Request:
    """A running request mid-decode: prompt computed, `generated` tokens out, KV allocated."""
    r = make_request(**kw)
    st.add(r)
    st.admit(r, r.arrival)
    r.generated = generated
    r.computed = r.known - 1
    last = NOW - 0.01 if last_token is None else last_token
    r.token_times = list(np.linspace(r.arrival + 0.2, last, generated))
    r.stage, r.kv = Stage.DECODING, KVResidency.DEVICE
    st.allocate(r, 1)
    st.touch(r)
    return r


def add_prefilling(st: EngineState, *, computed: int, **kw) -> Request:
    r = make_request(**kw)
    st.add(r)
    st.admit(r, r.arrival)
    r.computed = computed
    st.allocate(r, 0)
    st.touch(r)
    return r


def check_plan(st: EngineState, plan) -> None:
    lim = st.limits
    assert plan.total_tokens <= lim.max_num_batched_tokens
    pre = {p.request_id for p in plan.preemptions}
    for rid, k in plan.tokens.items():
        r = st.requests[rid]
        assert 0 < k <= r.need
        assert rid not in pre
    running_after = len(st.running) - len(pre) + sum(1 for rid in plan.tokens if st.requests[rid] not in st.running)
    assert running_after <= lim.max_num_seqs


# --- every seed policy: invariants, determinism, and a full run --------------------------
@pytest.mark.parametrize("name", SEED_POLICIES)
def test_plan_invariants_on_mixed_state(name):
    st = make_state()
    for i in range(20):
        add_decoding(st, level=1 + i % 5, prompt=100 + 10 * i, arrival=NOW - 3 - i * 0.1)
    add_prefilling(st, computed=256, prompt=1000, level=2, arrival=NOW - 0.5)
    for i in range(30):
        add_waiting(st, level=1 + i % 5, prompt=50 + 37 * i, arrival=NOW - 0.05 * i)
    plan = make_policy(name).plan(st, NOW)
    check_plan(st, plan)
    assert plan.tokens
    # deterministic: a fresh policy object gives the same plan on the same view
    assert make_policy(name).plan(st, NOW).tokens == plan.tokens


@pytest.mark.parametrize("name", SEED_POLICIES)
def test_end_to_end_run_finishes_every_request(name):
    trace = poisson_trace(120, rate=3.0, seed=5, prompt=(32, 1500), output=(4, 200))
    prof = dataclasses.replace(PROFILE, raw={**PROFILE.raw, "kv": {**PROFILE.raw["kv"], "num_blocks": 300}})
    pol = make_policy(name)
    res = simulate(trace, pol, prof, CLASSES, seed=1, estimator_kind=getattr(pol, "estimator_kind", "proserve"))
    assert len(res.requests) == len(trace)
    for r in res.requests:
        assert len(r.token_times) == r.output_len
        assert all(b >= a for a, b in zip(r.token_times, r.token_times[1:]))


# --- edf -----------------------------------------------------------------------------------
def test_edf_admits_earliest_deadline_first_and_stops_at_first_misfit():
    st = make_state(num_blocks=40)  # 640 tokens of KV
    late = add_waiting(st, level=5, prompt=100, arrival=NOW - 1)      # deadline NOW - 1 + 32
    soon = add_waiting(st, level=1, prompt=100, arrival=NOW)          # deadline NOW + 2
    big = add_waiting(st, level=2, prompt=1000, arrival=NOW)          # deadline NOW + 4: no memory
    plan = make_policy("edf").plan(st, NOW)
    assert list(plan.tokens) == [soon.id]
    assert big.id not in plan.tokens and late.id not in plan.tokens


def test_edf_gives_running_decode_with_earlier_deadline_the_budget_first():
    st = make_state(limits=Limits(max_num_seqs=8, max_num_batched_tokens=1))
    relaxed = add_decoding(st, level=5, arrival=NOW - 1, generated=2)
    tight = add_decoding(st, level=1, arrival=NOW - 2.5, generated=2)
    plan = make_policy("edf").plan(st, NOW)
    assert list(plan.tokens) == [tight.id] and relaxed.id not in plan.tokens


# --- sjf -----------------------------------------------------------------------------------
def test_sjf_admits_shortest_predicted_output_first():
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=400))
    long_ = add_waiting(st, prompt=300, predicted=900)
    short = add_waiting(st, prompt=300, predicted=20)
    mid = add_waiting(st, prompt=300, predicted=100)
    plan = make_policy("sjf").plan(st, NOW)
    assert list(plan.tokens) == [short.id, mid.id]
    assert plan.tokens[short.id] == 300 and plan.tokens[mid.id] == 100 and long_.id not in plan.tokens


# --- vtc -----------------------------------------------------------------------------------
def test_vtc_serves_the_client_with_the_smallest_weighted_counter():
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=300))
    pol = make_policy("vtc")
    a5 = add_waiting(st, level=5, prompt=100, arrival=NOW - 5)
    a1 = add_waiting(st, level=1, prompt=100, arrival=NOW)
    pol.counter = {5: 0.0, 1: 50.0}
    plan = pol.plan(st, NOW)
    assert list(plan.tokens)[0] == a5.id
    # the level-5 client paid 100 / w=1; the level-1 client pays 100 / 16
    assert pol.counter[5] == pytest.approx(100.0)
    assert pol.counter[1] == pytest.approx(50.0 + 100 / 16)
    assert a1.id in plan.tokens


def test_vtc_weights_give_the_heavier_class_more_tokens():
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=500))
    pol = make_policy("vtc")
    for i in range(10):
        add_waiting(st, level=5, prompt=50, arrival=NOW - 1)
        add_waiting(st, level=2, prompt=50, arrival=NOW)
    plan = pol.plan(st, NOW)
    lv = [st.requests[rid].level for rid in plan.tokens]
    assert lv.count(2) > lv.count(5)


def test_vtc_lifts_a_returning_client_to_the_active_minimum():
    st = make_state()
    pol = make_policy("vtc")
    add_waiting(st, level=3, prompt=10)
    pol.plan(st, NOW)
    pol.counter = {3: 500.0, 4: 0.0}
    add_waiting(st, level=4, prompt=10)  # level 4 comes back with a stale low counter
    pol.plan(st, NOW)
    assert pol.counter[4] >= 500.0


# --- fairbatching (seed 002 Alg. 1) ----------------------------------------------------------
def _fb_state(max_tokens: int) -> tuple[EngineState, Request, Request, Request]:
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=max_tokens))
    c3 = CLASSES.get(3)
    # next deadline = arrival + ttft + 10·tpot: slack 0.1 s (urgent) and 5 s (not urgent)
    urgent = add_decoding(st, level=3, generated=10, arrival=NOW + 0.1 - c3.ttft - 10 * c3.tpot)
    relaxed = add_decoding(st, level=3, generated=10, arrival=NOW + 5 - c3.ttft - 10 * c3.tpot)
    prefill = add_waiting(st, level=3, prompt=3000, arrival=NOW)
    return st, urgent, relaxed, prefill


def test_fairbatching_groups_urgent_decode_then_prefill_then_other_decodes():
    st, urgent, relaxed, prefill = _fb_state(512)
    plan = make_policy("fairbatching").plan(st, NOW)
    assert list(plan.tokens) == [urgent.id, prefill.id]   # the token budget ran out before group_nd
    assert plan.tokens[prefill.id] == 511
    assert plan.budget_s == pytest.approx(CLASSES.get(3).tpot)  # max(min slack 0.1, min TPOT)


def test_fairbatching_chunks_the_prefill_to_the_adaptive_time_budget():
    st, urgent, relaxed, prefill = _fb_state(8192)
    plan = make_policy("fairbatching").plan(st, NOW)
    assert set(plan.tokens) >= {urgent.id, prefill.id}
    assert 0 < plan.tokens[prefill.id] < 3000           # chunked by time, not by tokens
    works = [(k, st.requests[rid].computed) for rid, k in plan.tokens.items()]
    from triage.estimators import Work
    t = st.estimator.batch_time([Work(*w) for w in works])
    assert t == pytest.approx(plan.budget_s, rel=0.05)   # the linear model fills the budget


def test_fairbatching_linear_model_fits_the_estimator():
    from triage.policies.fairbatching import linear_step_model
    est = PROFILE.estimator()
    a, b, c = linear_step_model(est)
    assert a == est.t_c and b > 0 and c >= 0
    for lq, ctx in ((512, 0), (256, 2048), (1, 1000)):
        assert b * lq + c * ctx == pytest.approx(est._request_time(lq, ctx), rel=0.35)


# --- sedf (seed 003 Eq. 3, Alg. 1, Alg. 2) ---------------------------------------------------
def test_sedf_priority_is_sign_of_slack_over_deadline():
    from triage.policies.sedf import SEDF
    dl = np.array([110.0, 105.0, 101.0, 103.0])
    ttft = np.array([1.0, 1.0, 5.0, 4.0])      # the last two cannot make it any more
    pr = SEDF.priority(dl, ttft, 100.0)
    assert list(np.argsort(-pr, kind="stable")) == [1, 0, 3, 2]  # feasible EDF, then infeasible


def test_sedf_arrival_pauses_the_execution_and_completion_resumes_it():
    st = make_state()
    pol = make_policy("sedf", token_budget=2048)   # H + E's 3,488 tokens exceed G: E cannot join H's batch
    low = add_prefilling(st, computed=512, prompt=4000, level=5, arrival=NOW - 1)
    p1 = pol.plan(st, NOW)
    assert low.id in p1.tokens
    urgent = add_waiting(st, level=1, prompt=300, arrival=NOW)       # arrival event, earlier deadline
    p2 = pol.plan(st, NOW)
    assert urgent.id in p2.tokens and low.id not in p2.tokens
    assert not p2.preemptions                                         # paused, KV kept
    assert st.kv.blocks_of(low.id) > 0
    st.remove(urgent.id)                                              # completion event
    p3 = pol.plan(st, NOW)
    assert low.id in p3.tokens                                        # resume_execution(H)


def test_sedf_keeps_the_execution_between_events():
    st = make_state()
    pol = make_policy("sedf")
    a = add_prefilling(st, computed=512, prompt=4000, level=3, arrival=NOW - 1)
    pol.plan(st, NOW)
    # a request that S-EDF would rank first appears in the state without an event being
    # seen (same newest seq, same count): the execution is not re-ranked
    b = add_waiting(st, level=1, prompt=100, arrival=NOW)
    pol._seen = (b.seq, len(st.requests))
    assert a.id in pol.plan(st, NOW).tokens


def test_sedf_slo_aware_batching_respects_deadline_and_token_budget():
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=8192))
    pol = make_policy("sedf", token_budget=1000)
    h = add_waiting(st, level=1, prompt=400, arrival=NOW)            # T_remain = 2 s
    small = add_waiting(st, level=2, prompt=300, arrival=NOW)
    big = add_waiting(st, level=2, prompt=500, arrival=NOW)           # 400+300+500 >= G
    tiny = add_waiting(st, level=3, prompt=200, arrival=NOW)
    plan = pol.plan(st, NOW)
    assert list(plan.tokens) == [h.id, small.id, tiny.id]
    assert big.id not in plan.tokens
    # a deadline too close for company: H runs alone
    st2 = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=8192))
    h2 = add_waiting(st2, level=1, prompt=1000, arrival=NOW - CLASSES.get(1).ttft + 0.3)
    add_waiting(st2, level=2, prompt=300, arrival=NOW)
    assert list(make_policy("sedf").plan(st2, NOW).tokens) == [h2.id]


# --- slidingserve (seed 001): each component switched off changes the plan ------------------
def _ss(**kw):
    return make_policy("slidingserve", **kw)


def test_slidingserve_mlps_puts_urgent_before_short_and_short_before_long():
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=512), estimator="slidingserve")
    longer = add_waiting(st, level=5, prompt=300, arrival=NOW - 3)                # arrived first, relaxed
    short = add_waiting(st, level=5, prompt=100, arrival=NOW - 2)
    urgent = add_waiting(st, level=1, prompt=2000, arrival=NOW - CLASSES.get(1).ttft + 0.3)  # 0.3 s slack
    on = _ss(constructor=False).plan(st, NOW)
    off = _ss(mlps=False, constructor=False).plan(st, NOW)
    assert list(on.tokens)[0] == urgent.id                                        # Eq. 12: urgency first
    q, _, _ = _ss().sort(st, NOW, [], rho=4000.0)
    assert [r.id for r in q] == [urgent.id, short.id, longer.id]                  # then shortest r_i
    assert list(off.tokens)[:2] == [longer.id, short.id]                          # ablation: arrival order


def test_slidingserve_chunker_balances_two_iterations_instead_of_filling_the_first():
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=8192), estimator="slidingserve")
    c1 = CLASSES.get(1)
    # a decode 1 s ahead of its envelope (T_cur = 1.0) with a 0.2 s TBT (T_next = 0.2)
    add_decoding(st, level=1, generated=10, arrival=NOW + 1.0 - c1.ttft - 10 * c1.tpot)
    big = add_waiting(st, level=5, prompt=8000, arrival=NOW)
    on = _ss().plan(st, NOW)
    off = _ss(chunker=False).plan(st, NOW)
    assert 0 < on.tokens[big.id] < off.tokens[big.id]                             # under-uses T_cur
    assert off.predicted_s <= 1.0 + 1e-6                                          # greedy fills T_cur
    # the split is near B_Σ/2 (Eq. 9 with a convex predictor)
    pol = _ss()
    from triage.policies.slidingserve import Predictor
    dec = [r for r in st.running]
    pred = Predictor(st.estimator, dec)
    b_sum = pred.time_to_budget(1.2, 16000, lambda b: [(b, 0)] if b else [])
    assert abs(on.tokens[big.id] - b_sum / 2) <= 0.05 * b_sum


def test_slidingserve_batch_constructor_trims_the_batch_to_the_anchor_deadline():
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=2048), estimator="slidingserve")
    anchor = add_waiting(st, level=1, prompt=300, arrival=NOW - CLASSES.get(1).ttft + 0.3)  # 0.3 s slack
    r600 = add_waiting(st, level=5, prompt=600, arrival=NOW)
    r500 = add_waiting(st, level=5, prompt=500, arrival=NOW)
    r400 = add_waiting(st, level=5, prompt=400, arrival=NOW)
    on = _ss().plan(st, NOW)
    off = _ss(constructor=False).plan(st, NOW)
    assert set(off.tokens) == {anchor.id, r600.id, r500.id, r400.id}
    assert off.predicted_s > 0.3                                                  # the anchor would miss
    assert on.tokens[anchor.id] == 300                                            # anchor completes its prefill
    assert set(on.tokens) == {anchor.id, r500.id, r400.id}                       # knapsack: 900 ≤ C_a − r_a
    assert on.predicted_s < 0.3


def test_knapsack_matches_brute_force():
    import itertools
    from triage.policies.slidingserve import knapsack
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(1, 8))
        w = rng.integers(1, 40, size=n).tolist()
        v = rng.uniform(0.1, 5, size=n).tolist()
        cap = int(rng.integers(0, 100))
        got = knapsack(w, v, cap)
        assert sum(w[i] for i in got) <= cap
        best = max((sum(v[i] for i in s) for k in range(n + 1) for s in itertools.combinations(range(n), k)
                    if sum(w[i] for i in s) <= cap), default=0.0)
        assert sum(v[i] for i in got) == pytest.approx(best)


def test_slidingserve_chunker_gives_a_prompt_that_fits_in_one_step_whole():
    """A 200-token prompt behind a decode with plenty of slack fits in one step: the
    chunker must return the greedy chunk, not split it 100, 50, 25, ... (the ternary
    search over [1, B_Σ] with B_Σ capped at the queue halves whatever is queued)."""
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=8192), estimator="slidingserve")
    c1 = CLASSES.get(1)
    add_decoding(st, level=1, generated=10, arrival=NOW + 1.0 - c1.ttft - 10 * c1.tpot)   # T_cur = 1 s
    small = add_waiting(st, level=5, prompt=200, arrival=NOW)
    plan = _ss().plan(st, NOW)
    assert plan.tokens[small.id] == 200


def test_slidingserve_constructor_capacity_is_eq14_and_capped_by_the_decode_slack():
    """Eq. 14: C_a = B_a − |D| with B_a = TimeToBudget(s_a) counting the |D| decode tokens;
    capped by the tightest decode slack, so a TTFT anchor with a loose deadline cannot buy
    a batch that stalls the decodes."""
    from triage.policies.slidingserve import Predictor
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=4096), estimator="slidingserve")
    c1 = CLASSES.get(1)
    decs = [add_decoding(st, level=1, generated=10, arrival=NOW + 0.12 - c1.ttft - 10 * c1.tpot) for _ in range(8)]
    t_tbt = min(r.next_deadline - NOW for r in decs)
    anchor = add_waiting(st, level=3, prompt=1500, arrival=NOW - CLASSES.get(3).ttft + 0.9)    # 0.9 s slack
    others = [add_waiting(st, level=5, prompt=700, arrival=NOW) for _ in range(4)]
    plan = _ss().plan(st, NOW)
    pred = Predictor(st.estimator, decs)
    alloc = [(k, st.requests[rid].computed) for rid, k in plan.tokens.items() if rid not in {d.id for d in decs}]
    assert all(d.id in plan.tokens for d in decs)
    assert pred(alloc) <= t_tbt + 1e-9
    assert plan.tokens and others


from hypothesis import given, settings, strategies as hst  # noqa: E402  (dev dependency)


@settings(max_examples=40, deadline=None)
@given(n_dec=hst.integers(1, 12), dec_slack=hst.floats(0.02, 0.6), prompts=hst.lists(hst.integers(16, 3000), min_size=1, max_size=8),
       slacks=hst.lists(hst.floats(-0.5, 3.0), min_size=8, max_size=8), budget=hst.sampled_from([512, 2048, 8192]),
       flags=hst.tuples(hst.booleans(), hst.booleans()))
def test_slidingserve_never_breaks_the_tbt_bound(n_dec, dec_slack, prompts, slacks, budget, flags):
    """Property (seed 001's guarantee): whenever the decodes alone fit in the tightest
    decode slack, the predicted time of the planned step (decodes + prefill chunks) is
    within it, whichever branch (chunker or constructor) made the plan."""
    from triage.policies.slidingserve import Predictor
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=budget), estimator="slidingserve")
    c1 = CLASSES.get(1)
    decs = [add_decoding(st, level=1, generated=10, prompt=300 + 50 * i,
                         arrival=NOW + dec_slack * (1 + 0.1 * i) - c1.ttft - 10 * c1.tpot) for i in range(n_dec)]
    for p, s in zip(prompts, slacks):
        add_waiting(st, level=3, prompt=p, arrival=NOW - CLASSES.get(3).ttft + s)
    t_tbt = min(r.next_deadline - NOW for r in decs)
    pred = Predictor(st.estimator, decs)
    plan = _ss(mlps=flags[0], constructor=flags[1]).plan(st, NOW)
    if pred([]) > t_tbt:
        return                      # the decodes alone overrun: no plan could keep the bound
    dec_ids = {d.id for d in decs}
    assert dec_ids <= set(plan.tokens)
    alloc = [(k, st.requests[rid].computed) for rid, k in plan.tokens.items() if rid not in dec_ids]
    assert pred(alloc) <= t_tbt + 1e-9


# --- fairbatching budget variants (seed 002 §5.4.1) ------------------------------------------
def test_fairbatching_budget_variants_fb_fb_and_fb_tb():
    """FB-FB keeps the instance's fixed token budget (no time budget); FB-TB sizes the step
    in tokens from the time budget, pricing no context, so with long contexts it packs more
    than the time-based FB-vanilla (which counts c·context)."""
    st, urgent, relaxed, prefill = _fb_state(8192)
    fixed = make_policy("fairbatching", budget="fixed").plan(st, NOW)
    assert fixed.total_tokens == 1 + 3000 + 1                     # everything fits the 8192-token budget
    assert fixed.budget_s is None
    vanilla = make_policy("fairbatching").plan(st, NOW)
    tokens = make_policy("fairbatching", budget="tokens").plan(st, NOW)
    assert fixed.total_tokens > vanilla.total_tokens
    assert tokens.total_tokens >= vanilla.total_tokens
    with pytest.raises(ValueError, match="budget"):
        make_policy("fairbatching", budget="sideways")


# --- sedf: Alg. 2 line 14 and the §6.3 rules ---------------------------------------------------
def test_sedf_candidates_include_the_executing_set():
    """Alg. 2 line 14: C ← Q_all \\ Q_p \\ {H}, so a running execution's prefill may join
    the new H's batch (it is neither paused nor H) instead of being paused behind it."""
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=8192))
    pol = make_policy("sedf", token_budget=4096)
    e = add_prefilling(st, computed=256, prompt=800, level=3, arrival=NOW - 1)
    assert e.id in pol.plan(st, NOW).tokens
    h = add_waiting(st, level=1, prompt=300, arrival=NOW)            # arrival: H, deadline earliest
    plan = pol.plan(st, NOW)
    assert list(plan.tokens)[:2] == [h.id, e.id]                    # E joined H's batch
    assert pol._exec == [h.id, e.id] and not pol._paused


def test_sedf_rules_edf_and_dedf():
    from triage.policies.sedf import SEDF
    dl = np.array([110.0, 105.0, 101.0, 99.0])
    ttft = np.array([1.0, 1.0, 5.0, 0.5])
    edf = SEDF.priority(dl, ttft, 100.0, "edf")
    assert list(np.argsort(-edf, kind="stable")) == [3, 2, 1, 0]        # plain earliest deadline
    dedf = SEDF.priority(dl, ttft, 100.0, "dedf")
    assert list(np.argsort(-dedf, kind="stable")) == [2, 1, 0, 3]       # missed deadlines last
    sedf = SEDF.priority(dl, ttft, 100.0, "sedf")
    assert list(np.argsort(-sedf, kind="stable")) == [1, 0, 2, 3]       # infeasible (slack < 0) last
    with pytest.raises(ValueError, match="rule"):
        make_policy("sedf", rule="fifo")


def test_sedf_max_chunk_bounds_each_prefill_step():
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=8192))
    big = add_waiting(st, level=5, prompt=6000, arrival=NOW)
    assert make_policy("sedf", token_budget=8192).plan(st, NOW).tokens[big.id] == 6000
    assert make_policy("sedf", token_budget=8192, max_chunk=512).plan(st, NOW).tokens[big.id] == 512


# --- semantic: the published eviction max-heap --------------------------------------------------
def test_semantic_heap_eviction_pops_the_least_urgent_resident_first():
    from triage.policies.semantic import EvictionHeap

    class R:
        def __init__(self, rid, seq):
            self.id, self.seq = rid, seq

    g = EvictionHeap()
    rs = {k: R(k, i) for i, k in enumerate("abcd")}
    g.live = dict(rs)
    g.push(rs["a"], (1, 5.0))
    g.push(rs["b"], (5, 1.0))
    g.push(rs["c"], (5, 9.0))
    g.push(rs["d"], (3, 2.0))
    g.push(rs["c"], (2, 9.0))                 # c ran: re-inserted with its new key, old entry stale
    assert [g.pop().id for _ in range(4)] == ["b", "d", "c", "a"]
    assert len(g) == 0


@pytest.mark.parametrize("eviction", ["heap", "sorted"])
def test_semantic_eviction_variants_run_to_completion_under_kv_pressure(eviction):
    trace = poisson_trace(150, rate=6.0, seed=3, prompt=(64, 1200), output=(16, 300))
    prof = dataclasses.replace(PROFILE, raw={**PROFILE.raw, "kv": {**PROFILE.raw["kv"], "num_blocks": 200}})
    res = simulate(trace, make_policy("semantic", eviction=eviction), prof, CLASSES, seed=1)
    assert len(res.requests) == len(trace)
    assert sum(r.preemptions for r in res.requests) > 0            # the pressure really evicted
    with pytest.raises(ValueError, match="eviction"):
        make_policy("semantic", eviction="random")


# --- slidebatching: the §5.4 ablation switches -------------------------------------------------
def test_slidebatching_ablation_switches():
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=8192))
    tight = add_waiting(st, level=5, prompt=3000, arrival=NOW - CLASSES.get(5).ttft + 0.4)  # soon due, low weight
    dense = add_waiting(st, level=1, prompt=200, arrival=NOW)                                # high density
    by_deadline = make_policy("slidebatching", partition="deadline").plan(st, NOW)
    by_density = make_policy("slidebatching", partition="density").plan(st, NOW)
    assert list(by_deadline.tokens)[0] == tight.id
    assert list(by_density.tokens)[0] == dense.id
    capped = make_policy("slidebatching").plan(st, NOW)
    free = make_policy("slidebatching", latency_aware=False).plan(st, NOW)
    assert free.total_tokens == 3200 and capped.total_tokens < free.total_tokens
    with pytest.raises(ValueError, match="partition"):
        make_policy("slidebatching", partition="both")


def test_fairbatching_never_returns_an_empty_plan_when_contexts_exceed_the_budget():
    """With a step model that prices context above the whole time budget, Alg. 1 adds
    nothing; the policy must still make progress (a stalled engine serves nobody)."""
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=8192))
    c3 = CLASSES.get(3)
    urgent = add_decoding(st, level=3, generated=10, arrival=NOW + 0.1 - c3.ttft - 10 * c3.tpot)
    add_decoding(st, level=3, generated=10, arrival=NOW + 5 - c3.ttft - 10 * c3.tpot)
    pol = make_policy("fairbatching")
    a, b, _ = pol._abc(st.estimator)
    pol._model = (id(st.estimator), (a / st.estimator.beta, b / st.estimator.beta, 1.0))   # 1 s per context token
    plan = pol.plan(st, NOW)
    assert plan.tokens == {urgent.id: 1}                 # the most urgent decode, one token


def test_slidebatching_decodes_always_keeps_a_normal_decode_in_the_batch():
    """§4.3: "decode requests are always included in the batch". Alg. 1 as printed
    (decodes="queue") ranks a decode ahead of its deadline NORMAL, behind an overdue
    prefill that fills the η budget; decodes="always" runs it first, whatever the budget."""
    st = make_state(limits=Limits(max_num_seqs=256, max_num_batched_tokens=8192))
    dec = add_decoding(st, level=3, arrival=NOW - 0.1)
    late = add_waiting(st, level=1, prompt=3000, arrival=NOW - 10 * CLASSES.get(1).ttft)  # overdue: URGENT
    queue = make_policy("slidebatching").plan(st, NOW)
    always = make_policy("slidebatching", decodes="always").plan(st, NOW)
    assert late.id in queue.tokens and dec.id not in queue.tokens
    assert list(always.tokens)[0] == dec.id and always.tokens[dec.id] == 1
    assert 0 < always.tokens[late.id] <= queue.tokens[late.id]
    check_plan(st, always)
    with pytest.raises(ValueError, match="decodes"):
        make_policy("slidebatching", decodes="never")
