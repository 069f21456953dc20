"""The one object that hands out a step's budgets and says why it stopped.

Budgets: tokens (`max_num_batched_tokens`), seats (`max_num_seqs`), time (an optional
latency budget converted through the estimator) and KV memory (free blocks, with vLLM's
full-prompt admission gate). `add(r, want)` grants as many of `want` tokens as every
budget allows (0 if none) and records the first budget that cut it short.
"""
from __future__ import annotations

import math

from triage.estimators import Work
from triage.plan import BatchPlan, Preemption
from triage.request import Request, Stage
from triage.state import EngineState

WAITING_STAGES = (Stage.WAITING, Stage.PREEMPTED)
TIME_SLACK = 1e-3  # a step within 1 ms of its time budget takes nothing more


class BatchBuilder:
    def __init__(self, view: EngineState, time_budget: float | None = None, min_remainder_s: float = 0.0) -> None:
        self.view = view
        self.est = view.estimator
        self.bs = view.kv.block_size
        lim = view.limits
        self.tokens: dict[str, int] = {}
        self.works: list[Work] = []
        self.preemptions: list[Preemption] = []
        self.tokens_left = lim.max_num_batched_tokens
        self.seats_left = lim.max_num_seqs - len(view.running)
        self.free_blocks = view.kv.free_blocks
        self._held = view.kv._held
        self._decode_time = self.est.decode_time_fn()
        self.budget = time_budget
        self.time_left = math.inf if time_budget is None else time_budget - self.est.beta * self.est.t_c
        self.predicted = self.est.beta * self.est.t_c
        # a time-cut chunk whose rest would take less than this takes the whole prompt
        # instead: the rest would cost its request a whole extra step (0: off, Alg. 1's GETMAXCHUNK)
        self.min_remainder_s = min_remainder_s
        self.prefills = 0          # prompts (or prompt chunks) granted so far this step
        self.stop = "queue"
        self._preempted: set[str] = set()
        self._reasons: set[str] = set()

    def _cut(self, reason: str) -> int:
        if self.stop == "queue":
            self.stop = reason
        self._reasons.add(reason)
        return 0

    @property
    def full(self) -> bool:
        """No further request can get anything this step."""
        return self.tokens_left <= 0 or self.time_left <= TIME_SLACK

    def add(self, r: Request, want: int | None = None, *, use_time: bool = True, whole: bool = False,
            unsplit: bool = False, whole_within: float = 0.0) -> int:
        """Grant r up to `want` tokens (default: its need); `whole=True` grants nothing
        unless the KV blocks for all of it are free (vLLM allocates all or preempts);
        `unsplit=True`: a prompt the time budget would cut is deferred whole to the next
        step instead, unless it is the step's first prefill (then it is chunked: progress);
        `whole_within`: as the step's first prefill, a prompt the time budget would cut is
        granted whole when its rest would take at most this long (past the budget: the step
        has no time left after it)."""
        rid = r.id
        if rid in self.tokens or rid in self._preempted:
            return 0
        computed = r.computed
        known = r.prompt_len + r.generated
        need = known - computed
        if need == 1 and computed and rid in self._held:  # fast path: a running decode
            if self.tokens_left <= 0:
                return self._cut("tokens")
            t = self._decode_time(computed)
            if use_time and t > self.time_left:
                return self._cut("time")
            extra = -(-(computed + 1) // self.bs) - self._held[rid]
            if extra > 0:
                if extra > self.free_blocks:
                    return self._cut("memory")
                self.free_blocks -= extra
            self.tokens[rid] = 1
            self.works.append(Work(1, computed))
            self.tokens_left -= 1
            self.time_left -= t
            self.predicted += t
            return 1
        want = need if want is None or want > need else want
        if want <= 0:
            return 0
        admitting = r.stage in WAITING_STAGES
        if admitting and self.seats_left <= 0:
            return self._cut("seats")
        k = want if want < self.tokens_left else self.tokens_left
        if k <= 0:
            return self._cut("tokens")
        est = self.est
        if use_time and self.time_left != math.inf:
            if k == 1:
                if est.request_time(1, computed) > self.time_left:
                    return self._cut("time")
            else:
                full = k
                k = est.max_chunk(computed, self.time_left, k)
                rest_ok = self.min_remainder_s if self.prefills else max(self.min_remainder_s, whole_within)
                if k < full and rest_ok > 0 and k > 0 and \
                        est.request_time(full, computed) - est.request_time(k, computed) <= rest_ok:
                    k = full
                if k < full and unsplit and self.prefills:
                    return self._cut("time")
                if k <= 0:
                    return self._cut("time")
        bs = self.bs
        if admitting:
            held = 0
            if -(-known // bs) > self.free_blocks:
                return self._cut("memory")
        else:
            held = self._held.get(rid, 0)
        room = (held + self.free_blocks) * bs - computed
        if room < k:
            if whole:
                return self._cut("memory")
            k = room
            self._cut("memory")
            if k <= 0:
                return 0
        t = est.request_time(k, computed)
        self.tokens[rid] = k
        self.works.append(Work(k, computed))
        self.tokens_left -= k
        self.time_left -= t
        self.predicted += t
        extra = -(-(computed + k) // bs) - held
        if extra > 0:
            self.free_blocks -= extra
        if admitting:
            self.seats_left -= 1
        self.prefills += 1
        return k

    def blocks_short(self, r: Request, want: int | None = None) -> int:
        """Blocks missing for r to get `want` (default: its need) this step."""
        want = r.need if want is None else want
        if r.stage in WAITING_STAGES:
            return max(0, -(-r.known // self.bs) - self.free_blocks)
        held = self._held.get(r.id, 0)
        return max(0, -(-(r.computed + want) // self.bs) - held - self.free_blocks)

    def preempt(self, victim: Request, keep_tokens: int = 0, reason: str = "", for_request: str | None = None) -> None:
        """Free a running victim's blocks for this step (it gets no tokens)."""
        if victim.id in self.tokens:
            raise ValueError(f"{victim.id} is already in the batch")
        self.free_blocks += self.view.kv.blocks_of(victim.id)
        self.seats_left += 1
        self._preempted.add(victim.id)
        self.preemptions.append(Preemption(victim.id, keep_tokens, reason, for_request))

    def is_preempted(self, r: Request) -> bool:
        return r.id in self._preempted

    def add_or_evict(self, r: Request, victims: list[Request], *, outranks=None, keep=None,
                     use_time: bool = True) -> int:
        """Grant r its tokens, preempting from `victims` first if its KV blocks (or a
        seat) are missing: the fast path costs one `add`."""
        k = self.add(r, whole=True, use_time=use_time)
        if k or r.id in self.tokens or r.id in self._preempted:
            return k
        if self.make_room(r, victims, outranks=outranks, keep=keep):
            return self.add(r, whole=True, use_time=use_time)
        return 0

    def make_room(self, r: Request, victims: list[Request], *, outranks=None, keep=None) -> bool:
        """Preempt from the end of `victims` (most evictable last) until r has the KV
        blocks, and if it is waiting the seat, for what it wants this step.

        `outranks(r, v)` says whether r may evict v (default: always). A running request
        that finds only itself evictable is preempted itself, as vLLM does. Victims keep
        `keep(v)` tokens offloaded (default: recompute). Returns whether r can now run."""
        want = min(r.need, self.tokens_left)
        waiting = r.stage in WAITING_STAGES
        while (waiting and self.seats_left <= 0) or self.blocks_short(r, want) > 0:
            while victims and (self.is_preempted(victims[-1]) or victims[-1].id in self.tokens):
                victims.pop()
            if not victims:
                return False
            v = victims[-1]
            reason = "seat" if waiting and self.seats_left <= 0 else "kv"
            if v is r:
                victims.pop()
                self.preempt(r, keep(r) if keep else 0, reason)
                return False
            if outranks is not None and not outranks(r, v):
                return False
            victims.pop()
            self.preempt(v, keep(v) if keep else 0, reason, r.id)
        return True

    def build(self) -> BatchPlan:
        return BatchPlan(self.tokens, self.preemptions, self.budget, self.predicted, self.stop)


def keep_tokens_for(view: EngineState, victim: Request) -> int:
    """Cache-or-recompute (seed 004 Eq. 3 and 5): tokens to offload, 0 to recompute."""
    if view.costs is None:
        return 0
    return view.costs.keep_tokens(victim.prompt_len, victim.computed)
