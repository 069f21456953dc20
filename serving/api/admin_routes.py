"""Operators: relabel live requests, edit the priority classes, watch the queue."""
from __future__ import annotations

from fastapi import APIRouter, Request

from serving.api.errors import APIError
from serving.api.schemas import ClassesBody, RelabelBody
from serving.auth import OperatorKey
from serving.loop import Conflict, NotFound
from triage.classes import ClassError, PriorityClass, PriorityClasses

router = APIRouter(prefix="/admin", tags=["operators"])


@router.patch("/requests/{request_id}")
async def relabel(request: Request, request_id: str, body: RelabelBody, who: OperatorKey) -> dict:
    fe = request.app.state.frontend
    if body.level not in fe.classes.classes:
        raise APIError(400, f"invalid level {body.level}; levels are {list(fe.classes.levels)}", param="level")
    try:
        return await fe.relabel(request_id, body.level, who.actor, body.reason)
    except NotFound:
        raise APIError(404, f"no live request {request_id!r} (finished requests are in /audit/requests)") from None
    except Conflict as e:
        raise APIError(409, str(e)) from None


@router.get("/classes")
async def get_classes(request: Request, _: OperatorKey) -> dict:
    return request.app.state.frontend.classes.to_dict()


@router.put("/classes")
async def put_classes(request: Request, body: ClassesBody, who: OperatorKey) -> dict:
    fe = request.app.state.frontend
    old = fe.classes
    levels = [c.level for c in body.classes]
    if len(set(levels)) != len(levels):
        raise APIError(400, "duplicate level in the class table", param="classes")
    try:
        new = PriorityClasses({c.level: PriorityClass(c.level, c.name, c.weight, c.ttft, c.tpot) for c in body.classes},
                              old.version + 1, body.w_first or old.w_first, body.w_decode or old.w_decode)
        await fe.set_classes(new, who.actor)
    except ClassError as e:
        raise APIError(400, str(e), param="classes") from None
    return new.to_dict()


@router.get("/queue")
async def queue(request: Request, _: OperatorKey) -> dict:
    return request.app.state.frontend.snapshot()
