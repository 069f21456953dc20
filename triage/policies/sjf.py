"""`sjf`: shortest job first by predicted length (the length-aware baseline of seed 004 §4).

Running requests keep running in admission order (as vLLM does: decodes and continuing
prefills are not displaced). Waiting requests are admitted in order of their predicted
remaining output length (the length predictor's value, minus tokens already generated
for a preempted request), then prompt tokens still to compute, then arrival:

    for r in running:                   give r what it needs (token budget, chunked)
                                        short of KV blocks → preempt the newest running
    if nothing was preempted:
        for r in sorted(waiting, key=(predicted_output − generated, need, seq)):
            admit r; stop at the first that does not fit
"""
from __future__ import annotations

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import BatchBuilder


@register("sjf")
class SJF(Policy):
    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        b = BatchBuilder(view)
        victims = list(view.running)  # the most recently admitted is preempted first
        for r in view.running:
            if b.tokens_left <= 0:
                break
            if not b.is_preempted(r):
                b.add_or_evict(r, victims)
        n = view.columns.n
        if b.preemptions or not n or b.full or b.seats_left <= 0:
            return b.build()
        cols = view.columns.view()
        reqs = view.columns.requests()
        for i in np.lexsort((cols["seq"], cols["need"], cols["rem_out"])).tolist():
            if b.full or b.add(reqs[i]) == 0:
                break
        return b.build()
