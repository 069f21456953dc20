"""`edf`: earliest deadline first over every request, running or waiting.

Deadline = the request's next-token deadline on the envelope of seed 000 Eq. 3 / seed 002
§3.1: `arrival + TTFT_slo + generated · TPOT_slo` (the first token's deadline while it
waits, the next decode token's while it runs). Each step:

    Q ← running ∪ waiting, sorted by (deadline, seq)
    for r in Q while the token budget lasts:
        give r what it needs (chunked prefill under the token budget)
        a running r short of KV blocks → preempt running requests, latest deadline
                                         first (recompute); r itself if it is the latest
    waiting requests are admitted strictly in deadline order while memory and seats are
    free: the first that does not fit closes admission for this step. Admission never
    preempts: with envelope deadlines a running request's deadline moves later with each
    token it emits, so a preempted victim would outrank it again a few tokens later and
    the two would evict each other forever (measured: 37k preemptions on 300 requests).
"""
from __future__ import annotations

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import BatchBuilder


@register("edf")
class EDF(Policy):
    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        j = view.joined()
        n_run, reqs = j.n_run, j.reqs
        if not reqs:
            return BatchPlan()
        dl = j["deadline"]
        seq = j["seq"]
        order = np.lexsort((seq, dl))

        b = BatchBuilder(view)
        victims = [reqs[i] for i in np.lexsort((j.running("seq"), j.running("deadline"))).tolist()]  # latest deadline last
        order_l = order.tolist()
        admit_open = b.seats_left > 0
        pos = 0
        for pos, i in enumerate(order_l):
            if b.full or not admit_open:
                break
            r = reqs[i]
            if i < n_run:
                if not b.is_preempted(r):
                    b.add_or_evict(r, victims)
            elif b.add(r) == 0:
                admit_open = False
        else:
            pos = len(order_l)
        if not admit_open:                       # admission closed: only running requests remain
            tail = order[pos:]
            for i in tail[tail < n_run].tolist():
                if b.full:
                    break
                r = reqs[i]
                if not b.is_preempted(r):
                    b.add_or_evict(r, victims)
        return b.build()
