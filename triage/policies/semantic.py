"""`semantic`: seed 004's priority-aware processing (Alg. 2, 4, 5).

Scheduling key (f_e, f_t) = (effective level, predicted remaining time), kept in the
state's dual heap. Each step (Alg. 2, stage-aware batching):

    C  ← ExtractTopb(H, b)                       b = max_num_seqs
    p* ← highest-priority request in C ∪ O       O = running requests
    if p* is prefilling:  M ← Merge(C, O)
    else:                 M ← Merge(C_decode, O)  (low-priority prefills must not
                                                   delay a high-priority decode)
    B  ← M[:b]

Memory (Alg. 4, priority-based eviction): while a request of B lacks KV blocks, the
running request with the lowest priority (the eviction max-heap's root: highest level,
then longest remaining time) is evicted if it ranks below the request; each victim's
KV is offloaded or discarded by the cache-or-recompute rule (Eq. 3, Eq. 5).
"""
from __future__ import annotations

from triage.estimators.base import remaining_time
from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import WAITING_STAGES, BatchBuilder, keep_tokens_for
from triage.request import Request


def priority_key(view: SchedulerView, r: Request) -> tuple:
    return (r.level, remaining_time(view.estimator, r.need, r.computed, r.remaining_output), r.seq)


@register("semantic")
class Semantic(Policy):
    def __init__(self, stage_aware: bool = True, evict: bool = True) -> None:
        self.stage_aware = stage_aware
        self.evict = evict

    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        b = view.limits.max_num_seqs
        key = {r.id: priority_key(view, r) for r in view.running}
        cands = view.queue.smallest(b)
        for r in cands:
            key[r.id] = priority_key(view, r)
        pool = [*cands, *view.running]
        if not pool:
            return BatchPlan()
        p_star = min(pool, key=lambda r: key[r.id])
        if self.stage_aware and p_star.need == 1:
            pool = [r for r in pool if r.need == 1 or r.stage not in WAITING_STAGES]
        batch = sorted(pool, key=lambda r: key[r.id])[:b]

        b = BatchBuilder(view)
        victims = sorted(view.running, key=lambda r: key[r.id])  # eviction max-heap order: root last
        outranks = (lambda r, v: key[v.id] > key[r.id]) if self.evict else (lambda r, v: False)
        keep = lambda v: keep_tokens_for(view, v)  # noqa: E731
        for r in batch:
            if b.full:
                break
            if b.is_preempted(r):
                continue
            running = r.stage not in WAITING_STAGES
            if b.make_room(r, victims, outranks=None if running else outranks, keep=keep):
                b.add(r)
        return b.build()
