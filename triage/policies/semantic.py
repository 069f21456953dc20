"""`semantic`: seed 004's priority-aware processing (Alg. 2, 4, 5).

Scheduling key (f_e, f_t) = (effective level, predicted remaining time), kept in the
state's dual heap for waiting requests. Each step (Alg. 2, stage-aware batching):

    C  ← ExtractTopb(H, b)                       b = max_num_seqs
    p* ← highest-priority request in C ∪ O       O = running requests
    if p* is prefilling:  M ← Merge(C, O)
    else:                 M ← Merge(C_decode, O)  (low-priority prefills must not
                                                   delay a high-priority decode)
    B  ← M[:b]

C and O are merged lazily: the heap is walked in order and stops as soon as b requests
are chosen or the chosen candidates need more than the step's token budget, so a step
costs O(b log n), not O(n).
Memory (Alg. 4, priority-based eviction): while a request of B lacks KV blocks (or a
seat), the running request with the lowest priority (the eviction max-heap's root:
highest level, then longest remaining time) is evicted if it ranks below the request;
each victim's KV is offloaded or discarded by the cache-or-recompute rule (Eq. 3, 5).
"""
from __future__ import annotations

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import WAITING_STAGES, BatchBuilder, keep_tokens_for
from triage.policies.slidebatching import QueueMetrics


@register("semantic")
class Semantic(Policy):
    def __init__(self, stage_aware: bool = True, evict: bool = True) -> None:
        self.stage_aware = stage_aware
        self.evict = evict

    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        b_max = view.limits.max_num_seqs
        q = QueueMetrics(view, now)
        n = q.n_run
        rt = q.remaining_times(view.estimator)
        run_order = np.lexsort((q.seq[:n], rt, q.level[:n])).tolist()
        lv, rtl, sq = q.level[:n].tolist(), rt.tolist(), q.seq[:n].tolist()
        running = [(((int(lv[i]), rtl[i]), int(sq[i])), q.reqs[i]) for i in run_order]  # O, sorted

        # B ← top-b of Merge(C, O), C walked lazily from the heap (Alg. 2 lines 3-13)
        batch, oi, p_star_decoding, extracted, c_tokens = [], 0, None, 0, 0
        token_cap = view.limits.max_num_batched_tokens
        waiting_decodes = bool((view.columns.view()["need"] == 1).any())
        cands = view.queue.iter_sorted()
        nxt = next(cands, None)
        while len(batch) < b_max and (nxt is not None or oi < len(running)):
            take_c = nxt is not None and (oi >= len(running) or nxt[0] < running[oi][0])
            r = nxt[1] if take_c else running[oi][1]
            if p_star_decoding is None:
                p_star_decoding = self.stage_aware and r.need == 1
                if p_star_decoding and not waiting_decodes:
                    nxt = None  # C_decode is empty: no waiting request can join this step
                    continue
            if take_c:
                extracted += 1
                if p_star_decoding and r.need > 1:
                    nxt = next(cands, None) if extracted < b_max else None  # |C| <= b
                    continue  # PushBack(C_prefill, H): p* decodes, so no new prefill joins
                c_tokens += r.need
                # |C| <= b; and candidates past the step's token budget could get nothing
                # (B is served in order), so the walk stops there: same plan, less work
                nxt = next(cands, None) if extracted < b_max and c_tokens < token_cap else None
            else:
                oi += 1
            batch.append(r)

        b = BatchBuilder(view)
        victims = [r for _, r in running]  # eviction max-heap order: root last
        key = {r.id: k for k, r in running}
        keep = lambda v: keep_tokens_for(view, v)  # noqa: E731
        outranks = (lambda r, v: key[v.id] > key.get(r.id, ((r.level, 0.0), r.seq))) if self.evict else (lambda r, v: False)
        for r in batch:
            if b.full:
                break
            if not b.is_preempted(r):
                b.add_or_evict(r, victims, outranks=None if r.stage not in WAITING_STAGES else outranks, keep=keep)
        return b.build()
