"""A blocked event loop is reported with where it was blocked (serving/loop_watchdog.py)."""
from __future__ import annotations

import asyncio
import logging
import time

import pytest

from conftest import Server, make_keys, make_settings
from serving.loop_watchdog import LoopWatchdog


def _hold_the_loop(seconds: float) -> None:   # a synchronous call made on the loop
    time.sleep(seconds)


def test_a_stall_is_logged_once_with_the_blocking_call_and_its_length(caplog):
    seen: list[float] = []

    async def main() -> LoopWatchdog:
        dog = LoopWatchdog(threshold_s=0.3, beat_s=0.05, on_stall=seen.append).start(asyncio.get_running_loop())
        await asyncio.sleep(0.5)          # a loop that runs: nothing reported
        assert not dog.stalls
        _hold_the_loop(1.0)
        await asyncio.sleep(0.3)          # the watchdog sees the loop run again
        await dog.stop()
        return dog

    with caplog.at_level(logging.WARNING, logger="triage.loop"):
        dog = asyncio.run(main())
    assert len(dog.stalls) == 1 and seen == [dog.stalls[0].seconds]
    assert 0.8 <= dog.stalls[0].seconds <= 1.5
    assert "_hold_the_loop" in dog.stalls[0].stack
    warnings = [r.getMessage() for r in caplog.records]
    assert any("blocked for" in m and "_hold_the_loop" in m for m in warnings)
    assert any(m.startswith("event loop was blocked for 1.") or m.startswith("event loop was blocked for 0.9")
               for m in warnings)


def test_bad_thresholds_are_refused():
    with pytest.raises(ValueError):
        LoopWatchdog(threshold_s=0)


def test_the_service_counts_a_blocked_loop_in_its_metrics(sqlite_url, tmp_path, predictors_dir):
    keys = make_keys(sqlite_url)
    s = make_settings(sqlite_url, tmp_path, predictors_dir, loop_stall_warn_s=0.3)
    with Server(s) as srv, srv.client(keys["admin"]) as c:
        srv.state.loop.call_soon_threadsafe(_hold_the_loop, 1.0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = c.get("/metrics").text
            if "triage_event_loop_stall_seconds_count 1.0" in text:
                break
            time.sleep(0.2)
        assert "triage_event_loop_stall_seconds_count 1.0" in text
        assert "_hold_the_loop" in srv.state.watchdog.stalls[0].stack
