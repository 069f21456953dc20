"""The standby engine (serving/engine.py): when the serving engine dies, an engine that is
already started takes over at once and a new standby is built; without one ready the
restart is cold. Engines here are stand-ins for vLLM's AsyncLLM that record their
shutdown (the real engine is killed in test_reliability.py); the auto rule decides when
a service keeps a standby at all."""
from __future__ import annotations

import asyncio

import pytest

from serving.engine import STANDBY_MIN_HOST_GIB, EngineConfig, TriageEngine, standby_enabled


class FakeLLM:
    built = 0

    def __init__(self) -> None:
        FakeLLM.built += 1
        self.name = f"llm{FakeLLM.built}"
        self.errored = False
        self.shut = False

    def shutdown(self) -> None:
        self.shut = True


def _engine(monkeypatch, *, standby: bool, build_s: float = 0.0) -> TriageEngine:
    eng = TriageEngine(EngineConfig(standby=standby, scheduler_cls=None))

    async def build():
        await asyncio.sleep(build_s)
        return FakeLLM()

    monkeypatch.setattr(eng, "_build", build)
    monkeypatch.setattr(eng, "_install", lambda llm: setattr(eng, "_llm", llm))
    monkeypatch.setattr("serving.engine.engine_env", lambda *_: None)
    return eng


async def _until(cond, timeout: float = 2.0) -> None:
    t0 = asyncio.get_running_loop().time()
    while not cond():
        assert asyncio.get_running_loop().time() - t0 < timeout, "timed out"
        await asyncio.sleep(0.005)


def test_a_dead_engine_is_replaced_by_the_ready_standby_and_a_new_one_is_built(monkeypatch):
    async def run():
        eng = _engine(monkeypatch, standby=True)
        await eng.start()
        first = eng._llm
        await _until(lambda: eng.standby_state == "ready")
        spare = eng._standby
        first.errored = True                      # the serving engine died
        assert eng.dead and await eng.restart()
        assert eng._llm is spare and eng.ready and eng.standby_takeovers == 1
        await _until(lambda: first.shut)          # the dead one is shut down in the background
        await _until(lambda: eng.standby_state == "ready")
        assert eng._standby not in (first, spare)
        assert not await eng.restart()            # alive: nothing to do
        await eng.stop()
        assert spare.shut and eng._standby is None

    asyncio.run(run())


def test_without_a_ready_standby_the_restart_is_cold(monkeypatch):
    async def run():
        eng = _engine(monkeypatch, standby=True, build_s=0.2)
        await eng.start()
        first = eng._llm
        assert eng.standby_state == "building"
        first.errored = True                      # dies before the standby is up
        await eng.restart()
        assert eng._llm is not first and first.shut and eng.standby_takeovers == 0
        await _until(lambda: eng.standby_state == "ready")
        standby = eng._standby
        standby.errored = True                    # the standby died while idle
        eng._llm.errored = True
        serving = eng._llm
        await eng.restart()
        assert eng._llm not in (serving, standby) and standby.shut and eng.standby_takeovers == 0
        await eng.stop()

    asyncio.run(run())


def test_a_standby_that_fails_to_start_is_reported_and_serving_goes_on(monkeypatch):
    async def run():
        eng = _engine(monkeypatch, standby=True)
        calls = {"n": 0}
        ok_build = eng._build

        async def build():
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("out of memory")
            return await ok_build()

        monkeypatch.setattr(eng, "_build", build)
        await eng.start()
        await _until(lambda: eng.standby_state == "failed")
        assert eng.ready
        await eng.stop()

    asyncio.run(run())


def test_no_standby_when_not_configured(monkeypatch):
    async def run():
        eng = _engine(monkeypatch, standby=False)
        await eng.start()
        await asyncio.sleep(0.01)
        assert eng.standby_state == "off" and eng._standby is None and eng._standby_task is None
        await eng.stop()

    asyncio.run(run())


@pytest.mark.parametrize("requested,cpu,gib,want", [
    (None, True, STANDBY_MIN_HOST_GIB, True),        # auto: a CPU engine with the memory for a second one
    (None, True, STANDBY_MIN_HOST_GIB - 0.5, False),
    (None, False, 500.0, False),                     # auto never doubles an engine in GPU memory
    (True, False, 1.0, True),                        # the operator's explicit choice wins
    (False, True, 500.0, False),
])
def test_auto_standby_rule(requested, cpu, gib, want):
    assert standby_enabled(requested, cpu=cpu, host_available_gib=gib) is want


def test_the_step_time_learnt_while_the_standby_builds_is_set_aside(monkeypatch):
    """Building a standby takes the CPU from the serving engine; its scheduler would learn
    the build's slowness as the machine's speed and plan the next burst's steps too long.
    What it had learnt before the build is put back when the build ends."""
    from serving.engine import SCHEDULER_CLS
    from triage.estimators import Work
    from triage.profiles import load_profile

    est = load_profile("vllm-cpu-smollm2").estimator("proserve")
    est.learn_shape = True
    for _ in range(40):                         # a normal day: steps as predicted
        est.observe_batch([Work(1, 100)] * 8, est.batch_time([Work(1, 100)] * 8))
    before = est.learnt()

    async def control(op, payload=None):
        if op == "learnt":
            return est.learnt()
        if op == "set_learnt":
            est.set_learnt(payload)
        return {}

    async def run():
        eng = _engine(monkeypatch, standby=True, build_s=0.3)
        eng.config.scheduler_cls = SCHEDULER_CLS
        monkeypatch.setattr(eng, "_control", control)
        await eng.start()
        await asyncio.sleep(0.05)               # the build is under way
        assert eng.standby_state == "building"
        for k in range(40):                     # steps during the build run 3x slower
            works = [Work(1, 100)] * 8 + ([Work(40, 32)] if k % 2 else [])
            est.observe_batch(works, 3 * est.uncorrected_batch_time(works))
        assert est.beta > 2 * before["beta"]
        await _until(lambda: eng.standby_state == "ready")
        assert est.learnt() == before
        await eng.stop()

    asyncio.run(run())
