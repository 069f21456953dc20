"""`vtc`: weighted Virtual Token Counter (Sheng et al., "Fairness in Serving Large
Language Models", OSDI'24, Alg. 2 with weights), with the priority classes as clients.

Each client c (an ESI level) has a virtual counter; serving it tokens advances the
counter in proportion to their cost and inversely to the class weight w_p:

    counter[c] += (w_in · prefill tokens + w_out · decode tokens) / w_p(c)

Each step (continuous batching, Sarathi-style chunked prefill under the token budget):

    lift: a client that just came back (no waiting request at the previous step) gets
          counter[c] ← max(counter[c], min{counter[c'] : c' had waiting requests})
    running requests: decodes, then continuing prefills (charged to their client)
    admission: repeatedly take the client with the smallest counter that has a waiting
          request, admit its earliest request (charge what it was given); stop at the
          first request that does not fit (memory, seats or tokens)

Counters persist across steps (the policy's only state); ties break on level, then seq.
"""
from __future__ import annotations

import heapq

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import BatchBuilder


@register("vtc")
class VTC(Policy):
    def __init__(self, w_in: float = 1.0, w_out: float = 2.0) -> None:
        self.w_in = w_in
        self.w_out = w_out
        self.counter: dict[int, float] = {}
        self._waiting_levels: frozenset[int] = frozenset()

    def _charge(self, view: SchedulerView, level: int, tokens: int, decode: bool) -> None:
        cost = (self.w_out if decode else self.w_in) * tokens
        self.counter[level] = self.counter.get(level, 0.0) + cost / view.classes.get(level).weight

    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        n = view.columns.n
        cols = view.columns.view()
        wlev = cols["level"].astype(int)
        levels = frozenset(np.unique(wlev).tolist()) if n else frozenset()
        prev = [self.counter.get(c, 0.0) for c in self._waiting_levels if c in self.counter]
        floor = min(prev) if prev else None
        for c in levels - self._waiting_levels:  # lift returning clients
            self.counter[c] = max(self.counter.get(c, 0.0), floor) if floor is not None else self.counter.get(c, 0.0)
        self._waiting_levels = levels

        b = BatchBuilder(view)
        victims = list(view.running)
        rcols = view.run_columns.view()
        rreqs, rneed = view.run_columns.requests(), rcols["need"]
        need_l, level_l = rneed.tolist(), rcols["level"].astype(int).tolist()
        served: dict[tuple[int, bool], int] = {}
        # decodes, then continuing prefills, each in admission (arrival) order
        for i in np.lexsort((rcols["seq"], rneed > 1)).tolist():
            r = rreqs[i]
            if b.tokens_left <= 0:
                break
            if b.is_preempted(r):
                continue
            k = b.add(r) or b.add_or_evict(r, victims)  # the plain add is the common case
            if k:
                key = (level_l[i], k == 1 and need_l[i] == 1 and r.generated > 0)
                served[key] = served.get(key, 0) + k
        for (level, decode), k in sorted(served.items()):
            self._charge(view, level, k, decode=decode)
        if b.preemptions or not n or b.full:
            return b.build()

        reqs = view.columns.reqs[:n]
        order = np.lexsort((cols["seq"], wlev))
        lv = wlev[order]
        starts = np.flatnonzero(np.concatenate(([True], lv[1:] != lv[:-1])))
        ends = np.concatenate((starts[1:], [len(lv)]))
        queues = {int(lv[s]): (s, e) for s, e in zip(starts.tolist(), ends.tolist())}
        heap = [(self.counter.get(c, 0.0), c) for c in queues]
        heapq.heapify(heap)
        order_l = order.tolist()
        while heap and not b.full:
            _, c = heapq.heappop(heap)
            s, e = queues[c]
            r = reqs[order_l[s]]
            k = b.add(r)
            if k == 0:
                break
            self._charge(view, c, k, decode=False)
            if s + 1 < e:
                queues[c] = (s + 1, e)
                heapq.heappush(heap, (self.counter[c], c))
        return b.build()
