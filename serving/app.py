"""The FastAPI application: `create_app(settings)`; everything starts in the lifespan.

Start-up order: database schema (alembic upgrade head) -> keys (first start: one admin
and one client key, printed once on stdout) -> class table (latest version in the
database, else data/priority_classes.toml as version 1) -> audit writer -> predictors
-> backend -> front-end loop. Shutdown runs it backwards and drains the writer.
"""
from __future__ import annotations

import logging
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving.api.errors import APIError, error_response
from serving.auth import AuthError
from serving.settings import Settings

log = logging.getLogger("serving")

class BodyLimit:
    """Pure ASGI middleware: refuse bodies over `limit` bytes with 413 (header or stream)."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length" and v.isdigit() and int(v) > self.limit:
                return await error_response(413, f"request body over {self.limit} bytes")(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge()
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await error_response(413, f"request body over {self.limit} bytes")(scope, receive, send)


class _TooLarge(Exception):
    pass


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errs = exc.errors()
    if not errs:
        return "invalid request", None
    e = errs[0]
    if e.get("type") == "json_invalid":
        return "malformed JSON body", None
    loc = [str(x) for x in e.get("loc", []) if x != "body"]
    param = ".".join(loc) or None
    if e.get("type") == "extra_forbidden":
        return f"unknown field {param!r}", param
    if e.get("type") == "missing" and not loc:
        return "a JSON body is required", None
    msg = e.get("msg", "invalid value")
    return (f"{param}: {msg}" if param else msg), param


def create_app(settings: Settings | None = None, *, predictor: Any = None, engine: Any = None) -> FastAPI:
    """Build the app. `predictor` replaces the real PredictorService (unit tests only);
    `engine` shares one TriageEngine between apps (the vllm backend; tests)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        s = app.state.settings = settings or Settings()
        await _startup(app, s, predictor, engine)
        try:
            yield
        finally:
            await _shutdown(app)

    app = FastAPI(title="Triage", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError):
        return error_response(e.status, e.message, param=e.param, code=e.code, headers=e.headers)

    @app.exception_handler(AuthError)
    async def _auth_error(_: Request, e: AuthError):
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        return error_response(e.status, e.message, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError):
        msg, param = _validation_message(e)
        return error_response(400, msg, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException):
        return error_response(e.status_code, str(e.detail))

    from serving.api import admin_routes, audit_routes, key_routes, openai_routes

    app.include_router(openai_routes.router)
    app.include_router(admin_routes.router)
    app.include_router(key_routes.router)
    app.include_router(audit_routes.router)
    from serving.api import class_routes, console_routes, history_routes, series_routes

    app.include_router(class_routes.router)
    app.include_router(history_routes.router)
    app.include_router(series_routes.router)
    app.include_router(console_routes.router)   # the operator console: /ui/...
    console_routes.mount_static(app)
    from serving.api import model_routes

    app.include_router(model_routes.router)   # site adapters: /admin/models

    @app.get("/healthz", tags=["health"])
    async def healthz(request: Request):
        """Liveness: fails only when engine restarts keep failing (serving/supervisor.py), so
        that an outside supervisor restarts the process; a restart in progress or a drain is alive."""
        sup = getattr(request.app.state, "supervisor", None)
        if sup is not None and not sup.live:
            return JSONResponse({"ok": False, "engine": sup.status()}, status_code=503)
        return {"ok": True}

    @app.get("/readyz", tags=["health"], responses={503: {"description": "not ready: the same body, ready false"}})
    async def readyz(request: Request):
        from fastapi.concurrency import run_in_threadpool

        from serving.db.session import ping

        st = request.app.state
        engine_ok = bool(getattr(st, "backend", None) and st.backend.ready)
        db_ok = await run_in_threadpool(ping, st.db) if getattr(st, "db", None) is not None else False
        draining = bool(getattr(st, "frontend", None) and st.frontend.draining)
        sup = getattr(st, "supervisor", None)
        body = {"ready": engine_ok and db_ok and not draining, "engine": engine_ok, "database": db_ok,
                "audit_spool": st.writer.spool_lines() if getattr(st, "writer", None) else None,
                "draining": draining, "engine_state": sup.state if sup is not None else ("up" if engine_ok else "down")}
        if hasattr(getattr(st, "backend", None), "standby_state"):      # vllm: is a death survived at once
            body["engine_standby"] = st.backend.standby_state
        if hasattr(getattr(st, "backend", None), "instances_status"):   # remote: which instances, and why not
            body["instances"] = st.backend.instances_status()
        return JSONResponse(body, status_code=200 if body["ready"] else 503)

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse)
    async def metrics(request: Request):
        m = request.app.state.metrics
        m.audit_spool.set(request.app.state.writer.spool_lines())
        m.db_up.set(1 if request.app.state.writer.db_ok else 0)
        return Response(m.render(), media_type="text/plain; version=0.0.4")

    # the body limit reads settings at start-up through a late-bound wrapper
    class _LateBodyLimit:
        def __init__(self, inner):
            self.inner = inner
            self.mw = None

        async def __call__(self, scope, receive, send):
            if self.mw is None:
                s = getattr(app.state, "settings", None)
                if s is None:   # lifespan and anything before it
                    return await self.inner(scope, receive, send)
                self.mw = BodyLimit(self.inner, s.max_body_bytes)
            return await self.mw(scope, receive, send)

    app.add_middleware(_LateBodyLimit)
    _document_errors(app)
    return app


