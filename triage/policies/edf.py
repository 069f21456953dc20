"""`edf`: earliest deadline first over every request, running or waiting.

Deadline = the request's next-token deadline on the envelope of seed 000 Eq. 3 / seed 002
§3.1: `arrival + TTFT_slo + generated · TPOT_slo` (the first token's deadline while it
waits, the next decode token's while it runs). Each step:

    Q ← running ∪ waiting, sorted by (deadline, seq)
    for r in Q while the token budget lasts:
        give r what it needs (chunked prefill under the token budget)
        short of KV blocks / a seat → preempt running requests with a later deadline,
                                      latest first (recompute); a running request that
                                      finds only itself later is preempted itself (vLLM)
    waiting requests are admitted strictly in deadline order: the first that cannot get
    memory or a seat closes admission for this step.
"""
from __future__ import annotations

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import BatchBuilder


@register("edf")
class EDF(Policy):
    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        run = view.running
        n_run = len(run)
        cols = view.columns.view()
        reqs = [*run, *view.columns.reqs[: view.columns.n]]
        if not reqs:
            return BatchPlan()
        dl = np.concatenate([np.fromiter((r.next_deadline for r in run), float, n_run), cols["deadline"]])
        seq = np.concatenate([np.fromiter((r.seq for r in run), float, n_run), cols["seq"]])
        order = np.lexsort((seq, dl))

        b = BatchBuilder(view)
        key = lambda r: (r.next_deadline, r.seq)  # noqa: E731
        victims = sorted(run, key=key)  # latest deadline last: preempted first
        later = lambda r, v: key(v) > key(r)  # noqa: E731
        running_left, admit_open = n_run, True
        for i in order.tolist():
            if b.full or (running_left == 0 and not admit_open):
                break
            r = reqs[i]
            if i < n_run:
                running_left -= 1
                if not b.is_preempted(r) and b.make_room(r, victims):
                    b.add(r)
            elif admit_open:
                if not (b.make_room(r, victims, outranks=later) and b.add(r)):
                    admit_open = False
        return b.build()
