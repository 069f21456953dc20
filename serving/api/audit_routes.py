"""Auditors: per-level latency report (JSON or CSV), the request rows by level and outcome,
one request's record, chain check, the order check (was the most urgent call served first)."""
from __future__ import annotations

import csv
import io
import json
import math
import time
from collections import defaultdict
from datetime import datetime
from typing import Literal

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from serving.api.errors import APIError
from serving.auth import AuditorKey
from serving.db.models import AuditEventRow, RelabelRow, RequestRow, arrived
from serving.db.writer import verify
from serving.db.order import order_calls
from triage.order_audit import DEFAULT_TIE_S, DEFAULT_TOLERANCE_S, order_audit

# ended before a full answer, by the client or the service: the client went away
# (cancelled), the drain deadline (shutdown), an engine death mid-stream (engine_restart), the
# service process dying before the request ended (interrupted, recorded at the next start)
ABORTED = ("aborted", "cancelled", "shutdown", "engine_restart", "interrupted")

router = APIRouter(prefix="/audit", tags=["auditors"])

GROUPS = {"level": RequestRow.effective_level, "predicted_level": RequestRow.predicted_level,
          "outcome": RequestRow.outcome, "instance": RequestRow.instance}


def parse_time(v: str | None, name: str) -> float | None:
    if v is None or v == "":
        return None
    try:
        x = float(v)
    except ValueError:
        pass
    else:
        if not math.isfinite(x):
            raise APIError(400, f"{name} must be a finite time, got {v!r}", param=name)
        return x
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise APIError(400, f"{name} must be ISO 8601 or UNIX seconds, got {v!r}", param=name) from None
    if dt.tzinfo is None:
        raise APIError(400, f"{name} needs a time zone (e.g. 2026-01-01T00:00:00Z)", param=name)
    return dt.timestamp()


async def read_audit(app, load):
    """`load()` in a worker thread once the writer has flushed what it holds (up to 5 s), so a
    request that just ended is in the answer; a database that does not answer is a 503."""
    def run():
        app.state.writer.sync(5.0)
        return load()

    try:
        return await run_in_threadpool(run)
    except Exception as e:
        raise APIError(503, f"audit database unreachable ({type(e).__name__})") from None


def _pct(a: list[float], q: float) -> float | None:
    return round(float(np.percentile(a, q)), 6) if a else None


def latency_report(rows, group_by: str) -> list[dict]:
    by: dict = defaultdict(list)
    for r in rows:
        by[getattr(r, group_by if group_by != "level" else "effective_level")].append(r)
    out = []
    for key in sorted(by, key=lambda k: (k is None, k)):
        rs = by[key]
        served = [r for r in rs if r.outcome in ("ok", "length")]
        ttft = [r.ttft for r in rs if r.ttft is not None]
        tpot = [r.mean_tpot for r in rs if r.mean_tpot is not None]
        max_tpot = [r.max_tpot for r in rs if r.max_tpot is not None]
        ideal = sum(r.tdg_ideal or 0.0 for r in rs)
        out.append({
            group_by: key, "count": len(rs), "served": len(served),
            "shed": sum(r.outcome == "shed" for r in rs), "aborted": sum(r.outcome in ABORTED for r in rs),
            "errored": sum(r.outcome == "error" for r in rs),
            "slo_attainment": round(sum(bool(r.slo_met) for r in rs) / len(rs), 6),
            "tdg_ratio": round(sum(r.tdg_gain or 0.0 for r in rs) / ideal, 6) if ideal else None,
            "ttft_p50": _pct(ttft, 50), "ttft_p95": _pct(ttft, 95), "ttft_p99": _pct(ttft, 99),
            "tpot_p50": _pct(tpot, 50), "tpot_p95": _pct(tpot, 95), "tpot_p99": _pct(tpot, 99),
            "max_tpot_p99": _pct(max_tpot, 99),
            "relabelled": sum(r.override_level is not None for r in rs),
        })
    return out


@router.get("/latency", responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}},
                                         "description": "the report as JSON, or CSV with format=csv"}})
async def latency(request: Request, _: AuditorKey,
                  group_by: Literal["level", "predicted_level", "outcome", "instance"] = "level",
                  since: str | None = None, until: str | None = None,
                  format: Literal["json", "csv"] = Query("json")):
    t0, t1 = parse_time(since, "since"), parse_time(until, "until")
    app = request.app

    def load():
        with Session(app.state.db) as s:
            return list(s.scalars(arrived(select(RequestRow), t0, t1)))

    rows = await read_audit(app, load)
    report = latency_report(rows, group_by)
    if format == "csv":
        buf = io.StringIO()
        cols = [group_by] + [k for k in (report[0] if report else {}) if k != group_by] if report else [group_by, "count"]
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        for row in report:
            w.writerow(row)
        return Response(buf.getvalue(), media_type="text/csv")
    return {"group_by": group_by, "since": t0, "until": t1, "requests": len(rows), "groups": report}


def _row_dict(obj) -> dict:
    return {c.key: getattr(obj, c.key) for c in obj.__table__.columns}


OUTCOMES = ("ok", "length", "shed", "error") + ABORTED


@router.get("/requests", responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}},
                                          "description": "the rows as JSON, or CSV with format=csv"}})
