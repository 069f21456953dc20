"""An operator's change is acknowledged once its audit record is durable."""
from __future__ import annotations

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

# How long an operator's request waits for its audit record: a batch write takes
# milliseconds; a locked SQLite file gives up after its 2-s busy timeout and spools.
RECORD_WAIT_S = 5.0


async def recorded(request: Request) -> bool:
    """Wait until every audit record submitted so far (this change's among them) is written
    to the database or appended, fsync'd, to the outage spool: a 200 then means the change
    and its record survive the process dying. False: not within RECORD_WAIT_S (a database
    that hangs without failing); the change is applied and its record still queued."""
    return await run_in_threadpool(request.app.state.writer.sync, RECORD_WAIT_S)
