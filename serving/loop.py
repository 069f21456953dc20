"""The front-end engine loop: arrival -> predictors -> admission queue -> backend.

    submit(job)            # the arrival buffer takes it at once (seed 004 Alg. 1)
    dispatcher task:       # drains arrivals into the dual heap, sheds past the bound,
                           # hands the most urgent waiting jobs to the backend while it
                           # holds fewer than `max_inflight` (default 512: every call the
                           # engine can hold, so the engine's scheduler is the one place
                           # that orders and preempts; the heap holds only the overflow)
    relabel / set_classes: # re-key the heap now; forward to the backend (its next step)

The dual heap's min side orders by (effective level, predicted output length, arrival);
its max side names the shedding victim: the least urgent waiting job, never level 1.
Every finished job leaves one `requests` row (with TTFT, TPOT, TDG gain, SLO met) and a
hash-chained audit event through the batched writer.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from serving.backends.base import GenRequest, stream_interval
from serving.db.writer import AuditWriter, Record
from serving.metrics import Metrics
from serving.tasks import cancel_and_wait
from triage.classes import ClassError, PriorityClasses
from triage.gain import request_gain
from triage.queue import ArrivalBuffer, DualHeap
from triage.request import Request

log = logging.getLogger(__name__)


class PredictionLike(Protocol):
    level: int
    predicted_level: int
    probs: tuple
    length_bucket: int
    length_tokens_estimate: int


class Classifier(Protocol):
    """What the loop needs of `predictors.service.PredictorService`."""

    async def classify(self, text: str) -> PredictionLike: ...


class Shed(Exception):
    def __init__(self, job: "Job", retry_after: int) -> None:
        super().__init__(f"request {job.id} shed: the admission queue is full of more urgent requests")
        self.job = job
        self.retry_after = retry_after


class NotFound(KeyError):
    pass


class EngineRestarted(Exception):
    """The engine died while this call was generating (or it had been re-queued too often)."""

    def __init__(self, job: "Job") -> None:
        if job.output_tokens:
            msg = (f"the engine restarted while request {job.id} was generating ({job.output_tokens} tokens sent); "
                   "the answer is incomplete: retry the request")
        else:
            msg = (f"the engine died {job.requeues + 1} times while request {job.id} waited for it; "
                   "retry the request later")
        super().__init__(msg)


class ShuttingDown(Exception):
    """The drain deadline passed before this call finished."""

    def __init__(self, job: "Job") -> None:
        super().__init__(f"the server shut down before request {job.id} finished; retry it on another instance")


class Conflict(ValueError):
    pass


@dataclass(eq=False)
class Job:
    id: str
    seq: int
    endpoint: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    prediction: PredictionLike | None
    ttft_slo: float
    tpot_slo: float
    key_id: str | None = None
    client_request_id: str | None = None
    model: str | None = None
    override_level: int | None = None
    custom_slo: bool = False
    params: dict = field(default_factory=dict)
    arrival: float = field(default_factory=time.time)
    dispatched: float | None = None
    token_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    preemptions: int = 0
    finish_reason: str | None = None
    stage: str = "queued"   # queued | running | done
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    task: asyncio.Task | None = None
    store_prompt: bool = False
    requeues: int = 0               # times re-queued after an engine death
    cancelled: bool = False         # the client went away (outcome `cancelled`)
    cut: str | None = None          # why the service ended it early (`shutdown`)
    on_finish: Any = None   # called once when the job ends however it ends (the key's concurrency slot)
    # the first words of the caller's message, for operators on the live queue: held in
    # memory while the request lives, never stored or logged (serving/console/live.py)
    preview: str = ""

    @property
    def predicted_level(self) -> int | None:
        return self.prediction.level if self.prediction is not None else None

    @property
    def level(self) -> int:
        if self.override_level is not None:
            return self.override_level
        return self.prediction.level

    @property
    def predicted_output_len(self) -> int:
        est = self.prediction.length_tokens_estimate if self.prediction is not None else self.max_tokens
        return max(1, min(int(est), self.max_tokens))

    def triage(self) -> dict:
        return {"level": self.level, "predicted_level": self.predicted_level, "request_id": self.id}


def new_request_id() -> str:
    return "req-" + uuid.uuid4().hex[:20]


class Frontend:
    def __init__(self, backend, classes: PriorityClasses, writer: AuditWriter, metrics: Metrics, *,
                 max_queue: int, max_inflight: int, retry_after_s: int = 2, max_requeues: int = 2,
                 escalate_below: float | None = None, stream_interval: int = 1) -> None:
        self.backend = backend
        self.classes = classes
        self.escalate_below = escalate_below   # the urgency model's threshold in force (versioned with the classes)
        self.writer = writer
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_inflight = max_inflight
        self.retry_after_s = retry_after_s
        self.max_requeues = max_requeues        # re-queues of one call after engine deaths
        self.stream_interval = stream_interval  # tokens a chunk below the most urgent level (setting)
        # the engine's time a token, as the streams see it: a moving average over every
        # decoded chunk (its interval / its tokens); caps the chunks (backends.base.stream_interval)
        self.token_s: float | None = None
        self.draining = False                   # SIGTERM: admit nothing new (serving/drain.py)
        self.arrivals: ArrivalBuffer[Job] = ArrivalBuffer()
        self.queue: DualHeap[Job] = DualHeap(key=lambda j: (j.level, j.predicted_output_len))
        self.running: dict[str, Job] = {}
        self.jobs: dict[str, Job] = {}
        self._seq = itertools.count(1)
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._task = asyncio.create_task(self._dispatch_loop(), name="triage-dispatcher")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        for job in list(self.running.values()):
            if job.task:
                job.task.cancel()
        for job in list(self.queue):
            self._finish(job, "aborted")

    def next_seq(self) -> int:
        return next(self._seq)

    def wake(self) -> None:
        """Look at the queue again (the engine is back after a restart)."""
        self._wake.set()

    # --- drain (serving/drain.py) ----------------------------------------------------------
    @property
    def live_jobs(self) -> int:
        """Calls admitted and not finished: queued, waiting to be classified, or running."""
        return len(self.jobs)

    async def drain(self, timeout_s: float) -> dict:
        """Stop admitting, let every admitted call finish within `timeout_s`, then end the
        rest with a clear error (outcome `shutdown`; the engine's work is aborted)."""
        self.draining = True
        t0 = time.monotonic()
        before = self.live_jobs
        while self.jobs and time.monotonic() - t0 < timeout_s:
            await asyncio.sleep(0.05)
        cut = list(self.jobs.values())
        for job in cut:
            job.cut = "shutdown"
            job.events.put_nowait(ShuttingDown(job))
            if job.stage == "running" and job.task is not None:
                try:
                    await self.backend.abort(job.id)
                except Exception as e:   # the engine may be gone already
                    log.warning("abort of %s during shutdown failed: %s", job.id, e)
                job.task.cancel()
            else:
                if job.id in self.queue:
                    self.queue.remove(job.id)
                self._finish(job, "shutdown")
        for job in cut:
            if job.task is not None:
                try:
                    await job.task
                except (asyncio.CancelledError, Exception):
                    pass
        return {"in_flight": before, "finished": before - len(cut), "cut": len(cut),
                "drain_s": round(time.monotonic() - t0, 3)}

    def slo_for(self, level: int) -> tuple[float, float]:
        c = self.classes.get(level)
        return c.ttft, c.tpot

    # --- arrival ---------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        self.writer.accepted(job.id, job.arrival, self._audit_row(job, "interrupted", None))
        self.jobs[job.id] = job
        self.arrivals.append(job)
        self._wake.set()

    async def cancel(self, job: Job) -> None:
        """The client went away: drop it wherever it is."""
        if job.stage == "done":
            return
        job.cancelled = True
        if job.stage == "queued":
            if job.id in self.queue:
                self.queue.remove(job.id)
            # else: still in the arrival buffer, which the dispatcher drains later: it is
            # finished here and skipped there (`stage == "done"`), never handed to the engine
            self._finish(job, "cancelled")
        elif job.stage == "running":
            # Cancelling the job's task ends its generate() wherever it is: vLLM's generate
            # aborts the engine request on cancellation, also when the request was not yet
            # added (an abort by id alone is a no-op then, and the request ran to its end
            # with nobody reading: seen with 1,000 clients vanishing at once).
            if job.task is not None:
                job.task.cancel()
            try:
                await self.backend.abort(job.id)
            except Exception as e:   # the engine is down (restarting): nothing runs there to abort
                log.warning("abort of %s failed: %s", job.id, e)

    # --- dispatcher ------------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self._admit_and_dispatch()
            except Exception:   # never let the dispatcher die silently
                log.exception("dispatcher step failed")

    def _admit_and_dispatch(self) -> None:
        self.arrivals.drain_into(self.queue)
        self._shed()
        # nothing is handed to an engine that is down or restarting: calls wait in the queue
        while self.queue and len(self.running) < self.max_inflight and self.backend.ready:
            job = self.queue.pop_min()
            if job.stage == "done":   # ended while still in the arrival buffer (drain deadline)
                continue
            self._start(job)
        self._gauge()

    def _shed(self) -> None:
        while len(self.queue) > self.max_queue:
            victim = self.queue.peek_max()
            if victim is None or victim.level <= self.classes.most_urgent:
                return   # never shed level 1: the queue may exceed its bound by level-1 jobs only
            self.queue.remove(victim.id)
            self.metrics.shed.labels(str(victim.level)).inc()
            log.warning("shed request %s (level %d): queue over %d", victim.id, victim.level, self.max_queue)
            victim.events.put_nowait(Shed(victim, self.retry_after_s))
            self._finish(victim, "shed")

    def _gauge(self) -> None:
        counts: dict[int, int] = {lv: 0 for lv in self.classes.levels}
        for j in self.queue:
            counts[j.level] = counts.get(j.level, 0) + 1
        for lv, n in counts.items():
            self.metrics.queue_depth.labels(str(lv)).set(n)
        run: dict[int, int] = {lv: 0 for lv in self.classes.levels}
        for j in self.running.values():
            run[j.level] = run.get(j.level, 0) + 1
        for lv, n in run.items():
            self.metrics.inflight.labels(str(lv)).set(n)

    def _start(self, job: Job) -> None:
        job.stage = "running"
        job.dispatched = time.time()
        self.metrics.queue_time.labels(str(job.level)).observe(job.dispatched - job.arrival)
        self.running[job.id] = job
        job.task = asyncio.create_task(self._run(job), name=f"job-{job.id}")

    async def _run(self, job: Job) -> None:
        outcome = "error"
        try:
            req = GenRequest(request_id=job.id, prompt=job.prompt, max_tokens=job.max_tokens, level=job.level,
                             ttft_slo=job.ttft_slo, tpot_slo=job.tpot_slo, predicted_output_len=job.predicted_output_len,
                             arrival=job.arrival, prompt_tokens=job.prompt_tokens, sampling=dict(job.params),
                             stream_interval=stream_interval(self.stream_interval, job.level, self.classes,
                                                             job.tpot_slo, self.token_s))
            async for ev in self.backend.generate(req):
                now = time.time()
                new = max(0, (ev.output_tokens or job.output_tokens + len(ev.token_ids)) - job.output_tokens)
                if new and job.token_times:   # a decoded chunk: new tokens since the last one
                    per_token = (now - job.token_times[-1]) / new
                    self.token_s = per_token if self.token_s is None else 0.95 * self.token_s + 0.05 * per_token
                if new:
                    if not job.token_times:
                        self.writer.first_token(job.id, now)
                    job.token_times.extend([now] * new)
                    job.output_tokens += new
                if ev.prompt_tokens:
                    job.prompt_tokens = ev.prompt_tokens
                job.preemptions = max(job.preemptions, getattr(ev, "preemptions", 0) or 0)
                job.events.put_nowait(ev)
                if ev.finished:
                    job.finish_reason = ev.finish_reason
                    outcome = "aborted" if ev.finish_reason == "abort" else ("length" if ev.finish_reason == "length" else "ok")
                    break
            else:
                outcome = "aborted"
        except asyncio.CancelledError:
            outcome = "aborted"
            raise
        except Exception as e:
            if self._engine_failure(e):
                outcome = self._after_engine_death(job)
            else:
                log.exception("backend failed on request %s", job.id)
                job.events.put_nowait(e)
        finally:
            self.running.pop(job.id, None)
            if outcome == "aborted" and (job.cut or job.cancelled):
                outcome = job.cut or "cancelled"
            if outcome == "requeued":
                self._requeue(job)
            else:
                self._finish(job, outcome)
            self._wake.set()

    # --- engine deaths (serving/supervisor.py restarts the engine) ---------------------------
    def _engine_failure(self, e: Exception) -> bool:
        test = getattr(self.backend, "is_engine_failure", None)
        return bool(test and test(e)) or bool(getattr(self.backend, "dead", False))

    def _after_engine_death(self, job: Job) -> str:
        """A call that had streamed nothing goes back to the queue (served after the
        restart, at most `max_requeues` times); one cut mid-stream ends with a clear error."""
        if job.output_tokens == 0 and not job.cancelled and not job.cut and job.requeues < self.max_requeues:
            return "requeued"
        log.warning("request %s ended by an engine death after %d tokens", job.id, job.output_tokens)
        job.events.put_nowait(EngineRestarted(job))
        return "engine_restart"

    def _requeue(self, job: Job) -> None:
        job.requeues += 1
        job.stage = "queued"
        job.dispatched = None
        job.task = None
        job.token_times.clear()
        job.preemptions = 0
        self.queue.push(job)
        self.metrics.requeued.inc()
        log.info("request %s re-queued after an engine death (%d)", job.id, job.requeues)

    # --- operators -------------------------------------------------------------------------
    async def relabel(self, rid: str, level: int, actor: str, reason: str) -> dict:
        job = self.jobs.get(rid)
        if job is None:
            raise NotFound(rid)
        if job.stage == "done":
            raise Conflict(f"request {rid} has finished; only waiting or running requests can be relabelled")
        c = self.classes.get(level)   # ClassError -> 400
        before = job.level
        stage = job.stage
        job.override_level = level
        if not job.custom_slo:
            job.ttft_slo, job.tpot_slo = c.ttft, c.tpot
        if job.id in self.queue:
            self.queue.rekey(job.id)
        elif stage == "running":
            await self.backend.relabel(job.id, level)
        self.metrics.relabels.labels(str(level)).inc()
        now = time.time()
        row = {"request_id": rid, "actor": actor, "at": now, "from_level": before, "to_level": level,
               "reason": reason, "stage": stage}
        self.writer.submit(Record("relabel", now, actor, rid, {"from": before, "to": level, "stage": stage},
                                  "relabels", [row]))
        self._gauge()
        self._wake.set()
        return {"request_id": rid, "from_level": before, "to_level": level, "stage": stage,
                "position": self.position(rid)}

    def position(self, rid: str) -> int | None:
        for i, j in enumerate(self.queue.ordered()):
            if j.id == rid:
                return i
        return None

    async def set_classes(self, classes: PriorityClasses, actor: str, *, escalate_below: Any = "keep",
                          reason: str | None = None) -> PriorityClasses:
        levels_in_use = {j.level for j in self.jobs.values() if j.stage != "done"}
        missing = levels_in_use - set(classes.levels)
        if missing:
            raise ClassError(f"levels {sorted(missing)} are in use by live requests")
        self.classes = classes
        if escalate_below != "keep":
            self.escalate_below = escalate_below
        for j in self.jobs.values():
            if j.stage != "done" and not j.custom_slo:
                c = classes.get(j.level)
                j.ttft_slo, j.tpot_slo = c.ttft, c.tpot
        self.queue.rekey_all()
        await self.backend.set_classes(classes)
        now = time.time()
        rows = [{"version": classes.version, "level": c["level"], "name": c["name"], "weight": c["weight"],
                 "ttft": c["ttft"], "tpot": c["tpot"], "w_first": classes.w_first, "w_decode": classes.w_decode,
                 "actor": actor, "created": now, "escalate_below": self.escalate_below, "reason": reason}
                for c in classes.to_dict()["classes"]]
        payload = {**classes.to_dict(), "escalate_below": self.escalate_below, "reason": reason}
        self.writer.submit(Record("classes.updated", now, actor, None, payload, "priority_classes", rows))
        self._gauge()
        self._wake.set()
        return classes

    def snapshot(self) -> dict[str, Any]:
        by: dict[str, list] = {str(lv): [] for lv in self.classes.levels}
        now = time.time()
        for pos, j in enumerate(self.queue.ordered()):
            by.setdefault(str(j.level), []).append(
                {"request_id": j.id, "position": pos, "predicted_level": j.predicted_level,
                 "override_level": j.override_level, "waited_s": round(now - j.arrival, 3),
                 "prompt_tokens": j.prompt_tokens, "predicted_output_len": j.predicted_output_len})
        running = [{"request_id": j.id, "level": j.level, "predicted_level": j.predicted_level,
                    "output_tokens": j.output_tokens, "max_tokens": j.max_tokens} for j in self.running.values()]
        return {"waiting": sum(len(v) for v in by.values()), "running": len(running), "max_queue": self.max_queue,
                "max_inflight": self.max_inflight, "classes_version": self.classes.version,
                "by_level": by, "running_requests": running, "backend": self.backend.step_stats()}

    # --- bookkeeping -----------------------------------------------------------------------
    def _finish(self, job: Job, outcome: str) -> None:
        if job.stage == "done":
            return
        job.stage = "done"
        self.jobs.pop(job.id, None)
        if job.on_finish is not None:
            job.on_finish()
        lv = str(job.level)
        self.metrics.requests.labels(lv, outcome).inc()
        finish = job.token_times[-1] if job.token_times else time.time()
        r = Request(id=job.id, arrival=job.arrival, prompt_len=job.prompt_tokens,
                    predicted_level=job.predicted_level or job.level, ttft_slo=job.ttft_slo, tpot_slo=job.tpot_slo,
                    override_level=job.override_level,
                    output_len=job.output_tokens if outcome in ("ok", "length") else job.max_tokens)
        r.token_times = list(job.token_times)
        g = request_gain(r, self.classes) if job.level in self.classes.classes else None
        tp = r.tpots
        if r.ttft is not None:
            self.metrics.ttft.labels(lv).observe(r.ttft)
        tpot = self.metrics.tpot.labels(lv)
        for x in tp:
            tpot.observe(x)
        instance = (self.backend.instance_for(job.id) if hasattr(self.backend, "instance_for")   # (forgets it)
                    else getattr(self.backend, "instance", None))
        row = self._audit_row(job, outcome, finish, instance, r.ttft, tp, g)
        self.writer.submit(Record("request.finished", time.time(), None, job.id,
                                  {"level": job.level, "outcome": outcome}, "requests", [row]))

    def _audit_row(self, job: Job, outcome: str, finish: float | None, instance: str | None = None,
                   ttft: float | None = None, tp: list[float] | None = None, g=None) -> dict:
        """The request's `requests` row. At admission (`submit`) the writer's journal keeps
        it as it stands then, for the next start to record should this process die first."""
        tp = tp or []
        return {
            "id": job.id, "client_request_id": job.client_request_id, "api_key_id": job.key_id,
            "endpoint": job.endpoint, "model": job.model,
            "classifier_level": job.prediction.predicted_level if job.prediction is not None else None,
            "predicted_level": job.predicted_level, "override_level": job.override_level,
            "effective_level": job.level, "ttft_slo": job.ttft_slo, "tpot_slo": job.tpot_slo,
            "classes_version": self.classes.version, "arrival": job.arrival, "dispatched": job.dispatched,
            "first_token": job.token_times[0] if job.token_times else None,
            "finish": finish, "prompt_tokens": job.prompt_tokens, "output_tokens": job.output_tokens,
            "max_tokens": job.max_tokens, "predicted_output_len": job.predicted_output_len,
            "queue_time": (job.dispatched - job.arrival) if job.dispatched else None,
            "ttft": ttft, "max_tpot": max(tp) if tp else None, "mean_tpot": (sum(tp) / len(tp)) if tp else None,
            "tdg_gain": g.gain if g else None, "tdg_ideal": g.ideal if g else None,
            "slo_met": bool(g.slo_met) if g else False, "preemptions": job.preemptions,
            "instance": instance, "outcome": outcome, "prompt": job.prompt if job.store_prompt else None,
        }
