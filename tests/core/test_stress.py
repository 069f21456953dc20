"""Seeded stress: every policy drives a small, memory-starved engine for 5,000+ steps
with invariants checked at every step."""
import numpy as np
import pytest

from triage.classes import load_classes
from triage.policies import POLICIES, make_policy
from triage.profiles import Profile, load_profile
from triage.request import Stage
from triage.sim.simulator import Instance, make_request
from triage.sim.traces import poisson_trace

STEPS = 5000


def tight_profile() -> Profile:
    raw = dict(load_profile("a5000-qwen1.5-7b").raw)
    raw["kv"] = dict(raw["kv"], num_blocks=160)          # ~2.5k tokens: constant preemption
    raw["limits"] = dict(max_num_seqs=12, max_num_batched_tokens=256, max_model_len=4096)
    return Profile("stress", raw)


def check_plan(inst: Instance, plan) -> None:
    st = inst.state
    live = set(st.requests)
    preempted = {p.request_id for p in plan.preemptions}
    assert preempted <= {r.id for r in st.running}, "only running requests can be preempted"
    assert not (preempted & set(plan.tokens)), "a victim is not scheduled in the same step"
    assert set(plan.tokens) <= live, "a finished or unknown request was scheduled"
    assert all(k > 0 for k in plan.tokens.values())
    assert plan.total_tokens <= st.limits.max_num_batched_tokens
    running_after = (len(st.running) - len(preempted)
                     + sum(1 for rid in plan.tokens if st.requests[rid].stage in (Stage.WAITING, Stage.PREEMPTED)))
    assert running_after <= st.limits.max_num_seqs
    for rid, k in plan.tokens.items():
        r = st.requests[rid]
        assert k <= r.need, "never more tokens than the request needs"


def check_state(inst: Instance, before: dict) -> None:
    st = inst.state
    waiting, running = {r.id for r in st.waiting}, {r.id for r in st.running}
    assert not (waiting & running), "a request is both waiting and running"
    assert waiting | running == set(st.requests), "a request was lost"
    assert len(st.waiting) == len(waiting) and len(st.running) == len(running), "a request is duplicated"
    assert st.kv.used <= st.kv.num_blocks and st.kv.used == sum(st.kv.holders().values())
    assert set(st.kv.holders()) <= running, "only running requests hold device blocks"
    assert st.columns.n == len(waiting) and st.run_columns.n == len(running)
    assert len(st.queue) == len(waiting)
    for r in st.requests.values():
        assert 0 <= r.computed <= r.known
        if r.id in running:
            assert st.kv.blocks_of(r.id) * st.kv.block_size >= r.computed
        g0, t0 = before.get(r.id, (0, 0))
        assert r.generated >= g0 and len(r.token_times) >= t0, "token counts never go back"
        assert all(a <= b for a, b in zip(r.token_times, r.token_times[1:]))
        assert r.next_deadline == pytest.approx(r.arrival + r.ttft_slo + r.generated * r.tpot_slo)
    for r in inst.done:
        assert r.stage is Stage.FINISHED and r.id not in st.requests
        assert len(r.token_times) == r.output_len


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_keeps_invariants_for_5000_steps(name):
    prof = tight_profile()
    classes = load_classes().scaled(prof.slo_scale)
    inst = Instance(make_policy(name), prof, classes, np.random.default_rng(7))
    trace = poisson_trace(3000, rate=6.0, seed=11, prompt=(16, 600), output=(1, 120))
    pending = list(reversed(trace))
    i = steps = preemptions = 0
    while steps < STEPS and (pending or inst.state.requests):
        while pending and pending[-1].arrival <= inst.now:
            inst.state.add(make_request(i, pending.pop(), classes))
            i += 1
        if i % 97 == 0 and inst.state.waiting:  # operators relabel now and then
            inst.state.relabel(inst.state.waiting[-1].id, 1 + i % 5)
        plan = inst.policy.plan(inst.state, inst.now)
        if not plan.tokens:
            assert pending, f"{name} stalled with {len(inst.state.requests)} requests"
            inst.now = pending[-1].arrival
            continue
        check_plan(inst, plan)
        before = {r.id: (r.generated, len(r.token_times)) for r in inst.state.requests.values()}
        inst.step(plan)
        preemptions += len(plan.preemptions)
        check_state(inst, before)
        steps += 1
    assert steps >= STEPS, f"{name}: only {steps} steps"
    assert inst.done, "some requests must finish"
