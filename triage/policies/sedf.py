"""`sedf`: FlowPrefill's S-EDF with SLO-aware batching and event-driven rounds
(seed 003 §5.2: Eq. 3, Algorithm 1, Algorithm 2).

S-EDF priority (Eq. 3), larger runs first:

    priority = sgn(slack) / deadline,   slack = deadline − now − T̂TFT

with deadline the request's next-token deadline (arrival + TTFT_slo for a first token)
and T̂TFT the estimator's time to finish its prefill alone (β·(t_c + T~p)). Requests that
can still make it go earliest-deadline first; those that cannot sink below all of them.
`rule=` switches the priority for the §6.3 ablation: "sedf" (Eq. 3), "edf" (1/deadline)
and "dedf" (D-EDF: sgn(deadline − now)/deadline).

Event-driven scheduling (Alg. 2), re-planned only on an event (an arrival, a completion,
or the current execution's prefills all done):

    Q_all ← Q_w ∪ Q_p ∪ E, sorted by priority;  H ← r_1
    if H ∈ Q_w:  C ← Q_all \\ Q_p \\ {H}   (waiting requests and the executing set E)
                 H, B ← SLOAWAREBATCHING(H, C, G)
    if H ∉ E:    pause E (→ Q_p; its KV stays on the device)
                 E ← (H, B) if H was waiting, else resume H's paused execution

SLO-aware batching (Alg. 1): B ← {H}; for r in C (priority order): n ← N + r.tokens;
add r if T_remain = H.deadline − now > L = predict_latency(n) and n < G.

Preemption granularity (a deviation, measured in docs/reproduction.md): FlowPrefill
preempts a running prefill at operator boundaries (< 4.5 ms, §6.4). This engine, like
vLLM, can only change what runs between steps, so a pause takes effect at the next step
boundary and a newly arrived urgent request waits for the step in flight (up to one whole
G-token prefill step). `max_chunk=K` is the chunk-boundary preemption vLLM does allow:
every prefill of E gets at most K tokens a step, so an urgent arrival waits at most one
K-token chunk (None: the step's token budget).

FlowPrefill runs on prefill instances; co-located here, the running decodes go first
each step (a decode instance would run them regardless), then the execution E's
prefills take the rest of the step's token budget, H first. Between events the plan is
the same execution, continued chunk by chunk. A decode short of KV blocks preempts the
newest running request (recompute); E's admission may evict paused executions.
"""
from __future__ import annotations

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import WAITING_STAGES, BatchBuilder
from triage.request import Request