def _document_errors(app: FastAPI) -> None:
    """Every route documents the OpenAI-style error body for the 4xx/5xx it may answer
    (a route's own entry for a status wins)."""
    from fastapi.routing import APIRoute

    from serving.api.errors import ERROR_RESPONSES

    for r in app.routes:
        if isinstance(r, APIRoute):
            r.responses = {**ERROR_RESPONSES, **r.responses}


async def _startup(app: FastAPI, s: Settings, predictor: Any, engine: Any = None) -> None:
    from serving.auth import KeyStore, count_keys, create_key
    from serving.backends import make_backend
    from serving.db.session import make_engine, upgrade
    from serving.db.writer import AuditWriter, Record
    from serving.loop import Frontend
    from serving.metrics import Metrics

    import asyncio

    app.state.loop = asyncio.get_running_loop()
    url = s.resolved_db_url()
    upgrade(url)
    db = app.state.db = make_engine(url)
    from serving.console.sessions import SessionStore

    app.state.sessions = SessionStore()
    app.state.keys = KeyStore(db, cache_s=s.key_cache_s)
    metrics = app.state.metrics = Metrics()
    metrics.gc.start()
    from serving.limits import KeyLimiter

    app.state.limiter = KeyLimiter(s.role_limits, retry_after_s=s.retry_after_s,
                                   on_limited=lambda role, why: metrics.limited.labels(role, why).inc())
    if s.bootstrap_keys and count_keys(db) == 0:
        admin, client = create_key(db, "admin", "bootstrap"), create_key(db, "client", "bootstrap")
        # printed once, on stdout only: never logged, never shown again
        sys.stdout.write("First start: created API keys (shown only now; store them):\n"
                         f"  admin  {admin}\n  client {client}\n")
        sys.stdout.flush()
    classes, stored, escalate_below = _load_classes(db, s)
    writer = app.state.writer = AuditWriter(
        db, s.resolved_spool_path(), batch=s.writer_batch, interval_s=s.writer_interval_s, retry_s=s.db_retry_s,
        on_state=lambda state, n: metrics.db_up.set(1 if state == "ok" else 0)).start()
    for lv, n in writer.interrupted.items():   # a crash's victims, recorded now: alertable at once
        metrics.requests.labels(str(lv), "interrupted").inc(n)
    if predictor is None:
        predictor = await _start_predictor(s)
        app.state.own_predictor = True
    app.state.predictor = predictor
    from serving.adapt.service import start_site

    app.state.site = await start_site(app, s)   # site adapters from operator relabels (serving/adapt)
    from serving.api.class_routes import apply_threshold, trained_threshold

    if escalate_below is not None:   # the stored version's threshold wins over the trained one
        apply_threshold(predictor, escalate_below)
    escalate_below = trained_threshold(predictor)[1]
    if not stored:
        import time

        now = time.time()
        rows = [{"version": classes.version, "level": c["level"], "name": c["name"], "weight": c["weight"],
                 "ttft": c["ttft"], "tpot": c["tpot"], "w_first": classes.w_first, "w_decode": classes.w_decode,
                 "actor": "system", "created": now, "escalate_below": escalate_below, "reason": "first start"}
                for c in classes.to_dict()["classes"]]
        writer.submit(Record("classes.loaded", now, "system", None, {**classes.to_dict(), "escalate_below": escalate_below},
                             "priority_classes", rows))
    backend = app.state.backend = make_backend(s, classes, metrics, engine=engine)
    await backend.start()
    fe = app.state.frontend = Frontend(backend, classes, writer, metrics, max_queue=s.max_queue,
                                       max_inflight=s.max_inflight, retry_after_s=s.retry_after_s,
                                       escalate_below=escalate_below, stream_interval=s.stream_interval,
                                       max_requeues=s.engine_max_requeues)
    await fe.start()
    from serving.gc_heap import freeze_heap

    if s.gc_freeze:   # before the loop watchdog starts: the freeze's collection is start-up, not a stall
        freeze_heap("service started")   # as vLLM's own API server does (serving/gc_heap.py)
    from serving.loop_watchdog import LoopWatchdog

    app.state.watchdog = LoopWatchdog(threshold_s=s.loop_stall_warn_s,
                                      on_stall=metrics.loop_stall.observe).start(asyncio.get_running_loop())
    if hasattr(backend, "set_on_up"):   # remote instances rejoining the rotation
        backend.set_on_up(fe.wake)
    if hasattr(backend, "restart"):   # an engine that can die is supervised (serving/supervisor.py)
        from serving.supervisor import EngineSupervisor, RestartLimits

        app.state.supervisor = EngineSupervisor(backend, metrics, RestartLimits.from_settings(s),
                                                on_up=fe.wake).start()
    log.info("triage service ready: backend %s, database %s, classes v%d", backend.name,
             db.url.render_as_string(hide_password=True), classes.version)


