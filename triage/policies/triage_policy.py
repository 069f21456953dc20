"""`triage`: the product default. SlideBatching (seed 000 Alg. 1) whose weights are the
ESI classes, made stage-aware and memory-aware with seed 004's mechanisms.

Order of Q (Alg. 1 line 13, extended):
    1. protected: requests at level <= `protect_level` (ESI 1 by default), by remain;
    2. URGENT (remain < γ·φ): decodes before prefills (seed 004 Alg. 2: a less urgent
       prefill never takes the step's time from a decode), each by density (desc);
    3. NORMAL: by remain (asc).
Budget: t_budget = max(min remain, η), filled with GETMAXCHUNK as in Alg. 1; while a
protected request is decoding, the step is also kept under its remaining time and
under `protected_pace` x its class's TPOT SLO, each divided by `safety`, below η if need
be (η trades a step's fixed cost for throughput; a protected TPOT outranks that). The
default pace 1.0 plans at the SLO itself; 0.25 makes a protected answer stream about
four times faster than its SLO asks, which halves its end-to-end time per token (seed
004's normalized wait) against fcfs's, paid by every other request's prefill while it
decodes (simulation, a5000 profile: TDG 0.9953 -> 0.9907, SLO attainment 0.961 -> 0.928
on 4,000 Azure requests at x0.1; docs/simulation.md, the error-rate study), so it is an
operator's choice, not the default. `safety` is the factor by which a real step may exceed
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

`order="level"` (the live engine's mode, set by the vllm-cpu profile; see
docs/preemption.md): strict urgency with decode-first batching:
    1. eviction pass (seed 004 Alg. 4, at the seat limit as well as the KV limit): each
       waiting request, most urgent first, whose first chunk fits this step's time but
       lacks a seat or blocks preempts the most evictable running request of a strictly
       less urgent level (least urgent, longest remaining, latest arrival), never one
       already preempted `max_preemptions` times (nothing starves in a loop).
       evict_for="level": every such request displaces. evict_for="deadline" (the live
       default): a protected request always displaces; any other only when the seat that
       will free by itself comes too late for its first-token deadline: the k-th waiting
       request in batch order gets the k-th running request to finish (remaining tokens x
       a step of the running decodes), and it displaces when its time to deadline is
       below `safety` times that wait. A recompute costs the victim's whole prompt and output again, so a
       displacement that no SLO needs is throughput lost for everyone (measured:
       docs/measurements/single-engine.md, trace replay);
    2. batch: protected requests; every running decode (cheap, keeps the seats
       productive); then the rest by level, a preempted request first within its level,
       then remain. With `resume_before` f (off by default), a preempted request resumes
       ahead of all fresh (unprotected) waiting calls while each more urgent one has at least
       f x its TTFT SLO left before its first-token deadline, so an evicted stream does not
       stall mid-answer behind calls that can afford to wait; fresh calls keep their order
       among themselves, and one still displaces by the eviction rule if its seat would come
       too late. Measured live at f = 0.5 (a trace replay): the victims' stalls ~10x shorter,
       ESI-2's first-token p99 1.6x and ESI-3's 2.7x later, 3 % fewer tokens/s; so an
       operator's choice (docs/measurements/single-engine.md, 2026-12-07). With `short_first_step` (default), a step in which a protected
       request's prompt completes (its first token is emitted when the step ends) takes
       nothing after the running decodes: the protected request's first token does not
       wait for other requests' prefill chunks to fill the step (they run one step later;
       the cost is one step's fixed time per protected arrival); `first_step_slack` k > 0 lets
       that step carry up to k step fixed costs (t_c) of lower prefill after all, so the first
       token waits at most that much longer for it. `solo_first_step` (off by
       default) holds back the running decodes of that step too (they run one step later):
       the first token waits for the protected prompt alone. With `unsplit_prompts`
       (default) a protected prompt that the step's time would cut is not started: it runs
       whole in the next step, unless it is the step's first prompt (then it is chunked,
       so a prompt longer than any step still progresses, but runs whole after all when
       its rest would take no longer than a step of the running decodes: the step the
       split would add before its first token, which also holds the next protected prompt
       back a step); and a chunk whose rest would take less than a step's fixed time t_c
       takes the whole prompt (the rest would cost its request one more step). Measured
       live: 10 of 42 ESI-1 prompts of a burst had been split, each paying a whole extra
       step (0.3-0.6 s) for as few as 4 tokens (docs/measurements/single-engine.md); with
       the t_c rule alone, 13 of 51 on one instance of a cluster burst, where a step's
       prefill costs more (docs/measurements/cluster.md).
Both modes: `max_step_s` caps a step (in the profiled machine's seconds, so x the online
step-time correction β on this one; never below the running decodes plus half of it
for prefill; a protected request always gets its seat), so a newly arrived urgent
request waits at most one short step for the engine (the step boundary is our
preemption point; FlowPrefill's is an operator, seed 003 §4).
"""
from __future__ import annotations

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import SchedulerView, register
from triage.policies.builder import TIME_SLACK, BatchBuilder, keep_tokens_for
from triage.policies.slidebatching import QueueMetrics, SlideBatching, ensure_progress


