"""Admins: API keys. Create, list, revoke and rotate without a restart; every change is an
audit event (`key.created`, `key.revoked`, `key.rotated`) with the admin's key id as actor.
A revoked key stops working on this server at once (its cached check is dropped)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from serving import key_admin
from serving.api.errors import APIError
from serving.api.recorded import recorded
from serving.api.schemas import KeyCreateBody
from serving.auth import AdminKey

router = APIRouter(prefix="/admin/keys", tags=["admins"])


async def _db(fn, *args):
    try:
        return await run_in_threadpool(fn, *args)
    except key_admin.KeyNotFound as e:
        raise APIError(404, f"no API key with id {e.args[0]!r}") from None
    except key_admin.LastAdmin as e:
        raise APIError(409, str(e)) from None
    except ValueError as e:
        raise APIError(409, str(e)) from None
    except Exception as e:
        raise APIError(503, f"key store unavailable: {type(e).__name__}") from None


@router.get("")
async def list_keys(request: Request, _: AdminKey) -> dict:
    return {"keys": await _db(key_admin.list_keys, request.app.state.db)}


@router.post("", status_code=201)
async def create_key(request: Request, body: KeyCreateBody, who: AdminKey) -> dict:
    out, key, rec = await _db(key_admin.create, request.app.state.db, body.role, body.name, who.actor)
    request.app.state.writer.submit(rec)
    return {**out, "key": key, "recorded": await recorded(request)}


@router.delete("/{key_id}")
async def revoke_key(request: Request, key_id: str, who: AdminKey) -> dict:
    out, rec = await _db(key_admin.revoke, request.app.state.db, key_id, who.actor)
    request.app.state.keys.forget(key_id)
    request.app.state.writer.submit(rec)
    return {**out, "recorded": await recorded(request)}


@router.post("/{key_id}/rotate", status_code=201)
async def rotate_key(request: Request, key_id: str, who: AdminKey) -> dict:
    out, key, rec = await _db(key_admin.rotate, request.app.state.db, key_id, who.actor)
    request.app.state.keys.forget(key_id)
    request.app.state.writer.submit(rec)
    return {**out, "key": key, "recorded": await recorded(request)}
