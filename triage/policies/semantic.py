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
Memory (Alg. 3-5, priority-based eviction), `eviction=`:
  - "heap" (default, as published): a max-heap G over the GPU-resident running requests,
    kept across steps, keyed (f_e, f_t) inversely to the scheduling heap (root: highest
    level, then longest remaining time). A request is inserted when it becomes resident
    and re-inserted with its new key after each step it ran in (Alg. 5 lines 27-31; the
    old entry is invalidated lazily). While a request of B lacks KV blocks (or a seat),
    G.pop() is evicted (Alg. 4 lines 5-6): unconditionally, as printed — only requests
    already granted tokens this step are passed over (they hold B's higher ranks).
  - "sorted" (ours before this option): the running list re-sorted every step by the
    same key, and a victim is evicted only if it ranks below the request that needs room.
Each victim's KV is offloaded or discarded by the cache-or-recompute rule (Eq. 3, 5).
Measured side by side in docs/reproduction.md (seed 004).
"""
from __future__ import annotations

import heapq

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import WAITING_STAGES, BatchBuilder, keep_tokens_for
from triage.policies.slidebatching import QueueMetrics


class EvictionHeap:
    """Seed 004's max-heap G over resident requests (Alg. 3), with lazy invalidation.

    Used by the builder as a victim list (`victims[-1]` is the root, `pop()` removes it)."""

    def __init__(self) -> None:
        self._heap: list[tuple] = []
        self._ver: dict[str, int] = {}
        self._reqs: dict = {}
        self.live: dict = {}                 # rid -> request, the resident running set this step

    def push(self, r, key: tuple) -> None:
        v = self._ver.get(r.id, 0) + 1
        self._ver[r.id] = v
        self._reqs[r.id] = r
        level, f_t = key
        heapq.heappush(self._heap, (-level, -f_t, -r.seq, v, r.id))   # root: least urgent, longest

    def __contains__(self, rid: str) -> bool:
        return rid in self._ver

    def _clean(self) -> None:
        h = self._heap
        while h and (h[0][4] not in self.live or self._ver.get(h[0][4]) != h[0][3]):
            heapq.heappop(h)

    def forget_gone(self) -> None:
        """Drop requests no longer resident; rebuild when stale entries dominate."""
        for rid in [rid for rid in self._ver if rid not in self.live]:
            del self._ver[rid]
            self._reqs.pop(rid, None)
        if len(self._heap) > 4 * len(self._ver) + 64:
            self._heap = [e for e in self._heap if self._ver.get(e[4]) == e[3]]
            heapq.heapify(self._heap)

    def __len__(self) -> int:
        self._clean()
        return len(self._heap)

    def __getitem__(self, i: int):
        if i != -1:
            raise IndexError("only the root (-1) of the eviction heap is readable")
        self._clean()
        return self._reqs[self._heap[0][4]]

    def pop(self):
        self._clean()
        rid = heapq.heappop(self._heap)[4]
        self._ver.pop(rid, None)
        return self._reqs.pop(rid)


@register("semantic")
class Semantic(Policy):
    EVICTIONS = ("heap", "sorted")

    def __init__(self, stage_aware: bool = True, evict: bool = True, eviction: str = "heap") -> None:
        if eviction not in self.EVICTIONS:
            raise ValueError(f"eviction must be one of {', '.join(self.EVICTIONS)}, got {eviction!r}")
        self.stage_aware = stage_aware
        self.evict = evict
        self.eviction = eviction
        self._g = EvictionHeap()
        self._ran: set[str] = set()          # requests of the last step: their keys are refreshed

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
        keep = lambda v: keep_tokens_for(view, v)  # noqa: E731
        if self.eviction == "heap":
            victims = self._eviction_heap(running)
            outranks = None if self.evict else (lambda r, v: False)
            for r in batch:
                if b.full:
                    break
                if not b.is_preempted(r):
                    b.add_or_evict(r, victims, outranks=outranks if r.stage in WAITING_STAGES else None, keep=keep)
            plan = b.build()
            self._ran = set(plan.tokens)
            return plan
        victims = [r for _, r in running]  # re-sorted every step: root last
        key = {r.id: k for k, r in running}
        outranks = (lambda r, v: key[v.id] > key.get(r.id, ((r.level, 0.0), r.seq))) if self.evict else (lambda r, v: False)
        for r in batch:
            if b.full:
                break
            if not b.is_preempted(r):
                b.add_or_evict(r, victims, outranks=None if r.stage not in WAITING_STAGES else outranks, keep=keep)
        return b.build()

    def _eviction_heap(self, running: list) -> EvictionHeap:
        """G brought up to date (Alg. 5 lines 27-31): new residents inserted, those that
        ran in the last step re-inserted with their new (f_e, f_t)."""
        g = self._g
        g.live = {r.id: r for _, r in running}
        g.forget_gone()
        for (k, _seq), r in running:
            if r.id not in g or r.id in self._ran:
                g.push(r, k)
        return g
