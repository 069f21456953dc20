"""Engine supervision: restart the engine when it dies, with backoff, and say when to give up.

    sup = EngineSupervisor(backend, metrics, RestartLimits.from_settings(s), on_up=frontend.wake)
    sup.start()      # a task that looks at `backend.dead` every `check_interval_s`
    sup.state        # "up" | "restarting"
    sup.live         # False after `max_failed_restarts` failed restarts in a row: /healthz fails

When the engine dies (its core process killed or out of memory, or `EngineDeadError`), the
front end keeps admitting calls into its queue and hands the engine nothing (`backend.ready`
is false, so `/readyz` is false); calls that were in the engine and had streamed nothing
are re-queued by the front end (serving/loop.py). The supervisor shuts the dead engine down
and starts a new one at once. A restart *fails* when the new engine does not start (an
error, or not within `start_timeout_s`) or dies again within `stable_s` of coming up;
after a failure the next attempt waits `backoff_s`, doubling up to `backoff_max_s`. An
engine that stays up `stable_s` clears the count. After `max_failed_restarts` failures in a
row the service is no longer live (`/healthz` 503) so that an outside supervisor (systemd,
Kubernetes) restarts the whole process; this one keeps trying meanwhile.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

from serving.tasks import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartLimits:
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    start_timeout_s: float = 300.0
    stable_s: float = 60.0
    max_failed_restarts: int = 3
    check_interval_s: float = 0.25

    @classmethod
    def from_settings(cls, s) -> "RestartLimits":
        return cls(backoff_s=s.engine_restart_backoff_s, backoff_max_s=s.engine_restart_backoff_max_s,
                   start_timeout_s=s.engine_start_timeout_s, stable_s=s.engine_stable_s,
                   max_failed_restarts=s.engine_max_failed_restarts, check_interval_s=s.engine_check_interval_s)

    def delay(self, failures: int) -> float:
        """Wait before the next attempt after `failures` failed restarts in a row."""
        return 0.0 if failures <= 0 else min(self.backoff_max_s, self.backoff_s * 2 ** (failures - 1))


class EngineSupervisor:
    def __init__(self, backend, metrics, limits: RestartLimits, *, on_up: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.metrics = metrics
        self.limits = limits
        self.on_up = on_up
        self.clock = clock
        self.state = "up"
        self.failures = 0            # failed restarts in a row
        self.restarts = 0            # successful restarts
        self.deaths = 0
        self.last_up = clock()
        self.last_restart_s: float | None = None   # death -> serving again, of the last restart
        self._task: asyncio.Task | None = None

    @property
    def live(self) -> bool:
        """False once restarts keep failing: the process should be restarted from outside."""
        return self.failures < self.limits.max_failed_restarts

    def status(self) -> dict:
        return {"state": self.state, "restarts": self.restarts, "deaths": self.deaths,
                "failed_restarts_in_a_row": self.failures, "last_restart_s": self.last_restart_s}

    def start(self) -> "EngineSupervisor":
        self._task = asyncio.create_task(self._watch(), name="engine-supervisor")
        return self

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.limits.check_interval_s)
            try:
                if self.backend.dead:
                    await self._recover()
                elif self.failures and self.clock() - self.last_up >= self.limits.stable_s:
                    log.info("engine up for %.0f s: the failed-restart count is cleared", self.limits.stable_s)
                    self.failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:   # the watcher must outlive anything a restart throws
                log.exception("engine supervisor step failed")

    async def _recover(self) -> None:
        died = self.clock()
        self.deaths += 1
        self.state = "restarting"
        self.metrics.engine_up.set(0)
        if self.restarts and died - self.last_up < self.limits.stable_s:
            self.failures += 1   # the last restart did not hold: a crash loop counts as failing
            self._say_if_given_up()
        log.error("the engine died (death %d); restarting it", self.deaths)
        while True:
            wait = self.limits.delay(self.failures)
            if wait:
                log.warning("next engine restart in %.1f s (%d failed in a row)", wait, self.failures)
                await asyncio.sleep(wait)
            t0 = self.clock()
            try:
                await asyncio.wait_for(self.backend.restart(), self.limits.start_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.failures += 1
                self.metrics.engine_restarts.labels("failed").inc()
                log.error("engine restart failed after %.1f s: %s: %s", self.clock() - t0, type(e).__name__, e)
                self._say_if_given_up()
                continue
            break
        now = self.clock()
        self.restarts += 1
        self.state = "up"
        self.last_up = now
        self.last_restart_s = now - died
        self.metrics.engine_restarts.labels("ok").inc()
        self.metrics.engine_restart_seconds.observe(self.last_restart_s)
        self.metrics.engine_up.set(1)
        log.warning("engine back after %.1f s (restart %d)", self.last_restart_s, self.restarts)
        self.on_up()

    def _say_if_given_up(self) -> None:
        if self.failures == self.limits.max_failed_restarts:
            log.critical("%d engine restarts failed in a row: /healthz now fails so that an outside supervisor "
                         "restarts the service (this one keeps trying)", self.failures)
