"""Stopping the service's background tasks (pollers, watchers, dispatch loops)."""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel `task` and wait until it has ended. At shutdown its end is not the caller's
    to handle: its cancellation is expected, and an error it had already died of is logged
    (by name, never its arguments), not raised. A cancellation of the caller itself still
    propagates."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception as e:  # noqa: BLE001 - the task is gone either way
        log.warning("background task %s had failed: %s", task.get_name(), type(e).__name__)
