"""Graceful drain: what `triage serve` does on SIGTERM (and SIGINT).

    serve(app, settings)      # uvicorn with these signal rules, in the main thread

First signal: stop admitting (new generation calls get 503 with `Retry-After`, `/readyz`
turns false so a load balancer stops sending; open streams and queued calls go on), let
every admitted call finish within `drain_timeout_s`, end the rest with a clear error event
(audit outcome `shutdown`, the engine's work aborted), write or spool every audit record,
flush the spool into the database, stop the engine, exit 0.

Second signal: exit now. Calls still open are recorded with outcome `shutdown`; the audit
writer finishes the batch it is writing (whole transactions, whole spool lines) and every
record not yet written goes to the spool file (fsync'd), which the next start replays; the
engine's processes are killed; exit status 1. Nothing is half-written. A batch that does not
finish within 2 s (a database lock, a stalled disk) is not waited for: its transaction dies
with the process, and the journal, which holds every record, gives them to the next start.

Send the signal to the service's main process (systemd's `KillMode=mixed`, Kubernetes):
signalling the whole process group also stops vLLM's engine processes at once, and the
calls in flight cannot finish.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

log = logging.getLogger(__name__)

EXIT_NOW_STATUS = 1


class Drainer:
    """The drain of one app (`app.state`): `await drain()` once; `exit_now()` at any time."""

    def __init__(self, state, timeout_s: float) -> None:
        self.state = state
        self.timeout_s = timeout_s
        self.report: dict | None = None
        self.started: float | None = None

    async def drain(self) -> dict:
        st = self.state
        self.started = time.monotonic()
        st.metrics.draining.set(1)
        fe = st.frontend
        log.warning("draining: admitting nothing new; %d calls in flight get %.0f s to finish",
                    fe.live_jobs, self.timeout_s)
        rep = await fe.drain(self.timeout_s)
        t = time.monotonic()
        synced = await asyncio.to_thread(st.writer.sync, 30.0)
        rep["audit_synced"] = bool(synced)
        rep["audit_sync_s"] = round(time.monotonic() - t, 3)
        rep["audit_spool"] = st.writer.spool_lines()
        log.warning("drained in %.1f s: %d finished, %d cut at the deadline; audit records %s", rep["drain_s"],
                    rep["finished"], rep["cut"], "written or spooled" if synced else "NOT all synced")
        self.report = rep
        return rep

    def exit_now(self) -> None:
        """Runs on the event loop: record what is open, spool the unwritten, exit."""
        st = self.state
        fe = getattr(st, "frontend", None)
        n = 0
        if fe is not None:
            for job in list(fe.jobs.values()):
                job.cut = "shutdown"
                fe._finish(job, "shutdown")
                n += 1
        writer = getattr(st, "writer", None)
        spooled = writer.emergency_spool() if writer is not None else 0
        if spooled is None:
            log.warning("second signal: exiting now (%d open calls recorded as shutdown); the audit writer is stuck "
                        "mid-batch (database or disk stalled), so its records stay in the journal %s, which the "
                        "next start spools and writes", n, writer.journal.path)
        else:
            log.warning("second signal: exiting now (%d open calls recorded as shutdown, %d audit records spooled "
                        "to %s)", n, spooled, writer.spool_path if writer is not None else None)
        _kill_children()
        logging.shutdown()
        os._exit(EXIT_NOW_STATUS)


def _kill_children() -> None:
    try:
        import psutil

        for p in psutil.Process().children(recursive=True):
            try:
                p.kill()
            except psutil.Error:
                pass
    except Exception:   # exiting anyway
        pass


def serve(app, settings, *, log_level: str = "info") -> None:
    """Run `app` under uvicorn with the drain rules above (blocks; main thread)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        drainer: Drainer | None = None

        def handle_exit(self, sig, frame) -> None:   # uvicorn's signal handler, main thread
            loop = getattr(app.state, "loop", None)
            if loop is None or not getattr(app.state, "frontend", None):   # still starting: uvicorn's own rules
                return super().handle_exit(sig, frame)
            if self.drainer is None:
                log.warning("%s: draining (a second signal exits now)", signal.Signals(sig).name)
                self.drainer = Drainer(app.state, settings.drain_timeout_s)
                loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain_then_exit()))
            else:
                loop.call_soon_threadsafe(self.drainer.exit_now)

        async def _drain_then_exit(self) -> None:
            try:
                await self.drainer.drain()
            except Exception:
                log.exception("drain failed; exiting")
            self.should_exit = True   # uvicorn closes connections, then the lifespan stops the rest

    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=10)
    DrainingServer(config).run()
