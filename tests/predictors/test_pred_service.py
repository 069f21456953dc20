"""PredictorService: micro-batching strategies, results, errors, shutdown."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from predictors.service import Prediction, PredictorService


class FakePredictor:
    """Records batch sizes; takes `delay` seconds per batch."""

    def __init__(self, delay: float = 0.0, fail_on: str | None = None):
        self.delay, self.fail_on = delay, fail_on
        self.batches: list[list[str]] = []
        self.threads: set[str] = set()

    def predict(self, texts):
        self.threads.add(threading.current_thread().name)
        if self.fail_on is not None and self.fail_on in texts:
            raise ValueError("boom")
        if texts != ["warm-up"]:
            self.batches.append(list(texts))
        time.sleep(self.delay)
        return [Prediction(3, 3, (0.1, 0.1, 0.6, 0.1, 0.1), 1, 90) for _ in texts]


def run(coro):
    return asyncio.run(coro)


def test_immediate_runs_single_request_at_once():
    async def main():
        fake = FakePredictor()
        async with PredictorService(fake, strategy="immediate", max_batch=8, max_wait_ms=500) as svc:
            t0 = time.perf_counter()
            await svc.classify("a")
            return time.perf_counter() - t0, fake

    dt, fake = run(main())
    assert dt < 0.2  # does not wait for max_wait_ms
    assert fake.batches == [["a"]]
    assert fake.threads == {"triage-predictor"}


def test_immediate_batches_what_queued_while_busy():
    async def main():
        fake = FakePredictor(delay=0.05)
        async with PredictorService(fake, strategy="immediate", max_batch=8) as svc:
            res = await svc.classify_many([f"t{i}" for i in range(20)])
        return res, fake

    res, fake = run(main())
    assert len(res) == 20 and all(isinstance(r, Prediction) for r in res)
    assert max(len(b) for b in fake.batches) <= 8
    assert len(fake.batches) < 20  # micro-batched
    assert sorted(t for b in fake.batches for t in b) == sorted(f"t{i}" for i in range(20))


def test_full_batching_waits_for_max_wait_then_runs_partial_batch():
    async def main():
        fake = FakePredictor()
        async with PredictorService(fake, strategy="full", max_batch=8, max_wait_ms=150) as svc:
            t0 = time.perf_counter()
            await svc.classify("only")
            dt = time.perf_counter() - t0
        return dt, fake

    dt, fake = run(main())
    assert 0.14 <= dt < 1.0
    assert fake.batches == [["only"]]


def test_full_batching_runs_as_soon_as_batch_is_full():
    async def main():
        fake = FakePredictor()
        async with PredictorService(fake, strategy="full", max_batch=4, max_wait_ms=5000) as svc:
            t0 = time.perf_counter()
            await svc.classify_many(["a", "b", "c", "d"])
            dt = time.perf_counter() - t0
        return dt, fake

    dt, fake = run(main())
    assert dt < 1.0
    assert fake.batches == [["a", "b", "c", "d"]]


def test_errors_reach_the_caller_and_worker_survives():
    async def main():
        fake = FakePredictor(fail_on="bad")
        async with PredictorService(fake, strategy="immediate") as svc:
            with pytest.raises(ValueError, match="boom"):
                await svc.classify("bad")
            return await svc.classify("good")

    assert run(main()).level == 3


def test_classify_before_start_is_an_error():
    async def main():
        svc = PredictorService(FakePredictor())
        with pytest.raises(RuntimeError, match="start"):
            await svc.classify("x")

    run(main())


def test_bad_arguments():
    with pytest.raises(ValueError):
        PredictorService(FakePredictor(), strategy="eager")
    with pytest.raises(ValueError):
        PredictorService(FakePredictor(), max_batch=0)


def test_missing_models_surface_from_start(tmp_path):
    from predictors.model import ModelMissing

    async def main():
        svc = PredictorService(urgency_dir=tmp_path / "u", length_dir=tmp_path / "l")
        with pytest.raises(ModelMissing):
            await svc.start()

    run(main())


@pytest.mark.parametrize("strategy", ["immediate", "full"])
def test_real_models_both_strategies_match_sync(predictor, strategy):
    texts = ["my husband is not breathing and has no pulse", "need a refill of my blood pressure pills",
             "abd pain, age 67, SBP 85 DBP 50 HR 110 RR 22 BT 36.8, mental: alert", ""]

    async def main():
        async with PredictorService(predictor, strategy=strategy, max_batch=4, max_wait_ms=20) as svc:
            return await svc.classify_many(texts), svc.stats

    got, stats = run(main())
    assert got == predictor.predict(texts)
    assert stats.requests == len(texts)
    assert got[2].level <= 2  # SBP 85: ESI danger zone


def test_event_loop_not_blocked(predictor):
    async def main():
        async with PredictorService(predictor, strategy="immediate") as svc:
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.001)

            task = asyncio.create_task(ticker())
            await svc.classify_many(["chest pain, age 70"] * 64)
            task.cancel()
            return ticks

    assert run(main()) > 5


def _corpus_texts():
    from predictors.corpus import load_corpus

    test = load_corpus("test")
    chat = [r["text"] for r in test if r.get("kind") != "dispatch"][:40]
    esi1 = [r["text"] for r in test if r.get("kind") == "dispatch" and r["level"] == 1][:3]
    return chat, esi1


@pytest.mark.parametrize("hint", [True, False])
def test_a_spike_is_classified_probably_urgent_first(hint):
    """40 chat prompts queue behind a busy classifier, then 3 ESI-1 dispatch calls arrive:
    with the queue hint (opt-in) the ESI-1 calls are classified next (those it ranks
    most urgent alone, in a quick batch), so their level is known ~one batch after they
    arrive; without it they wait for all 40."""
    chat, esi1 = _corpus_texts()

    async def main():
        fake = FakePredictor(delay=0.05)
        async with PredictorService(fake, strategy="immediate", max_batch=8, queue_hint=hint) as svc:
            first = asyncio.ensure_future(svc.classify("blocker"))
            await asyncio.sleep(0.01)              # the worker is busy with it
            rest = [asyncio.ensure_future(svc.classify(t)) for t in chat + esi1]
            await asyncio.gather(first, *rest)
            return fake, svc.stats

    fake, stats = run(main())
    where = [next(i for i, b in enumerate(fake.batches) if t in b) for t in esi1]
    assert sorted(t for b in fake.batches for t in b) == sorted(["blocker", *chat, *esi1])   # nothing lost
    if hint:
        # the probable ESI-1 texts alone in the next (quick) batch, any the hint ranked lower right after
        assert max(where) <= 2 and set(fake.batches[1]) <= set(esi1) and stats.reordered >= 1
    else:
        assert min(where) == len(fake.batches) - 1 and stats.reordered == 0


def test_a_spike_learns_its_first_levels_after_a_small_batch():
    """The int8 classifier runs one text per pass, and a batch's levels come back together
    when its last text is done: so by default a batch takes at most 4 texts, and the first
    calls of a spike of 40 know their level while most of the spike still waits, not after
    a batch of 32 (the burst on a slow 2-core VM: 0.6-0.9 s a batch of 32)."""

    async def main():
        fake = FakePredictor(delay=0.02)
        async with PredictorService(fake, strategy="immediate") as svc:
            first = asyncio.ensure_future(svc.classify("blocker"))
            await asyncio.sleep(0.01)              # the worker is busy with it
            spike = [asyncio.ensure_future(svc.classify(f"call {i}")) for i in range(40)]
            pending_when_first_known: list[int] = []
            spike[0].add_done_callback(lambda _: pending_when_first_known.append(sum(not f.done() for f in spike)))
            await asyncio.gather(first, *spike)
            return fake, pending_when_first_known

    fake, pending = run(main())
    assert sorted(t for b in fake.batches for t in b) == sorted(["blocker", *(f"call {i}" for i in range(40))])
    assert max(len(b) for b in fake.batches) == 4
    assert pending and pending[0] >= 30
