"""The operators' history: relabels and class edits as one searchable log.

    GET /admin/history?q=chest&kind=relabel&since=...&until=...&limit=200

Each entry says who, when, from -> to and why, and names the hash-chained audit event
that seals it (`audit_event_id`, `audit_hash`) and, for a relabel, the request whose
audit record (`/audit/requests/{id}`) holds the rest. Never any message text.
"""
from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session

from serving.api.audit_routes import parse_time
from serving.api.class_routes import load_versions
from serving.api.errors import APIError
from serving.auth import StaffKey
from serving.db.models import AuditEventRow, RelabelRow

router = APIRouter(prefix="/admin", tags=["operators"])


def _class_changes(old: dict | None, new: dict) -> list[str]:
    """Human-readable differences between two class versions ('L1 ttft 0.5 -> 0.4')."""
    if old is None:
        return ["first version"]
    out = []
    a = {c["level"]: c for c in old["classes"]}
    b = {c["level"]: c for c in new["classes"]}
    for lv in sorted(set(a) | set(b)):
        if lv not in a:
            out.append(f"L{lv} added")
        elif lv not in b:
            out.append(f"L{lv} removed")
        else:
            out += [f"L{lv} {k} {a[lv][k]} -> {b[lv][k]}" for k in ("name", "weight", "ttft", "tpot") if a[lv][k] != b[lv][k]]
    out += [f"{k} {old[k]} -> {new[k]}" for k in ("w_first", "w_decode", "escalate_below")
            if old.get(k) != new.get(k) and new.get(k) is not None]
    return out or ["no change"]


def load_history(app, kind: str, t0: float | None, t1: float | None) -> list[dict]:
    app.state.writer.sync(5.0)
    entries: list[dict] = []
    with Session(app.state.db) as s:
        if kind in ("all", "relabel"):
            q = select(RelabelRow)
            if t0 is not None:
                q = q.where(RelabelRow.at >= t0)
            if t1 is not None:
                q = q.where(RelabelRow.at < t1)
            rel = list(s.scalars(q))
            # the chain stores event times rounded to the microsecond (serving/db/chain.py)
            ev = {(e.request_id, round(e.at, 6)): e for e in s.scalars(
                select(AuditEventRow).where(AuditEventRow.kind == "relabel",
                                            AuditEventRow.request_id.in_({r.request_id for r in rel})))} if rel else {}
            for r in rel:
                e = ev.get((r.request_id, round(r.at, 6)))
                entries.append({"kind": "relabel", "at": r.at, "actor": r.actor, "request_id": r.request_id,
                                "from": f"level {r.from_level}", "to": f"level {r.to_level}", "reason": r.reason,
                                "stage": r.stage, "audit_event_id": e.id if e else None,
                                "audit_hash": e.hash if e else None})
        if kind in ("all", "classes"):
            ev = {round(e.at, 6): e for e in s.scalars(select(AuditEventRow).where(
                AuditEventRow.kind.in_(("classes.updated", "classes.loaded"))))}
    if kind in ("all", "classes"):
        versions = sorted(load_versions(app), key=lambda v: v["version"])
        for prev, v in zip([None] + versions[:-1], versions):
            if (t0 is not None and v["created"] < t0) or (t1 is not None and v["created"] >= t1):
                continue
            e = ev.get(round(v["created"], 6))
            entries.append({"kind": "classes", "at": v["created"], "actor": v["actor"], "request_id": None,
                            "from": f"version {prev['version']}" if prev else "-", "to": f"version {v['version']}",
                            "reason": v["reason"] or "", "changes": _class_changes(prev, v),
                            "audit_event_id": e.id if e else None, "audit_hash": e.hash if e else None})
    entries.sort(key=lambda x: x["at"], reverse=True)
    return entries


def _matches(e: dict, q: str) -> bool:
    hay = " ".join(str(x) for x in (e["actor"], e["request_id"], e["from"], e["to"], e["reason"],
                                    " ".join(e.get("changes", ())))).lower()
    return all(w in hay for w in q.lower().split())


@router.get("/history")
async def history(request: Request, _: StaffKey, q: str = Query("", max_length=200),
                  kind: Literal["all", "relabel", "classes"] = "all", since: str | None = None,
                  until: str | None = None, limit: int = Query(500, ge=1, le=5000)) -> dict:
    t0, t1 = parse_time(since, "since"), parse_time(until, "until")
    try:
        entries = await run_in_threadpool(load_history, request.app, kind, t0, t1)
    except Exception as e:
        raise APIError(503, f"audit database unreachable ({type(e).__name__})") from None
    if q.strip():
        entries = [e for e in entries if _matches(e, q)]
    return {"q": q, "kind": kind, "count": len(entries), "entries": entries[:limit]}
