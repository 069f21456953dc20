"""Operators: relabel live requests, watch the queue (the class table: class_routes.py);
admins: empty the engine's prefix cache."""
from __future__ import annotations

from fastapi import APIRouter, Request

from serving.api.errors import APIError
from serving.api.recorded import recorded
from serving.api.schemas import RelabelBody
from serving.auth import AdminKey, OperatorKey
from serving.backends.base import BackendRefused
from serving.loop import Conflict, NotFound

router = APIRouter(prefix="/admin", tags=["operators"])


@router.patch("/requests/{request_id}")
async def relabel(request: Request, request_id: str, body: RelabelBody, who: OperatorKey) -> dict:
    fe = request.app.state.frontend
    if body.level not in fe.classes.classes:
        raise APIError(400, f"invalid level {body.level}; levels are {list(fe.classes.levels)}", param="level")
    job = fe.jobs.get(request_id)
    try:
        res = await fe.relabel(request_id, body.level, who.actor, body.reason)
    except NotFound:
        raise APIError(404, f"no live request {request_id!r} (finished requests are in /audit/requests)") from None
    except Conflict as e:
        raise APIError(409, str(e)) from None
    site = getattr(request.app.state, "site", None)
    if site is not None and job is not None:
        site.record_relabel(job, body.level, who)   # the relabel log a site adapter learns from (serving/adapt)
    return {**res, "recorded": await recorded(request)}


@router.get("/queue")
async def queue(request: Request, _: OperatorKey) -> dict:
    return request.app.state.frontend.snapshot()


@router.post("/engine/reset-prefix-cache")
async def reset_prefix_cache(request: Request, who: AdminKey) -> dict:
    """Empty the engine's prefix cache (vLLM's `reset_prefix_cache`), e.g. so that a
    benchmark's repeated calls meet a cold cache as new calls do. Refused (409) while
    requests are running: their blocks are in use."""
    try:
        done = await request.app.state.frontend.backend.reset_prefix_cache()
    except BackendRefused as e:   # remote instances without vLLM's dev endpoint
        raise APIError(409, str(e)) from None
    if not done:
        raise APIError(409, "the engine holds running requests' blocks; retry when it is idle")
    return {"reset": True, "by": who.actor}
