"""Engine state: the view a policy reads (`SchedulerView`) and the one mutable object
that applies a plan's consequences. The simulator and the vLLM plugin both keep one.

A policy only reads: `waiting` (sorted by arrival seq; preempted requests keep their
original seq, so they sit ahead of later arrivals as in vLLM), `running` (admission
order), `kv`, `estimator`, `classes`, `limits`, `costs`, and two indexes of the
waiting queue kept in step with it: `queue`, seed 004's dual heap keyed by (effective
level, predicted remaining time), and `columns` / `run_columns`, numpy copies of the
waiting and running sets for whole-queue policies (see columns.py).
"""
from __future__ import annotations

import bisect
from typing import Iterable

from triage.classes import PriorityClasses
from triage.columns import Joined, RequestColumns
from triage.estimators import LatencyEstimator
from triage.estimators.base import remaining_time
from triage.kv import CacheCosts, KVCache
from triage.profiles import Limits
from triage.queue import DualHeap
from triage.request import KVResidency, Request, Stage


class EngineState:
    def __init__(self, kv: KVCache, estimator: LatencyEstimator, classes: PriorityClasses,
                 limits: Limits, costs: CacheCosts | None = None) -> None:
        self.kv = kv
        self.estimator = estimator
        self.classes = classes
        self.limits = limits
        self.costs = costs
        self.waiting: list[Request] = []
        self._waiting_seqs: list[int] = []
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.queue: DualHeap[Request] = DualHeap(key=self.queue_key)
        self.columns = RequestColumns(1024)
        self.run_columns = RequestColumns(256)

    def joined(self) -> Joined:
        """Running then waiting requests as numpy columns (see columns.py)."""
        return Joined(self.run_columns, self.columns)

    def queue_key(self, r: Request) -> tuple:
        """Seed 004's (f_e, f_t): effective level, then predicted remaining time."""
        return (r.level, remaining_time(self.estimator, r.need, r.computed, r.remaining_output))

    # --- membership ---------------------------------------------------------------------
    def add(self, r: Request) -> None:
        if r.id in self.requests:
            raise KeyError(f"request {r.id!r} already present")
        c = self.classes.get(r.level)
        r.weight = c.weight
        self.requests[r.id] = r
        self._insert_waiting(r)

    def _insert_waiting(self, r: Request) -> None:
        i = bisect.bisect_left(self._waiting_seqs, r.seq)
        self._waiting_seqs.insert(i, r.seq)
        self.waiting.insert(i, r)
        self.queue.push(r)
        self.columns.add(r, self.estimator, self.classes)

    def _remove_waiting(self, r: Request) -> None:
        i = bisect.bisect_left(self._waiting_seqs, r.seq)
        while self.waiting[i] is not r:
            i += 1
        del self.waiting[i]
        del self._waiting_seqs[i]
        self.queue.remove(r.id)
        self.columns.remove(r)

    def remove(self, rid: str) -> Request:
        """Abort / finish: drop the request and free its blocks."""
        r = self.requests.pop(rid)
        if r.stage in (Stage.WAITING, Stage.PREEMPTED):
            self._remove_waiting(r)
        elif r in self.running:
            self.running.remove(r)
            self.run_columns.remove(r)
        self.kv.free(rid)
        return r

    # --- relabels and class edits take effect at the next step ---------------------------
    def relabel(self, rid: str, level: int | None) -> Request:
        r = self.requests[rid]
        c = self.classes.get(level if level is not None else r.predicted_level)
        r.override_level = level
        r.weight, r.ttft_slo, r.tpot_slo = c.weight, c.ttft, c.tpot
        if r.id in self.queue:
            self.queue.rekey(r.id)
            self.columns.update(r, self.estimator, self.classes)
        elif r.id in self.run_columns.slot:
            self.run_columns.update(r, self.estimator, self.classes)
        return r

    def set_classes(self, classes: PriorityClasses) -> None:
        self.classes = classes
        for r in self.requests.values():
            c = classes.get(r.level)
            r.weight, r.ttft_slo, r.tpot_slo = c.weight, c.ttft, c.tpot
        self.refresh_estimates()

    def refresh_estimates(self) -> None:
        """After the estimator was refitted (or classes edited): re-key everything."""
        self.queue.rekey_all()
        self.columns.rebuild(self.estimator, self.classes)
        self.run_columns.rebuild(self.estimator, self.classes)

    def touch(self, r: Request) -> None:
        """Re-read a request whose fields were changed outside the methods below
        (the vLLM plugin syncing from vLLM's own request objects)."""
        if r.id in self.run_columns.slot:
            self.run_columns.update(r, self.estimator, self.classes)
        elif r.id in self.queue:
            self.queue.rekey(r.id)
            self.columns.update(r, self.estimator, self.classes)

    # --- applying a plan -----------------------------------------------------------------
    def preempt(self, rid: str, keep_tokens: int) -> Request:
        r = self.requests[rid]
        self.running.remove(r)
        self.run_columns.remove(r)
        self.kv.free(rid)
        keep = min(keep_tokens, r.computed)
        r.offloaded_tokens = keep
        r.kv = KVResidency.OFFLOADED if keep > 0 else KVResidency.DISCARDED
        r.computed = keep
        r.stage = Stage.PREEMPTED
        r.preemptions += 1
        self._insert_waiting(r)
        return r

    def admit(self, r: Request, now: float) -> float:
        """Move a waiting request to running; returns the KV reload time it costs."""
        self._remove_waiting(r)
        self.running.append(r)
        load = 0.0
        if r.kv is KVResidency.OFFLOADED and self.costs is not None:
            load = self.costs.beta * r.offloaded_tokens
        r.offloaded_tokens = 0
        r.kv = KVResidency.DEVICE
        if r.first_scheduled is None:
            r.first_scheduled = now
        r.stage = Stage.PREFILLING if r.need > 1 or r.generated == 0 else Stage.DECODING
        self.run_columns.add(r, self.estimator, self.classes)
        return load

    def allocate(self, r: Request, tokens: int) -> None:
        self.kv.allocate(r.id, r.computed + tokens)

    def advance(self, r: Request, tokens: int, t_end: float) -> bool:
        """Account `tokens` computed for r in a step that ended at t_end.
        Returns True when a token was emitted."""
        r.computed += tokens
        if r.computed < r.prompt_len + r.generated:
            r.stage = Stage.PREFILLING
            emitted = False
        else:
            r.generated += 1
            r.token_times.append(t_end)
            r.stage = Stage.DECODING
            emitted = True
        self.run_columns.update(r, self.estimator, self.classes)
        return emitted

    def finish(self, r: Request, t_end: float) -> None:
        self.running.remove(r)
        self.run_columns.remove(r)
        self.kv.free(r.id)
        del self.requests[r.id]
        r.stage = Stage.FINISHED
        r.finish_time = t_end
        r.kv = KVResidency.NONE

    def all_requests(self) -> Iterable[Request]:
        return self.requests.values()