async def audit_requests(request: Request, _: AuditorKey, level: int | None = Query(None, ge=1, le=99),
                         outcome: str | None = Query(None, max_length=200), since: str | None = None,
                         until: str | None = None, limit: int = Query(500, ge=1, le=5000),
                         format: Literal["json", "csv"] = Query("json")):
    """The requests' audit rows, newest arrival first, without message text: which calls at
    a level ended how, e.g. the ESI-1 calls a crash interrupted or the queue shed, to follow
    up (`?level=1&outcome=interrupted,shed`). `outcome`: one or several, comma-separated."""
    t0, t1 = parse_time(since, "since"), parse_time(until, "until")
    wanted = [o.strip() for o in outcome.split(",") if o.strip()] if outcome else []
    bad = [o for o in wanted if o not in OUTCOMES]
    if bad:
        raise APIError(400, f"unknown outcome {bad[0]!r}; one of {', '.join(OUTCOMES)}", param="outcome")
    app = request.app

    def load():
        q = arrived(select(RequestRow), t0, t1).order_by(RequestRow.arrival.desc(), RequestRow.id).limit(limit + 1)
        if level is not None:
            q = q.where(RequestRow.effective_level == level)
        if wanted:
            q = q.where(RequestRow.outcome.in_(wanted))
        with Session(app.state.db) as s:
            return [{k: v for k, v in _row_dict(r).items() if k != "prompt"} for r in s.scalars(q)]

    rows = await read_audit(app, load)
    more, rows = len(rows) > limit, rows[:limit]
    if format == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=[c.key for c in RequestRow.__table__.columns if c.key != "prompt"])
        w.writeheader()
        w.writerows(rows)
        return Response(buf.getvalue(), media_type="text/csv")
    return {"level": level, "outcome": wanted or None, "since": t0, "until": t1, "count": len(rows),
            "truncated": more, "requests": rows}


@router.get("/requests/{request_id}")
async def audit_request(request: Request, request_id: str, who: AuditorKey) -> dict:
    app = request.app

    def load():
        with Session(app.state.db) as s:
            r = s.get(RequestRow, request_id)
            rel = list(s.scalars(select(RelabelRow).where(RelabelRow.request_id == request_id).order_by(RelabelRow.id)))
            ev = list(s.scalars(select(AuditEventRow).where(AuditEventRow.request_id == request_id).order_by(AuditEventRow.id)))
            return r, rel, ev

    r, rel, ev = await read_audit(app, load)
    if r is None:
        if request_id in app.state.frontend.jobs:
            raise APIError(404, f"request {request_id!r} is still live; its record is written when it finishes")
        raise APIError(404, f"no request {request_id!r}")
    rec = _row_dict(r)
    if not who.can("operator"):   # auditors never see message text, even where store_prompts kept it
        rec["prompt_redacted"] = rec.get("prompt") is not None
        rec["prompt"] = None
    return {"request": rec, "relabels": [_row_dict(x) for x in rel],
            "events": [{**_row_dict(e), "payload": json.loads(e.payload)} for e in ev]}


@router.get("/verify")
async def audit_verify(request: Request, _: AuditorKey):
    app = request.app
    res = await read_audit(app, lambda: verify(app.state.db))
    res["spooled_pending"] = app.state.writer.spool_lines()
    res["checked_at"] = time.time()
    app.state.last_verify = res
    return JSONResponse(res, status_code=200 if res["ok"] else 409)


@router.get("/verify/last")
async def audit_verify_last(request: Request, _: AuditorKey) -> dict:
    """The last chain check this process ran (`checked_at` null: none yet), without running one."""
    return getattr(request.app.state, "last_verify", None) or {"ok": None, "checked_at": None}


@router.get("/order")
async def audit_order(request: Request, _: AuditorKey, since: str | None = None, until: str | None = None,
                      tolerance_s: float = Query(DEFAULT_TOLERANCE_S, ge=0, le=60),
                      tie_s: float = Query(DEFAULT_TIE_S, ge=0, le=5)) -> dict:
    """Was the most urgent call served first? Every urgency inversion among the calls that
    arrived in the window: a call started on an engine while a more urgent one, there for more
    than `tolerance_s` already (from its arrival or its last relabel), still waited for its
    first token (triage/order_audit.py, docs/service.md). `ok`: no ESI-1 call was overtaken.
    At most the window's first 20,000 calls (`truncated`)."""
    t0, t1 = parse_time(since, "since"), parse_time(until, "until")
    app = request.app

    def load():
        with Session(app.state.db) as s:
            return order_calls(s, t0, t1)

    calls, more = await read_audit(app, load)
    return {"since": t0, "until": t1, "truncated": more,
            **order_audit(calls, tolerance_s=tolerance_s, tie_s=tie_s)}


@router.get("/export", responses={200: {"content": {"application/x-ndjson": {"schema": {"type": "string"}}},
                                        "description": "audit events, one JSON object per line"}})
async def audit_export(request: Request, _: AuditorKey, since: str | None = None, until: str | None = None):
    """The hash-chained audit events as JSON lines (id, at, kind, actor, request_id,
    payload, prev_hash, hash): enough to re-verify the chain elsewhere (`triage db verify
    --export`). No message text. A window (`since`, `until`) is one unbroken piece of the
    chain: from the first event at or after `since` to the last one before `until`, with
    any event in between whose clock said otherwise (a record replayed from the outage
    spool carries the time it happened)."""
    t0, t1 = parse_time(since, "since"), parse_time(until, "until")
    app = request.app

    def load():
        q = select(AuditEventRow).order_by(AuditEventRow.id)
        ids = AuditEventRow.id
        if t0 is not None:
            q = q.where(ids >= select(func.min(ids)).where(AuditEventRow.at >= t0).scalar_subquery())
        if t1 is not None:
            q = q.where(ids <= select(func.max(ids)).where(AuditEventRow.at < t1).scalar_subquery())
        with Session(app.state.db) as s:
            return [json.dumps({**_row_dict(e), "payload": json.loads(e.payload)}, sort_keys=True) + "\n"
                    for e in s.scalars(q)]

    lines = await read_audit(app, load)
    return Response("".join(lines), media_type="application/x-ndjson",
                    headers={"Content-Disposition": 'attachment; filename="triage-audit.jsonl"'})