async def _start_predictor(s: Settings):
    from predictors.service import PredictorService

    d = Path(s.predictors_dir) if s.predictors_dir else None
    svc = PredictorService(strategy=s.predictor_strategy, max_batch=s.predictor_max_batch, threads=s.predictor_threads, runtime=s.predictor_runtime,
                           urgency_dir=d / "urgency" if d else None, length_dir=d / "length" if d else None,
                           queue_hint=s.predictor_queue_hint)
    try:
        await svc.start()
    except FileNotFoundError as e:
        raise RuntimeError(f"the predictors are not trained ({e}); run `triage train all` "
                           "(`triage serve` does it on first start)") from None
    p = svc.predictor
    log.info("predictors ready: runtime %s, %s", p.urgency.runtime,
             "one encoder pass for both" if p.shared_encoder else "two encoder passes (length model not trained on the urgency encoder)")
    return svc


def _load_classes(db, s: Settings):
    from sqlalchemy import func, select
    from sqlalchemy.orm import Session

    from serving.db.models import PriorityClassRow
    from triage.classes import PriorityClass, PriorityClasses, load_classes

    with Session(db) as sess:
        v = sess.scalar(select(func.max(PriorityClassRow.version)))
        if v is not None:
            rows = list(sess.scalars(select(PriorityClassRow).where(PriorityClassRow.version == v)))
            cls = PriorityClasses({r.level: PriorityClass(r.level, r.name, r.weight, r.ttft, r.tpot) for r in rows},
                                  v, rows[0].w_first, rows[0].w_decode)
            return cls, True, rows[0].escalate_below
    scale = _profile_slo_scale(s)
    classes = load_classes(s.classes_file)
    return (classes.scaled(scale) if scale != 1.0 else classes), False, None


def _profile_slo_scale(s: Settings) -> float:
    """First start: the class SLOs are scaled to the hardware profile, as the simulator does."""
    from triage.profiles import load_profile

    name = s.profile_name()
    try:
        return load_profile(name).slo_scale
    except FileNotFoundError:
        log.warning("profile %r not found: class SLOs used unscaled", name)
        return 1.0


async def _shutdown(app: FastAPI) -> None:
    st = app.state
    if getattr(st, "watchdog", None):
        await st.watchdog.stop()
    if getattr(st, "supervisor", None):
        await st.supervisor.stop()
    if getattr(st, "frontend", None):
        await st.frontend.stop()
    if getattr(st, "backend", None):
        await st.backend.stop()
    if getattr(st, "site", None):
        await st.site.stop()
    if getattr(st, "own_predictor", False):
        await st.predictor.close()
    if getattr(st, "writer", None):
        st.writer.stop(10.0)
    if getattr(st, "db", None) is not None:
        st.db.dispose()
    if getattr(st, "metrics", None) is not None:
        st.metrics.gc.stop()
