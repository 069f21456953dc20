"""`fcfs`: vLLM v1's default scheduler, restated.

1. Running requests in admission order get what they need (chunked by the token
   budget). When one cannot get KV blocks, the most recently admitted running request
   is preempted (recompute) until it can, or it is itself the victim.
2. If nothing was preempted this step, waiting requests are admitted in arrival order
   (preempted ones keep their arrival position) until the first that does not fit.
"""
from __future__ import annotations

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import BatchBuilder


@register("fcfs")
class FCFS(Policy):
    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        b = BatchBuilder(view)
        victims = list(view.running)  # the most recently admitted is preempted first
        for r in view.running:
            if not b.is_preempted(r) and b.tokens_left > 0:
                b.add_or_evict(r, victims)
        if not b.preemptions:
            for r in view.waiting:
                if b.add(r) == 0:
                    break
        return b.build()