@register("sedf")
class SEDF(Policy):
    RULES = ("sedf", "edf", "dedf")

    def __init__(self, token_budget: int = 4096, rule: str = "sedf", max_chunk: int | None = None) -> None:
        if rule not in self.RULES:
            raise ValueError(f"rule must be one of {', '.join(self.RULES)}, got {rule!r}")
        if max_chunk is not None and max_chunk < 1:
            raise ValueError("max_chunk must be >= 1")
        self.token_budget = token_budget       # G of Alg. 1 / Alg. 2
        self.rule = rule                       # Eq. 3 (sedf) or the §6.3 baselines
        self.max_chunk = max_chunk             # chunk-boundary preemption (tokens per prefill per step)
        self._exec: list[str] = []             # E: the current execution, H first
        self._paused: dict[str, list[str]] = {}  # Q_p: paused executions by their H
        self._seen = (-1, -1)                  # (newest seq, live requests) at the last round

    # --- Eq. 3 -------------------------------------------------------------------------------
    @staticmethod
    def priority(deadline: np.ndarray, ttft_hat: np.ndarray, now: float, rule: str = "sedf") -> np.ndarray:
        d = np.maximum(deadline, 1e-9)
        if rule == "edf":
            return 1.0 / d
        if rule == "dedf":
            return np.sign(deadline - now) / d
        slack = deadline - now - ttft_hat
        return np.sign(slack) / d

    # --- Alg. 1 --------------------------------------------------------------------------------
    def slo_aware_batching(self, view: SchedulerView, h: Request, cands: list[Request], now: float) -> list[Request]:
        est = view.estimator
        t_remain = h.next_deadline - now
        # predict_latency(n) < T_remain and n < G, as one token cap (latency grows with n)
        cap = est.max_chunk(0, t_remain - est.beta * est.t_c, self.token_budget - 1)
        batch, n = [h], h.need
        for r in cands:
            if cap - n < 1:
                break
            if n + r.need <= cap:
                batch.append(r)
                n += r.need
        return batch

    # --- Alg. 2 --------------------------------------------------------------------------------
    def _event(self, view: SchedulerView) -> bool:
        cols = view.columns.view()
        newest = int(cols["seq"].max()) if view.columns.n else -1
        newest = max(newest, max((r.seq for r in view.running), default=-1))
        seen, self._seen = self._seen, (newest, len(view.requests))
        arrival = newest > seen[0]
        completion = len(view.requests) < seen[1] or (not arrival and len(view.requests) != seen[1])
        return arrival or completion or not self._alive(view, self._exec)

    @staticmethod
    def _alive(view: SchedulerView, ids: list[str]) -> list[str]:
        out = []
        for rid in ids:
            r = view.requests.get(rid)
            if r is not None and (r.need > 1 or r.stage in WAITING_STAGES):
                out.append(rid)
        return out

    def _round(self, view: SchedulerView, now: float) -> None:
        est = view.estimator
        cols = view.columns.view()
        n = view.columns.n
        waiting = view.columns.reqs[:n]
        self._exec = self._alive(view, self._exec)
        self._paused = {h: ids for h, ids in ((h, self._alive(view, ids)) for h, ids in self._paused.items()) if ids}
        in_exec = set(self._exec)
        paused = [r for r in view.running if r.need > 1 and r.id not in in_exec]
        execs = [view.requests[rid] for rid in self._exec if view.requests[rid].stage not in WAITING_STAGES]
        others = [*execs, *paused]
        # Q_all = Q_w ∪ Q_p ∪ E with Eq. 3 priorities (waiting from the state's columns)
        dl = np.concatenate([cols["deadline"], np.fromiter((r.next_deadline for r in others), float, len(others))])
        ttft = np.concatenate([est.beta * (cols["exec_u"] + est.t_c),
                               np.fromiter((est.request_time(r.need, r.computed) + est.beta * est.t_c for r in others),
                                           float, len(others))])
        seq = np.concatenate([cols["seq"], np.fromiter((r.seq for r in others), float, len(others))])
        if not len(dl):
            self._exec = []
            return
        order = np.lexsort((seq, -self.priority(dl, ttft, now, self.rule)))
        top = int(order[0])
        h = waiting[top] if top < n else others[top - n]
        if h.id in in_exec:
            return                                        # H = E: keep executing
        old_exec = self._exec
        if top < n:                                       # H ∈ Q_w: submit_new_execution(H, B)
            # line 14: C ← Q_all \ Q_p \ {H} — the waiting requests and the executing set E
            cands = [waiting[i] if i < n else others[i - n] for i in order.tolist()[1:]
                     if i < n or others[i - n].id in in_exec]
            self._exec = [r.id for r in self.slo_aware_batching(view, h, cands, now)]
            rest = [rid for rid in old_exec if rid not in set(self._exec)]
            if rest:                                      # preempt_execution(E): what of E is not in B
                self._paused[rest[0]] = rest
        else:                                             # resume_execution(H)
            if old_exec:                                  # preempt_execution(E): Q_p ← Q_p ∪ {E}
                self._paused[old_exec[0]] = old_exec
            group = next((ids for ids in self._paused.values() if h.id in ids), [h.id])
            self._paused = {k: v for k, v in self._paused.items() if h.id not in v}
            self._exec = [h.id, *(rid for rid in group if rid != h.id)]

    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        if not view.requests:
            return BatchPlan()
        if self._event(view):
            self._round(view, now)
        plan = self._step(view)
        if not plan.tokens and view.requests:    # the execution cannot run (memory): re-rank now
            self._round(view, now)
            plan = self._step(view)
        return plan

    def _step(self, view: SchedulerView) -> BatchPlan:
        b = BatchBuilder(view)
        victims = list(view.running)                      # newest admitted preempted first
        for r in view.running:
            if r.need != 1 or b.tokens_left <= 0:
                continue
            if not b.is_preempted(r):
                b.add_or_evict(r, victims)
        in_exec = set(self._exec)
        paused = [r for r in view.running if r.need > 1 and r.id not in in_exec]
        for rid in self._exec:
            if b.full:
                break
            r = view.requests.get(rid)
            if r is None or b.is_preempted(r):
                continue
            if r.stage in WAITING_STAGES and (b.blocks_short(r) > 0 or b.seats_left <= 0):
                b.make_room(r, paused)                    # evict paused executions, newest first
            b.add(r, min(r.need, self.max_chunk) if self.max_chunk else None)
        return b.build()
