"""Multi-instance simulation: a router in front of N co-located instances, or of P prefill
+ D decode instances with a KV transfer between them (PD disaggregation).

    while work remains:                      # event-driven across instances
        next event = the earliest of: the next arrival, the next KV transfer landing,
                     the clock of the busy instance that is furthest behind
        arrival  → router picks the instance(s); the request joins that engine's queue
        transfer → the request joins its decode instance's queue with its KV (need = 1)
        step     → that instance runs one plan of its own policy (`Instance.step`);
                   its first tokens and finishes become report events at the step's end
        report   → the router hears of a first token or a finish (at its own time: a
                   step's results are not known to the router before the step is over)

Each instance is `triage.sim.simulator.Instance` (its own policy object, estimator with
online β, KV pool, noise stream); requests are built with `make_request`. In PD mode a
request leaves its prefill instance when its first token is out, its KV travels for
`kv_fixed_s + kv_per_token_s · tokens`, and it is admitted on the decode instance chosen at
dispatch (Alg. 2 returns the pair). Prefill instances running SlideBatching use φp (seed
000 §4.2, PD-disaggregated load judgment); decode instances run plain continuous
batching (`decode_policy`, fcfs by default: a decode batch has nothing to order but
memory), the policy under test schedules the prefill instances. With one co-located
instance the run is step-for-step `simulate()`'s. Deterministic for a seed.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Callable, Iterable

import numpy as np

from triage.classes import PriorityClasses
from triage.policies import make_policy
from triage.policies.base import Policy
from triage.policies.slidebatching import SlideBatching
from triage.profiles import Profile
from triage.request import KVResidency, Request, Stage
from triage.routing import REJECT, Router, StateLoad, make_router
from triage.routing.rebalance import seat_moves
from triage.sim.simulator import EstimatorError, Instance, SimResult, StalledError, make_request
from triage.sim.traces import TraceRequest

KV_FIXED_S = 0.002          # per transfer
KV_PER_TOKEN_S = 2e-5       # ~50k tokens/s of KV over the interconnect
DECODE_POLICY = "fcfs"      # PD decode instances: vLLM's continuous batching (pure decode)


def parse_pd(pd: str | tuple[int, int] | None) -> tuple[int, int] | None:
    if pd is None or isinstance(pd, tuple):
        return pd
    p, sep, d = str(pd).partition(":")
    try:
        out = (int(p), int(d))
    except ValueError:
        out = None
    if not sep or out is None or out[0] < 1 or out[1] < 1:
        raise ValueError(f"--pd expects P:D with P, D >= 1, got {pd!r}")
    return out


def _factory(policy_factory) -> Callable[[], Policy]:
    if isinstance(policy_factory, str):
        return lambda: make_policy(policy_factory)
    if isinstance(policy_factory, Policy):
        raise TypeError("simulate_cluster needs a policy factory (one policy object per instance), not a policy")
    return policy_factory


class _Node:
    def __init__(self, inst: Instance, role: str) -> None:
        self.inst = inst
        self.role = role
        self.load = StateLoad(inst.index, inst.state, role)
        self.idle = True           # nothing it can do until something is added

    @property
    def busy(self) -> bool:
        return not self.idle and bool(self.inst.state.requests)


def simulate_cluster(trace: Iterable[TraceRequest], policy_factory, profile: Profile, classes: PriorityClasses, *,
                     instances: int = 1, router: str | Router = "round_robin", pd: str | tuple[int, int] | None = None,
                     seed: int = 0, progress: Callable[[int], None] | None = None, estimator_kind: str | None = None,
                     kv_fixed_s: float = KV_FIXED_S, kv_per_token_s: float = KV_PER_TOKEN_S,
                     router_params: dict | None = None, decode_policy=DECODE_POLICY,
                     truth: str = "auto", bias: float = 1.0, steal: bool = False) -> SimResult:
    """Replay `trace` through a router and several instances; returns every request.

    `policy_factory`: a policy name or a callable returning a fresh policy (one per
    instance). In PD mode the decode instances run `decode_policy` (a name or factory;
    None: the same policy as the prefill instances). `steal`: co-located instances with a
    free seat take calls waiting for one elsewhere (triage.routing.rebalance), as the live
    remote backend does; off by default (the seeds' clusters place a call once)."""
    make = _factory(policy_factory)
    make_decode = make if decode_policy is None else _factory(decode_policy)
    rt = make_router(router, **(router_params or {})) if isinstance(router, str) else router
    pd_ = parse_pd(pd)
    roles = ["prefill"] * pd_[0] + ["decode"] * pd_[1] if pd_ else ["mixed"] * int(instances)
    if not roles:
        raise ValueError("instances must be >= 1")
    ss = np.random.SeedSequence(seed)
    nodes: list[_Node] = []
    rngs = [np.random.default_rng(seed)] if len(roles) == 1 else [np.random.default_rng(c) for c in ss.spawn(len(roles))]
    for i, (role, rng) in enumerate(zip(roles, rngs)):
        pol = make_decode() if role == "decode" else make()
        if role == "prefill" and isinstance(pol, SlideBatching):
            pol.phi = "p"
        kind = estimator_kind or getattr(pol, "estimator_kind", "proserve")
        nodes.append(_Node(Instance(pol, profile, classes, rng, index=i, estimator_kind=kind, truth=truth, bias=bias),
                           role))
    rt.bind_policy(nodes[0].inst.policy)           # the instances' local scheduler (prefill side in PD)
    mixed = [n for n in nodes if n.role == "mixed"]
    prefill = [n for n in nodes if n.role == "prefill"]
    decode = [n for n in nodes if n.role == "decode"]

    pending = deque(sorted(trace, key=lambda t: t.arrival))
    total = len(pending)
    transfers: list[tuple[float, int, Request, int]] = []   # (ready, seq, request, decode node)
    reports: list[tuple[float, int, int, Request, int]] = []  # (time, n, kind 0 first token / 1 finish, request, instance)
    n_report = 0
    decode_of: dict[str, int] = {}
    done: list[Request] = []
    rejected: list[Request] = []                            # turned away by the router: no token
    origin: dict[str, TraceRequest] = {}
    i_req = 0

    def put(node: _Node, r: Request, t: float) -> None:
        node.inst.now = max(node.inst.now, t)   # an emptied or idle engine waits for it
        node.idle = False
        r.instance = node.inst.index
        node.inst.state.add(r)

    moved: set[str] = set()

    def steal_for(node: _Node) -> bool:
        """Move calls waiting for a seat elsewhere onto `node` (the instance stepped, whose
        clock is the earliest: every call waiting elsewhere arrived before it)."""
        if not steal or node.role != "mixed":
            return False
        t = node.inst.now
        moves = seat_moves([n.load for n in mixed], t, moved, to=node.inst.index)
        for rid, src, _dst in moves:
            r = nodes[src].inst.state.remove(rid)
            moved.add(rid)
            rt.on_finish(r, src, t)                      # gone from src's queue, as live
            rt.on_dispatch(r, node.inst.index, t, node.load)
            put(node, r, t)
        return bool(moves)

    while pending or transfers or reports or any(n.inst.state.requests for n in nodes):
        busy = [n for n in nodes if n.busy]
        step_node = min(busy, key=lambda n: (n.inst.now, n.inst.index)) if busy else None
        t_step = step_node.inst.now if step_node else math.inf
        t_arr = pending[0].arrival if pending else math.inf
        t_xfer = transfers[0][0] if transfers else math.inf
        if reports and reports[0][0] <= min(t_arr, t_step, t_xfer):   # report → router (before same-time arrivals)
            t_rep, _, kind, r, idx = heapq.heappop(reports)
            (rt.on_finish if kind else rt.on_first_token)(r, idx, t_rep)
            continue
        if t_arr == t_step == t_xfer == math.inf:
            stuck = [n.inst.index for n in nodes if n.inst.state.requests]
            raise StalledError(f"cluster: instances {stuck} hold requests but none can make progress")
        if t_arr <= t_step and t_arr <= t_xfer:                      # arrival → router
            t = pending.popleft()
            r = make_request(i_req, t, classes)
            origin[r.id] = t
            i_req += 1
            if pd_:
                p, d = rt.route_pd(r, [n.load for n in prefill], [n.load for n in decode], t.arrival)
                if p == REJECT:
                    rejected.append(r)
                    continue
                node = prefill[p]
                decode_of[r.id] = decode[d].inst.index
            else:
                k = rt.route(r, [n.load for n in mixed], t.arrival)
                if k == REJECT:                                      # admission control (seed 002 FB-PAB)
                    rejected.append(r)
                    continue
                node = mixed[k]
            rt.on_dispatch(r, node.inst.index, t.arrival, node.load)
            put(node, r, t.arrival)
            continue
        if t_xfer <= t_step:                                         # KV lands on the decode instance
            ready, _, r, d = heapq.heappop(transfers)
            r.kv, r.stage = KVResidency.NONE, Stage.WAITING   # joins the decode queue with need = 1
            put(nodes[d], r, ready)
            continue
        node = step_node                                             # one engine step
        inst, st = node.inst, node.inst.state
        plan = inst.policy.plan(st, inst.now)
        if not plan.tokens:
            if not steal_for(node):
                node.idle = True                                     # wakes on the next request it gets
            continue
        scheduled = [st.requests[rid] for rid in plan.tokens]
        inst.step(plan)
        for r in scheduled:
            first = r.generated >= 1 and r.token_times[0] == inst.now
            if first:                                                # reported when the step ends
                heapq.heappush(reports, (inst.now, n_report, 0, r, inst.index))
                n_report += 1
            if r.finished:
                heapq.heappush(reports, (inst.now, n_report, 1, r, inst.index))
                n_report += 1
                done.append(r)
                if progress and len(done) % 200 == 0:
                    progress(len(done))
                continue
            if first:
                if node.role == "prefill":                           # hand over to decode
                    st.remove(r.id)
                    ready = inst.now + kv_fixed_s + kv_per_token_s * r.computed
                    heapq.heappush(transfers, (ready, r.seq, r, decode_of.pop(r.id)))
        steal_for(node)
    if progress:
        progress(total)
    steps = sum(n.inst.steps for n in nodes)
    err = EstimatorError()
    for n in nodes:
        err.merge(n.inst.error)
    err.beta, err.rho = nodes[0].inst.error.beta, nodes[0].inst.error.rho
    report = err.report(nodes[0].inst.truth.describe())
    report["beta_final_per_instance"] = [round(n.inst.error.beta, 4) for n in nodes]
    res = SimResult(sorted(done, key=lambda r: r.seq), steps, max(n.inst.now for n in nodes), [], origin, report)
    res.rejected = rejected
    return res
