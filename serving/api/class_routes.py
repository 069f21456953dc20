"""The priority classes: read, edit (weights, SLOs, the urgency model's escalation
threshold), version history with author and time, roll back to any version.

Every edit or roll-back makes a new version (the table is append-only, like the audit
chain that seals it); the new version applies to queued requests at once and to the
engine at its next step, and the threshold to the next request classified.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session

from serving.api.errors import APIError
from serving.api.recorded import recorded
from serving.api.schemas import ClassesBody, RollbackBody
from serving.auth import OperatorKey, StaffKey
from serving.db.models import PriorityClassRow
from triage.classes import ClassError, PriorityClass, PriorityClasses

router = APIRouter(prefix="/admin/classes", tags=["operators"])


def trained_threshold(predictor: Any) -> tuple[bool, float | None]:
    """(whether the predictor has an escalation threshold, its current value)."""
    p = getattr(predictor, "predictor", None)
    if p is None or not hasattr(p, "escalate_below"):
        return False, None
    return True, p.escalate_below


def apply_threshold(predictor: Any, value: float | None) -> None:
    """Set the urgency model's escalation threshold; the next classification uses it."""
    has, _ = trained_threshold(predictor)
    if has and value is not None:
        predictor.predictor.escalate_below = float(value)


def current(request: Request) -> dict:
    fe = request.app.state.frontend
    return {**fe.classes.to_dict(), "escalate_below": fe.escalate_below}


@router.get("")
async def get_classes(request: Request, _: StaffKey) -> dict:
    return current(request)


@router.put("")
async def put_classes(request: Request, body: ClassesBody, who: OperatorKey) -> dict:
    fe = request.app.state.frontend
    old = fe.classes
    levels = [c.level for c in body.classes]
    if len(set(levels)) != len(levels):
        raise APIError(400, "duplicate level in the class table", param="classes")
    esc = "keep"
    if body.escalate_below is not None:
        has, _ = trained_threshold(request.app.state.predictor)
        if not has:
            raise APIError(409, "this service's urgency model has no escalation threshold to set", param="escalate_below")
        esc = body.escalate_below
    try:
        new = PriorityClasses({c.level: PriorityClass(c.level, c.name, c.weight, c.ttft, c.tpot) for c in body.classes},
                              old.version + 1, body.w_first or old.w_first, body.w_decode or old.w_decode)
        await fe.set_classes(new, who.actor, escalate_below=esc, reason=body.reason)
    except ClassError as e:
        raise APIError(400, str(e), param="classes") from None
    if esc != "keep":
        apply_threshold(request.app.state.predictor, esc)
    return {**current(request), "recorded": await recorded(request)}


def load_versions(app) -> list[dict]:
    """Every stored version, newest first: classes, weights, threshold, author, time, reason."""
    app.state.writer.sync(5.0)
    with Session(app.state.db) as s:
        rows = list(s.scalars(select(PriorityClassRow).order_by(PriorityClassRow.version, PriorityClassRow.level)))
    by: dict[int, list] = defaultdict(list)
    for r in rows:
        by[r.version].append(r)
    out = []
    for v in sorted(by, reverse=True):
        rs = by[v]
        out.append({"version": v, "actor": rs[0].actor, "created": rs[0].created, "reason": rs[0].reason,
                    "w_first": rs[0].w_first, "w_decode": rs[0].w_decode, "escalate_below": rs[0].escalate_below,
                    "classes": [{"level": r.level, "name": r.name, "weight": r.weight, "ttft": r.ttft, "tpot": r.tpot}
                                for r in rs]})
    return out


@router.get("/history")
async def class_history(request: Request, _: StaffKey) -> dict:
    try:
        versions = await run_in_threadpool(load_versions, request.app)
    except Exception as e:
        raise APIError(503, f"audit database unreachable ({type(e).__name__})") from None
    return {"current": request.app.state.frontend.classes.version, "versions": versions}


@router.post("/rollback")
async def rollback(request: Request, body: RollbackBody, who: OperatorKey) -> dict:
    """Make a new version equal to an earlier one (its classes, weights and threshold)."""
    fe = request.app.state.frontend
    try:
        versions = await run_in_threadpool(load_versions, request.app)
    except Exception as e:
        raise APIError(503, f"audit database unreachable ({type(e).__name__})") from None
    old = next((v for v in versions if v["version"] == body.version), None)
    if old is None:
        raise APIError(404, f"no class version {body.version}; versions are {sorted(v['version'] for v in versions)}",
                       param="version")
    try:
        new = PriorityClasses({c["level"]: PriorityClass(c["level"], c["name"], c["weight"], c["ttft"], c["tpot"])
                               for c in old["classes"]}, fe.classes.version + 1, old["w_first"], old["w_decode"])
        esc = old["escalate_below"] if old["escalate_below"] is not None else "keep"
        reason = f"roll back to version {body.version}" + (f": {body.reason}" if body.reason else "")
        await fe.set_classes(new, who.actor, escalate_below=esc, reason=reason)
    except ClassError as e:   # e.g. a level in use by a live request is missing from that version
        raise APIError(409, f"cannot roll back to version {body.version}: {e}") from None
    if esc != "keep":
        apply_threshold(request.app.state.predictor, esc)
    return {**current(request), "recorded": await recorded(request)}
