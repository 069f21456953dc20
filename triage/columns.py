"""Columnar copy of the waiting queue, kept in step with `EngineState`.

Waiting requests do not change while they wait (only a relabel, a class edit or a
refit of the estimator changes them), so their per-request quantities are stored once
in numpy columns and policies that look at the whole queue every step (SlideBatching,
triage) read them without touching a thousand Python objects.
"""
from __future__ import annotations

import numpy as np

from triage.classes import PriorityClasses
from triage.estimators import LatencyEstimator
from triage.request import Request

FIELDS = ("seq", "level", "deadline", "need", "computed", "wnext", "exec_u", "known")


class WaitingColumns:
    def __init__(self, capacity: int = 1024) -> None:
        self.n = 0
        self.cols = {f: np.zeros(capacity) for f in FIELDS}
        self.reqs: list[Request | None] = [None] * capacity
        self.slot: dict[str, int] = {}

    def _grow(self) -> None:
        cap = len(self.reqs) * 2
        for f, a in self.cols.items():
            b = np.zeros(cap)
            b[: self.n] = a[: self.n]
            self.cols[f] = b
        self.reqs.extend([None] * (cap - len(self.reqs)))

    def _write(self, i: int, r: Request, est: LatencyEstimator, classes: PriorityClasses) -> None:
        c = self.cols
        c["seq"][i] = r.seq
        c["level"][i] = r.level
        c["deadline"][i] = r.next_deadline
        c["need"][i] = r.need
        c["computed"][i] = r.computed
        c["wnext"][i] = classes.token_weight(r.level, r.generated + 1)
        c["exec_u"][i] = est._request_time(r.need, r.computed) if r.need > 1 else est._request_time(1, r.computed)
        c["known"][i] = r.known
        self.reqs[i] = r

    def add(self, r: Request, est: LatencyEstimator, classes: PriorityClasses) -> None:
        if self.n == len(self.reqs):
            self._grow()
        self.slot[r.id] = self.n
        self._write(self.n, r, est, classes)
        self.n += 1

    def update(self, r: Request, est: LatencyEstimator, classes: PriorityClasses) -> None:
        self._write(self.slot[r.id], r, est, classes)

    def remove(self, r: Request) -> None:
        i = self.slot.pop(r.id)
        last = self.n - 1
        if i != last:
            for a in self.cols.values():
                a[i] = a[last]
            moved = self.reqs[last]
            self.reqs[i] = moved
            self.slot[moved.id] = i
        self.reqs[last] = None
        self.n = last

    def rebuild(self, est: LatencyEstimator, classes: PriorityClasses) -> None:
        for i in range(self.n):
            self._write(i, self.reqs[i], est, classes)

    def view(self) -> dict[str, np.ndarray]:
        return {f: a[: self.n] for f, a in self.cols.items()}
