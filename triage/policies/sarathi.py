"""`sarathi-fcfs` and `sarathi-priority`: Sarathi-Serve's decode-first chunked batching.

Every decoding request gets its one token first, then running prefills continue, then
waiting requests are admitted, all under one token budget with chunked prefill. Within
each stage the order is arrival (fcfs) or strict priority (level, then arrival). When a
decode needs a KV block, the running request last in that order is preempted (recompute).
"""
from __future__ import annotations

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
        running = sorted(view.running, key=self.key)
        decodes = [r for r in running if r.need == 1]
        prefills = [r for r in running if r.need > 1]
        victims = list(running)  # last in this stage order is preempted first
        for r in [*decodes, *prefills]:
            if not b.is_preempted(r) and b.make_room(r, victims):
                b.add(r)
        if not b.preemptions:
            waiting = sorted(view.waiting, key=self.key) if self.by_priority else view.waiting
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
