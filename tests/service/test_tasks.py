"""Stopping a background task: the service's shutdown neither hangs nor fails on it."""
import asyncio
import logging

import pytest

from serving.tasks import cancel_and_wait


def test_a_running_task_is_cancelled_and_awaited():
    async def main():
        started, cleaned = asyncio.Event(), []

        async def poller():
            started.set()
            try:
                await asyncio.sleep(3600)
            finally:
                cleaned.append(True)

        task = asyncio.create_task(poller())
        await started.wait()
        await asyncio.wait_for(cancel_and_wait(task), timeout=5)
        return task, cleaned

    task, cleaned = asyncio.run(main())
    assert task.cancelled() and cleaned == [True]


def test_a_task_that_had_died_is_logged_by_name_not_raised(caplog):
    async def main():
        async def watcher():
            raise RuntimeError("secret prompt text")

        task = asyncio.create_task(watcher(), name="engine-supervisor")
        await asyncio.sleep(0)
        await cancel_and_wait(task)
        await cancel_and_wait(None)   # nothing started: nothing to stop

    with caplog.at_level(logging.WARNING, logger="serving.tasks"):
        asyncio.run(main())
    assert "engine-supervisor" in caplog.text and "RuntimeError" in caplog.text
    assert "secret prompt text" not in caplog.text


def test_a_cancelled_caller_is_still_cancelled():
    async def main():
        inner_started = asyncio.Event()

        async def stubborn():
            inner_started.set()
            await asyncio.sleep(3600)

        async def stopper(task):
            await cancel_and_wait(task)
            return "finished"

        inner = asyncio.create_task(stubborn())
        await inner_started.wait()
        outer = asyncio.create_task(stopper(inner))
        await asyncio.sleep(0)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer

    asyncio.run(main())
