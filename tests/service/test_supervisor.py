"""The engine supervisor's rules (serving/supervisor.py): restart at once, back off after
failures, count a crash loop as failing, give up liveness after N failures in a row and
regain it after a stable spell. The backend here is a small stand-in whose engine dies and
whose restarts fail on demand (the real engine is killed in test_reliability.py)."""
from __future__ import annotations

import asyncio

from serving.metrics import Metrics
from serving.supervisor import EngineSupervisor, RestartLimits


class FlakyBackend:
    def __init__(self, failing_restarts: int = 0) -> None:
        self.dead = False
        self.failing = failing_restarts
        self.attempts = 0

    async def restart(self) -> None:
        self.attempts += 1
        await asyncio.sleep(0.01)
        if self.failing:
            self.failing -= 1
            raise RuntimeError("the engine would not start")
        self.dead = False


def _count(m: Metrics, result: str) -> float:
    return m.registry.get_sample_value("triage_engine_restarts_total", {"result": result}) or 0.0


def test_backoff_doubles_up_to_its_cap():
    lim = RestartLimits(backoff_s=1.0, backoff_max_s=5.0)
    assert [lim.delay(n) for n in range(6)] == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_failed_restarts_end_liveness_until_the_engine_stays_up():
    async def run():
        m = Metrics()
        be = FlakyBackend(failing_restarts=3)
        ups = []
        sup = EngineSupervisor(be, m, RestartLimits(backoff_s=0.01, backoff_max_s=0.02, stable_s=0.5,
                                                    max_failed_restarts=2, check_interval_s=0.01),
                               on_up=lambda: ups.append(1)).start()
        await asyncio.sleep(0.05)
        assert sup.live and sup.state == "up" and be.attempts == 0
        be.dead = True
        seen_dead_liveness = False
        for _ in range(300):
            await asyncio.sleep(0.01)
            seen_dead_liveness |= not sup.live
            if sup.state == "up" and be.attempts == 4:
                break
        assert be.attempts == 4 and sup.state == "up" and ups == [1]
        assert seen_dead_liveness and not sup.live          # 3 failures >= 2: still not live right after
        assert m.registry.get_sample_value("triage_engine_up") == 1
        assert _count(m, "failed") == 3 and _count(m, "ok") == 1
        await asyncio.sleep(0.7)                              # up for stable_s: the count clears
        assert sup.live and sup.failures == 0
        await sup.stop()

    asyncio.run(run())


def test_a_crash_loop_counts_as_failing():
    async def run():
        m = Metrics()
        be = FlakyBackend()
        sup = EngineSupervisor(be, m, RestartLimits(backoff_s=0.01, backoff_max_s=0.01, stable_s=60,
                                                    max_failed_restarts=3, check_interval_s=0.01)).start()
        for death in range(4):
            be.dead = True
            for _ in range(200):
                await asyncio.sleep(0.01)
                if not be.dead and sup.state == "up":
                    break
        assert sup.restarts == 4 and sup.deaths == 4
        assert sup.failures == 3 and not sup.live            # restarts that did not hold for stable_s
        assert _count(m, "ok") == 4 and _count(m, "failed") == 0
        await sup.stop()

    asyncio.run(run())


def test_healthz_fails_only_when_restarts_keep_failing(service):
    """The server's liveness follows the supervisor: a restart in progress is alive."""
    c = service.client()
    assert c.get("/healthz").status_code == 200
    sup = EngineSupervisor(FlakyBackend(), service.state.metrics, RestartLimits(max_failed_restarts=2))
    service.state.supervisor = sup
    try:
        sup.state = "restarting"
        assert c.get("/healthz").status_code == 200
        sup.failures = 2
        r = c.get("/healthz")
        assert r.status_code == 503 and r.json()["engine"]["failed_restarts_in_a_row"] == 2
    finally:
        del service.state.supervisor
