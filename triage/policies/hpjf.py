"""`hpjf`: highest-priority-job-first (the priority baseline of seed 004 §4).

All requests, running or waiting, in (level, arrival) order get what they need under
the token budget. A request short of KV blocks preempts running requests of strictly
lower priority (last in that order first, recompute); it never preempts its betters.
"""
from __future__ import annotations

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import BatchBuilder


@register("hpjf")
class HPJF(Policy):
    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        b = BatchBuilder(view)
        key = lambda r: (r.level, r.seq)  # noqa: E731
        j = view.joined()
        reqs, n_run = j.reqs, j.n_run
        order = np.lexsort((j["seq"], j["level"])).tolist()
        victims = [reqs[i] for i in order if i < n_run]
        outranks = lambda r, v: key(v) > key(r)  # noqa: E731
        admit_open = True
        for i in order:
            if b.full or (not admit_open and not victims):
                break
            r = reqs[i]
            if b.is_preempted(r):
                continue
            if i >= n_run and not admit_open:
                continue
            if not b.add_or_evict(r, victims, outranks=outranks) and i >= n_run:
                admit_open = False  # nothing below this priority can be admitted either
        return b.build()