@register("triage")
class Triage(SlideBatching):
    def __init__(self, phi: str = "a", gamma: float = 1.0, eta: float = 0.1, protect_level: int = 1,
                 stage_aware: bool = True, evict: bool = True, smooth: bool = True,
                 evict_for: str = "protected", safety: float = 1.0, order: str = "slide",
                 max_step_s: float | None = None, max_preemptions: int = 2, short_first_step: bool = True,
                 protected_pace: float = 1.0, solo_first_step: bool = False, unsplit_prompts: bool = True,
                 first_step_slack: float = 0.0, resume_before: float | None = None) -> None:
        super().__init__(phi=phi, gamma=gamma, eta=eta)
        # order="level": a fresh waiting call whose first-token deadline is still at least this
        # fraction of its TTFT SLO away lets preempted streams resume ahead of it (docstring, 2.)
        if resume_before is not None and not 0 < resume_before <= 1:
            raise ValueError("resume_before must be in (0, 1] (a fraction of a fresh call's TTFT SLO), or None")
        self.resume_before = resume_before
        # order="level": no protected prompt is split by the step's time, and no prompt is left
        # with a rest cheaper than a step's fixed cost (module docstring, 2.)
        self.unsplit_prompts = unsplit_prompts
        if not 0 < protected_pace <= 1:
            raise ValueError("protected_pace must be in (0, 1] (a fraction of the protected class's TPOT SLO)")
        self.protected_pace = protected_pace
        # order="level": a step that ends with a protected request's first token carries no
        # prefill of a lower group (module docstring, 2.)
        self.short_first_step = short_first_step
        # ... beyond the running decodes, up to this many step fixed costs (t_c) of it
        if first_step_slack < 0:
            raise ValueError("first_step_slack must be >= 0 (step fixed costs of prefill after a protected first token)")
        self.first_step_slack = first_step_slack
        # ... and, with solo_first_step, not even the running decodes (they run one step later)
        self.solo_first_step = solo_first_step
        if safety < 1.0:
            raise ValueError("safety must be >= 1 (the factor a real step may exceed its prediction by)")
        self.safety = safety
        self.protect_level = protect_level
        self.stage_aware = stage_aware
        self.evict = evict
        self.smooth = smooth
        if evict_for not in ("urgent", "protected", "level", "deadline"):
            raise ValueError("evict_for must be 'urgent', 'protected', 'level' or 'deadline'")
        if evict_for == "deadline" and order != "level":
            raise ValueError("evict_for='deadline' needs order='level'")
        # which waiting requests may evict: protected+URGENT, protected only, any more urgent,
        # or protected + those whose first-token deadline a natural seat would miss
        self.evict_for = evict_for
        if order not in ("slide", "level"):
            raise ValueError("order must be 'slide' (SlideBatching's URGENT/NORMAL) or 'level'")
        self.order = order
        if max_step_s is not None and max_step_s <= 0:
            raise ValueError("max_step_s must be positive")
        self.max_step_s = max_step_s
        if max_preemptions < 0:
            raise ValueError("max_preemptions must be >= 0")
        self.max_preemptions = max_preemptions

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
            tpot = q.tpot[: q.n_run][decoding]
            cap = float(np.minimum(q.remain[: q.n_run][decoding], self.protected_pace * tpot).min()) / self.safety
            t_budget = min(t_budget, max(cap, floor))
        if self.max_step_s is not None:  # never below the running decodes plus room for prefill
            # max_step_s is the profiled machine's time: the online correction β says how
            # long that is on this one (a machine 3x faster than the profile's gets a 3x
            # shorter cap, still about two full decode steps)
            cap = self.max_step_s * view.estimator.beta
            floor = q.t_c + float(q.exec[: q.n_run][decodes].sum()) + 2 * TIME_SLACK
            t_budget = min(t_budget, max(cap, floor + cap / 2))
        if self.order == "level":
            return self._plan_by_level(view, q, protected, t_budget)
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

    def _eviction_order(self, view: SchedulerView, q: QueueMetrics, bounded: bool = True) -> list:
        """Running requests, most evictable last: seed 004's eviction max-heap order
        (highest level, then longest remaining time, then latest arrival). With
        order="level", requests preempted `max_preemptions` times are not evictable."""
        n = q.n_run
        order = np.lexsort((q.seq[:n], q.remaining_times(view.estimator), q.level[:n]))
        out = [q.reqs[i] for i in order.tolist()]
        if self.order == "level" and bounded:
            out = [r for r in out if r.preemptions < self.max_preemptions]
        return out

    def _plan_by_level(self, view: SchedulerView, q: QueueMetrics, protected: np.ndarray,
                       t_budget: float) -> BatchPlan:
        """order="level": the eviction pass, then protected / running decodes / the rest
        by (level, preempted first, remain). See the module docstring."""
        n_run, n = q.n_run, len(q)
        reqs = q.reqs
        decode = (np.arange(n) < n_run) & (q.need == 1)
        resumed = np.zeros(n, dtype=bool)
        resumed[n_run:] = [r.preemptions > 0 for r in reqs[n_run:]]
        group = np.where(protected, 0, np.where(decode, 1, 2))
        if self.resume_before is not None and resumed.any():
            # a preempted stream resumes ahead of the fresh calls when none more urgent than it
            # is short of room before its first-token deadline (fresh calls keep their order)
            w = np.arange(n_run, n)
            ttft = np.array([reqs[i].ttft_slo for i in w])
            tight = ~resumed[w] & ~protected[w] & (q.remain[w] < self.resume_before * ttft)
            tightest = float(q.level[w][tight].min()) if tight.any() else np.inf
            group = np.where(group == 2, 3, group)
            group = np.where(resumed & ~protected & (q.level <= tightest), 2, group)
        order = np.lexsort((q.seq, q.remain, ~resumed, q.level, group))
        b = BatchBuilder(view, time_budget=t_budget,
                         min_remainder_s=q.t_c if self.unsplit_prompts else 0.0)
        decode_step = q.t_c + float(q.exec[decode].sum())   # a step of the running decodes alone
        if self.evict and n > n_run:
            self._evict_for_waiting(view, q, b, order.tolist(), t_budget - decode_step, decode_step)
        kv_victims: list | None = None
        token_due = False   # a protected request's prompt completes in this step
        slack = self.first_step_slack * view.estimator.beta * view.estimator.t_c   # lower prefill it may carry
        capped = False
        for i in order.tolist():
            if token_due and group[i] >= (1 if self.solo_first_step else 2):
                if self.solo_first_step or slack <= 0:
                    break
                if not capped:   # the first lower prefill: the step ends `slack` later at most
                    b.time_left, capped = min(b.time_left, slack), True
            if b.full:
                break
            r = reqs[i]
            if b.is_preempted(r):
                continue
            if i >= n_run:
                if b.blocks_short(r) == 0 and b.seats_left > 0:
                    whole = self.unsplit_prompts and bool(protected[i])
                    b.add(r, unsplit=whole, whole_within=decode_step if whole else 0.0)
            elif not b.add(r) and r.id not in b.tokens and b.blocks_short(r, min(r.need, b.tokens_left)) > 0:
                # a running request out of KV: free blocks as vLLM would (the most evictable
                # first, itself last), whatever the bound, or the engine stalls
                kv_victims = kv_victims if kv_victims is not None else self._eviction_order(view, q, bounded=False)
                if b.make_room(r, kv_victims, keep=lambda v: keep_tokens_for(view, v)):
                    b.add(r)
            if (self.short_first_step or self.solo_first_step) and protected[i] and r.need > 1 and b.tokens.get(r.id, 0) == r.need:
                token_due = True   # (granted here or by the eviction pass)
        ensure_progress(b, q, order, t_budget)
        return b.build()

    def _evict_for_waiting(self, view: SchedulerView, q: QueueMetrics, b: BatchBuilder, order: list,
                           prefill_time: float, decode_step: float) -> None:
        """Seat and KV eviction for the waiting requests that will run this step: in batch
        order, while their first chunks fit the step's prefill time, each one lacking a
        seat or blocks preempts strictly less urgent running requests (which ones may:
        `evict_for`, see the module docstring; `decode_step` is the time of a step of the
        running decodes, the pace at which running requests end by themselves)."""
        victims: list | None = None
        keep = lambda v: keep_tokens_for(view, v)  # noqa: E731
        less_urgent = lambda r, v: v.level > r.level  # noqa: E731
        est, tokens_left = view.estimator, b.tokens_left
        held_seats = held_blocks = 0
        ahead, free0, natural = 0, b.seats_left, None  # waiting requests ahead; seats free now; natural release times
        for i in order:
            if i < q.n_run:
                continue
            r = q.reqs[i]
            if self.evict_for in ("protected", "urgent") and r.level > self.protect_level:
                break
            chunk = min(r.need, tokens_left)
            cost = est.request_time(chunk, r.computed)
            prefill_time -= cost
            if chunk <= 0 or (prefill_time < 0 and held_seats and r.level > self.protect_level):
                break  # it would get no tokens this step: evicting for it now wastes work
            tokens_left -= chunk
            ahead += 1
            if b.seats_left <= 0 or b.blocks_short(r) > 0:
                if self.evict_for == "deadline" and r.level > self.protect_level:
                    if natural is None:  # when each running request will end by itself, soonest first
                        natural = np.sort(np.maximum(q._cat.running("rem_out"), 1) * decode_step)
                    k = ahead - 1 - max(free0, 0)
                    wait = float(natural[k]) if 0 <= k < len(natural) else float("inf")
                    if q.remain[i] >= self.safety * wait:  # the seat that frees by itself is soon enough
                        tokens_left += chunk
                        prefill_time += cost
                        continue
                victims = victims if victims is not None else self._eviction_order(view, q)
                if not b.make_room(r, victims, outranks=less_urgent, keep=keep):
                    if r.preemptions > 0 and self.resume_before is not None:
                        # a preempted stream may stand ahead of more urgent fresh calls: it waits
                        # for a seat, they may still displace
                        tokens_left += chunk
                        prefill_time += cost
                        continue
                    break  # nothing less urgent left to evict, and later requests are no more urgent
            need = -(-r.known // b.bs)
            b.seats_left -= 1
            b.free_blocks -= need
            held_seats += 1
            held_blocks += need
        b.seats_left += held_seats  # the batch pass hands these seats out in the same order
        b.free_blocks += held_blocks
