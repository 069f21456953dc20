"""`hpjf`: highest-priority-job-first (the priority baseline of seed 004 §4).

All requests, running or waiting, in (level, arrival) order get what they need under
the token budget. A request short of KV blocks preempts running requests of strictly
lower priority (last in that order first, recompute); it never preempts its betters.
"""
from __future__ import annotations

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import BatchBuilder


@register("hpjf")
class HPJF(Policy):
    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        b = BatchBuilder(view)
        key = lambda r: (r.level, r.seq)  # noqa: E731
        victims = sorted(view.running, key=key)
        for r in sorted([*view.running, *view.waiting], key=key):
            if b.full:
                break
            if not b.is_preempted(r) and b.make_room(r, victims, outranks=lambda r, v: key(v) > key(r)):
                b.add(r)
        return b.build()
