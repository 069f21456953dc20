"""`fcfs-prefill-first`: vLLM v0's default scheduler (chunked prefill off), restated.

vLLM v0 `Scheduler._schedule_default`, without swapping:

    1. prefill step: waiting requests in arrival order (a preempted request keeps its
       place ahead of later arrivals) are admitted whole — prompt, or prompt + generated
       tokens when it was preempted (recompute) — while the step's token budget, the
       seats and the KV blocks hold; the first that does not fit ends the step (FCFS,
       head-of-line). If anything was admitted, the step is prefills only: every
       running decode waits (the decode stall of seed 002 §2.3, Fig. 2c).
    2. otherwise a decode step: every running request, in admission order, gets its one
       token; one that cannot get a KV block preempts the most recently admitted running
       request (recompute), itself if it is the latest.

The token budget is the engine's `max_num_batched_tokens` (v0's default with chunking
off is max(max_model_len, 2048), so that any prompt fits one step; set the profile's
limits that way to reproduce it). A prompt longer than the whole budget, which v0 would
refuse, is prefilled alone over consecutive prefill-only steps rather than dropped, so
this policy also runs on the chunked engines' profiles. Contrast `fcfs` (vLLM v1's
default: one mixed step, running requests first, prefills chunked to the token budget)
and `sarathi-fcfs` (decode-first, then chunked prefills, the same token budget).
"""
from __future__ import annotations

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import BatchBuilder


@register("fcfs-prefill-first")
class FCFSPrefillFirst(Policy):
    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        b = BatchBuilder(view)
        # a prompt longer than the budget, started in an earlier step, continues first
        for r in view.running:
            if r.need > 1 and b.add(r, whole=True) == 0:
                break
        if not b.tokens:
            for r in view.waiting:
                alone = not b.tokens and r.need > b.tokens_left      # longer than any step: alone, chunked
                if (r.need > b.tokens_left and not alone) or b.add(r, whole=True) == 0:
                    break
                if alone:
                    break
        if b.tokens:
            return b.build()                  # a prefill step: running decodes wait
        b = BatchBuilder(view)
        victims = list(view.running)          # the most recently admitted is preempted first
        for r in view.running:
            if not b.is_preempted(r):
                b.add_or_evict(r, victims)
        return b.build()
