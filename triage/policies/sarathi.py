"""`sarathi-fcfs` and `sarathi-priority`: Sarathi-Serve's decode-first chunked batching.

Every decoding request gets its one token first, then running prefills continue, then
waiting requests are admitted, all under one token budget with chunked prefill. Within
each stage the order is arrival (fcfs) or strict priority (level, then arrival). When a
decode needs a KV block, the running request last in that order is preempted (recompute).
"""
from __future__ import annotations

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import BatchBuilder
from triage.request import Request


class _Sarathi(Policy):
    by_priority: bool = False

    def key(self, r: Request) -> tuple:
        return (r.level, r.seq) if self.by_priority else (r.seq,)

    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        b = BatchBuilder(view)
        rc = view.run_columns.view()
        runs = view.run_columns.requests()
        keys = (rc["seq"], rc["level"]) if self.by_priority else (rc["seq"],)
        order = np.lexsort(keys).tolist()
        running = [runs[i] for i in order]
        victims = list(running)  # last in this order is preempted first
        decode = (rc["need"] == 1).tolist()
        for r in [*(runs[i] for i in order if decode[i]), *(runs[i] for i in order if not decode[i])]:
            if not b.is_preempted(r):
                b.add_or_evict(r, victims)
        if not b.preemptions:
            if self.by_priority:
                wc = view.columns.view()
                reqs = view.columns.requests()
                waiting = (reqs[i] for i in np.lexsort((wc["seq"], wc["level"])).tolist())
            else:
                waiting = view.waiting
            for r in waiting:
                if b.add(r) == 0:
                    break
        return b.build()


@register("sarathi-fcfs")
class SarathiFCFS(_Sarathi):
    by_priority = False


@register("sarathi-priority")
class SarathiPriority(_Sarathi):
    by_priority = True
    queue_order = "level"
