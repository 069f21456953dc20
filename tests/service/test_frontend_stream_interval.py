"""Calls below the most urgent level stream in chunks (setting `stream_interval`, default 4),
never so large that a chunk holds a token back longer than half the call's TPOT SLO at the
engine's measured time a token; the most urgent level streams every token."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from serving.backends.base import stream_interval
from serving.loop import Frontend, Job
from serving.metrics import Metrics
from triage.classes import load_classes


def test_the_chunk_size_rule():
    classes = load_classes()
    assert stream_interval(4, 1, classes, 0.5, None) is None, "the most urgent level: every token"
    assert stream_interval(1, 3, classes, 0.5, None) is None, "setting 1: every call every token"
    assert stream_interval(4, 3, classes, 0.5, None) == 4, "no measurement yet: the setting"
    assert stream_interval(4, 3, classes, 0.5, 0.01) == 4, "a fast engine: the setting"
    assert stream_interval(4, 3, classes, 0.2, 0.05) == 2, "two tokens fit in half of a 0.2 s TPOT"
    assert stream_interval(4, 5, classes, 0.2, 0.1) is None, "one token per chunk: every token"


def _pred(level: int) -> SimpleNamespace:
    return SimpleNamespace(level=level, predicted_level=level, probs=(), length_bucket=0, length_tokens_estimate=16)


class _Backend:
    """One token every 20 ms; records the chunk size each call was given."""

    ready = True
    dead = False

    def __init__(self) -> None:
        self.given: dict[str, int | None] = {}

    async def generate(self, req):
        from serving.engine import TokenEvent

        self.given[req.request_id] = req.stream_interval
        for i in range(req.max_tokens):
            await asyncio.sleep(0.02)
            last = i == req.max_tokens - 1
            yield TokenEvent(req.request_id, "x", [1], 0.0, last, "length" if last else None, 4, i + 1)

    async def abort(self, request_id: str) -> None:
        pass


class _Writer:
    def submit(self, rec) -> None:
        pass

    def accepted(self, request_id, at, row) -> None:   # the journal (serving/db/journal.py)
        pass

    def first_token(self, request_id, at) -> None:
        pass


def test_the_front_end_measures_the_engine_and_sizes_each_calls_chunks():
    async def run() -> tuple[dict, float | None]:
        backend = _Backend()
        fe = Frontend(backend, load_classes(), _Writer(), Metrics(), max_queue=100, max_inflight=10,
                      stream_interval=4)
        await fe.start()

        async def call(rid: str, level: int, tpot: float) -> None:
            job = Job(id=rid, seq=fe.next_seq(), endpoint="chat", prompt="p", prompt_tokens=4, max_tokens=20,
                      prediction=_pred(level), ttft_slo=5.0, tpot_slo=tpot)
            fe.submit(job)
            while not (await job.events.get()).finished:
                pass

        await call("first", 3, 0.1)                    # nothing measured yet: the setting
        await asyncio.gather(call("tight", 3, 0.12), call("tighter", 4, 0.05), call("urgent", 1, 1.0),
                             call("loose", 5, 1.0))
        await fe.stop()
        return backend.given, fe.token_s

    given, token_s = asyncio.run(run())
    assert token_s is not None and 0.015 < token_s < 0.05, token_s
    assert given["first"] == 4 and given["loose"] == 4
    assert given["tight"] in (2, 3), given   # half of 120 ms at ~20-30 ms a token
    assert given["tighter"] is None, "half of 50 ms holds one 20 ms token: every token"
    assert given["urgent"] is None
