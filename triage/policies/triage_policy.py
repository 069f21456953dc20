"""`triage`: the product default. SlideBatching (seed 000 Alg. 1) whose weights are the
ESI classes, made stage-aware and memory-aware with seed 004's mechanisms.

Order of Q (Alg. 1 line 13, extended):
    1. protected: requests at level <= `protect_level` (ESI 1 by default), by remain;
    2. URGENT (remain < γ·φ): decodes before prefills (seed 004 Alg. 2: a less urgent
       prefill never takes the step's time from a decode), each by density (desc);
    3. NORMAL: by remain (asc).
Budget: t_budget = max(min remain, η), filled with GETMAXCHUNK as in Alg. 1; while a
protected request is decoding, the step is also kept under its remaining time divided
by `safety`, below η if need be (η trades a step's fixed cost for throughput; a
protected TPOT outranks that). `safety` is the factor by which a real step may exceed
its prediction: a profile measured on noisy hardware sets it from the step-time noise
(`policy_params`), 1.0 plans with the mean.
Smooth deadlines: a running request's next deadline is min(envelope, last token +
TPOT_slo), so slack won early is not spent as one long stall (SLO attainment counts
the worst gap, TDG only the envelope).
Memory and seats (seed 004 Alg. 4): a protected request (with evict_for="urgent", also
an URGENT one) that lacks KV blocks or a seat evicts running requests of a strictly less
urgent level, least urgent and longest remaining first; each victim is offloaded or
recomputed by Eq. 3 / Eq. 5. Evicting only for protected requests is the default: on
the a5000 profile it gave TDG 0.960 vs 0.951 at rate scale 0.14 (Azure conv, 1,000
requests), and on a recompute-only CPU engine every eviction of a long prompt costs
seconds of recomputation.
"""
from __future__ import annotations

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import SchedulerView, register
from triage.policies.builder import WAITING_STAGES, BatchBuilder, keep_tokens_for
from triage.policies.slidebatching import QueueMetrics, SlideBatching, ensure_progress


@register("triage")
class Triage(SlideBatching):
    def __init__(self, phi: str = "a", gamma: float = 1.0, eta: float = 0.1, protect_level: int = 1,
                 stage_aware: bool = True, evict: bool = True, smooth: bool = True,
                 evict_for: str = "protected", safety: float = 1.0) -> None:
        super().__init__(phi=phi, gamma=gamma, eta=eta)
        if safety < 1.0:
            raise ValueError("safety must be >= 1 (the factor a real step may exceed its prediction by)")
        self.safety = safety
        self.protect_level = protect_level
        self.stage_aware = stage_aware
        self.evict = evict
        self.smooth = smooth
        if evict_for not in ("urgent", "protected"):
            raise ValueError("evict_for must be 'urgent' or 'protected'")
        self.evict_for = evict_for  # which waiting requests may evict: protected+URGENT, or protected only

    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        q = QueueMetrics(view, now, smooth=self.smooth)
        if not len(q):
            return BatchPlan()
        t_budget = q.budget(self.eta)
        protected = q.level <= self.protect_level
        decodes = q.need[: q.n_run] == 1
        decoding = protected[: q.n_run] & decodes
        if decoding.any():  # a protected decode's next token must not wait on a long step,
            # but every running decode still fits (dropping one would not speed the step up much)
            floor = q.t_c + float(q.exec[: q.n_run][decodes].sum())
            cap = float(q.remain[: q.n_run][decoding].min()) / self.safety
            t_budget = min(t_budget, max(cap, floor))
        urgent = (q.remain < self.gamma * q.phi(self.phi, t_budget)) & ~protected
        group = np.where(protected, 0, np.where(urgent, 1, 2))
        n_run = q.n_run
        is_decode = np.zeros(len(q), dtype=bool)
        if self.stage_aware:
            is_decode[:n_run] = q.need[:n_run] == 1
        stage = np.where((group == 1) & ~is_decode, 1, 0)
        within = np.where(group == 1, -q.density, q.remain)
        order = np.lexsort((q.seq, within, stage, group))

        b = BatchBuilder(view, time_budget=t_budget)
        victims: list | None = None  # built on first need: most evictable last
        keep = lambda v: keep_tokens_for(view, v)  # noqa: E731
        less_urgent = lambda r, v: v.level > r.level  # noqa: E731
        n_run = q.n_run
        running_left = n_run
        admit_open = True            # NORMAL admissions stop at the first that does not fit
        evict_below = float("inf") if self.evict else 0.0  # failed at level L: fails for all >= L
        levels, groups, reqs = q.level.tolist(), group.tolist(), q.reqs
        # lowest level still to come among waiting protected/URGENT requests, per position
        evict_groups = 2 if self.evict_for == "urgent" else 1
        cand = np.where((np.arange(len(q)) >= n_run) & (group < evict_groups), q.level, np.inf)[order]
        still = np.minimum.accumulate(cand[::-1])[::-1].tolist()
        for pos, i in enumerate(order.tolist()):
            if b.full or (running_left == 0 and not admit_open and still[pos] >= evict_below):
                break
            r = reqs[i]
            if i < n_run:  # running
                running_left -= 1
                if b.is_preempted(r) or b.add(r):
                    continue
                if b.blocks_short(r, min(r.need, b.tokens_left)) > 0:
                    victims = victims if victims is not None else self._eviction_order(view, q)
                    if b.make_room(r, victims, keep=keep):
                        b.add(r)
            elif self.evict and groups[i] < evict_groups and levels[i] < evict_below:
                if b.blocks_short(r) > 0 or b.seats_left <= 0:
                    victims = victims if victims is not None else self._eviction_order(view, q)
                    if not b.make_room(r, victims, outranks=less_urgent, keep=keep):
                        evict_below = levels[i]
                        continue
                b.add(r)
            elif admit_open:
                if b.blocks_short(r) == 0 and b.seats_left > 0:
                    b.add(r)
                else:
                    admit_open = False
        ensure_progress(b, q, order, t_budget)
        return b.build()

    @staticmethod
    def _eviction_order(view: SchedulerView, q: QueueMetrics) -> list:
        """Running requests, most evictable last: seed 004's eviction max-heap order
        (highest level, then longest remaining time, then latest arrival)."""
        n = q.n_run
        order = np.lexsort((q.seq[:n], q.remaining_times(view.estimator), q.level[:n]))
        return [q.reqs[i] for i in order.tolist()]
