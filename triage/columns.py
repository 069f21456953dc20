"""Columnar copies of the waiting and running sets, kept in step with `EngineState`.

Policies that look at the whole queue every step (SlideBatching, triage, the seed
policies) read these numpy columns instead of touching a thousand Python objects.
A row is written whenever the state changes the request (arrival, admission, every
step's tokens, preemption, relabel, class edit) — O(1) each — and rows are swap-removed,
so the row order is arbitrary: sort with `seq` as the final tie-breaker.

Columns: seq, level, deadline (envelope deadline of the next token), last_token (time of
the last emitted token, NaN before the first), tpot (SLO), need, computed, known,
wnext (TDG weight of the next token), exec_u (uncorrected time of the whole remaining
need: the rest of the prefill, or one decode), rem_out (predicted output tokens left).
"""
from __future__ import annotations

import math

import numpy as np

from triage.classes import PriorityClasses
from triage.estimators import LatencyEstimator
from triage.request import Request

FIELDS = ("seq", "level", "deadline", "last_token", "tpot", "need", "computed", "known", "wnext", "exec_u", "rem_out")
INDEX = {f: k for k, f in enumerate(FIELDS)}


class RequestColumns:
    def __init__(self, capacity: int = 256) -> None:
        self.n = 0
        self._data = np.zeros((capacity, len(FIELDS)))  # row-major: one row per request
        self.reqs: list[Request | None] = [None] * capacity
        self.slot: dict[str, int] = {}

    def __len__(self) -> int:
        return self.n

    def _grow(self) -> None:
        cap = self._data.shape[0] * 2
        data = np.zeros((cap, len(FIELDS)))
        data[: self.n] = self._data[: self.n]
        self._data = data
        self.reqs.extend([None] * (cap - len(self.reqs)))

    def _write(self, i: int, r: Request, est: LatencyEstimator, classes: PriorityClasses) -> None:
        need = r.prompt_len + r.generated - r.computed
        level = r.level
        self._data[i] = (
            r.seq, level, r.arrival + r.ttft_slo + r.generated * r.tpot_slo,
            r.token_times[-1] if r.token_times else math.nan, r.tpot_slo,
            need, r.computed, r.prompt_len + r.generated,
            classes.token_weight(level, r.generated + 1),
            est._request_time(need, r.computed), max(1, r.predicted_output_len - r.generated),
        )
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
            self._data[i] = self._data[last]
            moved = self.reqs[last]
            self.reqs[i] = moved
            self.slot[moved.id] = i
        self.reqs[last] = None
        self.n = last

    def rebuild(self, est: LatencyEstimator, classes: PriorityClasses) -> None:
        for i in range(self.n):
            self._write(i, self.reqs[i], est, classes)

    def col(self, field: str) -> np.ndarray:
        """One column over the live rows (a view, not a copy)."""
        return self._data[: self.n, INDEX[field]]

    def view(self) -> dict[str, np.ndarray]:
        d = self._data[: self.n]
        return {f: d[:, k] for k, f in enumerate(FIELDS)}

    def requests(self) -> list[Request]:
        return self.reqs[: self.n]



class Joined:
    """Running rows first, then waiting rows: `j[field]` is one array over both sets,
    `j.reqs` the matching requests, `j.n_run` where the waiting rows start."""

    def __init__(self, running: RequestColumns, waiting: RequestColumns) -> None:
        self.n_run = running.n
        self._run, self._wait = running, waiting
        self.reqs: list[Request] = running.requests() + waiting.requests()

    def __len__(self) -> int:
        return len(self.reqs)

    def __getitem__(self, field: str) -> np.ndarray:
        return np.concatenate([self._run.col(field), self._wait.col(field)])

    def running(self, field: str) -> np.ndarray:
        return self._run.col(field)
