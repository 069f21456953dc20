"""Event-loop watchdog: says when something blocks the service's event loop, and where.

Every call's classification, queueing, routing and streaming runs on one asyncio loop; a
synchronous call that holds it (a blocking library call, a long pure-Python computation)
stops every stream and every health check at once. A coroutine on the loop beats a
heartbeat every `beat_s`; a daemon thread checks it. When the heartbeat is older than
`threshold_s`, the thread logs one WARNING with the loop thread's Python stack at that
moment (code locations only: no variables, so no prompt text), and when the loop runs
again one line with the stall's length. `triage_event_loop_stall_seconds` counts every
stall; `stalls` keeps the last few (duration, stack) for a debugger or a test.

    dog = LoopWatchdog(threshold_s=1.0, on_stall=metrics.loop_stall.observe)
    dog.start(asyncio.get_running_loop())   # from a coroutine on that loop
    ...
    await dog.stop()
"""
from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("triage.loop")


@dataclass(frozen=True)
class Stall:
    seconds: float
    stack: str        # the loop thread's stack when the stall was first seen


class LoopWatchdog:
    def __init__(self, threshold_s: float = 1.0, beat_s: float = 0.1,
                 on_stall: Callable[[float], None] | None = None, keep: int = 16) -> None:
        if threshold_s <= 0 or beat_s <= 0:
            raise ValueError("threshold_s and beat_s must be positive")
        self.threshold_s, self.beat_s = float(threshold_s), float(beat_s)
        self.on_stall = on_stall
        self.stalls: deque[Stall] = deque(maxlen=keep)
        self._beat = time.monotonic()
        self._loop_thread: int | None = None
        self._task: asyncio.Task | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> "LoopWatchdog":
        self._loop_thread = threading.get_ident()   # called on the loop's own thread
        self._beat = time.monotonic()
        self._task = loop.create_task(self._heart())
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()
        return self

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 2.0)

    async def _heart(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(self.beat_s)

    def _watch(self) -> None:
        stack: str | None = None     # set while a stall is under way
        started = 0.0
        while not self._stop.wait(self.beat_s):
            late = time.monotonic() - self._beat
            if stack is None and late > self.threshold_s + self.beat_s:
                started = self._beat
                frame = sys._current_frames().get(self._loop_thread)
                stack = "".join(traceback.format_stack(frame)) if frame is not None else "(loop thread gone)"
                log.warning("event loop blocked for %.1f s so far; it is running:\n%s", late, stack)
            elif stack is not None and self._beat > started:
                # the loop ran again: the stall lasted from the last beat before it to the first after
                seconds = self._beat - started - self.beat_s
                self.stalls.append(Stall(seconds, stack))
                log.warning("event loop was blocked for %.1f s", seconds)
                if self.on_stall is not None:
                    self.on_stall(seconds)
                stack = None
