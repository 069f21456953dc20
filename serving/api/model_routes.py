"""Site adapter versions: list (operators, auditors), fit / shadow / promote / roll back (admins)."""
from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from serving.api.errors import APIError
from serving.auth import Principal, require, require_any

router = APIRouter(prefix="/admin/models", tags=["site adaptation"])
AdminKey = Annotated[Principal, Depends(require("admin"))]
StaffKey = Annotated[Principal, Depends(require_any("operator", "auditor"))]
_ERR = {"description": "error object", "content": {"application/json": {}}}


class AdaptBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    min_per_level: int = Field(10, ge=2, le=10_000, description="refuse unless every level 1-5 has this many relabels")
    holdout: float = Field(0.25, ge=0.1, le=0.5, description="newest share of the log held out for the promotion gate")
    shadow: bool = Field(True, description="run a candidate that passes beside the live model at once")


def _site(request: Request):
    site = getattr(request.app.state, "site", None)
    if site is None:
        raise APIError(409, "site adaptation is off: the service is not running the trained predictor")
    return site


@router.get("", responses={409: _ERR})
async def list_models(request: Request, _: StaffKey) -> dict:
    site = _site(request)
    return await asyncio.to_thread(site.registry.listing)


@router.post("/adapt", responses={409: _ERR})
async def adapt(request: Request, who: AdminKey, body: AdaptBody | None = None) -> dict:
    from predictors.adapter import AdaptError

    site = _site(request)
    body = body or AdaptBody()
    async with site.lock:
        await asyncio.to_thread(request.app.state.writer.sync, 10.0)  # relabels submitted so far are in the log
        try:
            res = await asyncio.to_thread(site.registry.adapt, who.actor, min_per_level=body.min_per_level,
                                          holdout=body.holdout)
        except AdaptError as e:
            raise APIError(409, str(e), code="adapt_refused") from None
        if res["passed"] and body.shadow:
            await asyncio.to_thread(site.registry.shadow, res["version"], who.actor)
            res["shadow"] = True
    return res


@router.post("/{version}/promote", responses={404: _ERR, 409: _ERR})
async def promote(request: Request, version: int, who: AdminKey) -> dict:
    from serving.adapt.registry import NotPromotable

    site = _site(request)
    async with site.lock:
        try:
            return await asyncio.to_thread(site.registry.promote, version, who.actor)
        except KeyError:
            raise APIError(404, f"no site model version {version}") from None
        except NotPromotable as e:
            raise APIError(409, str(e), code="not_promotable") from None
        except Exception as e:  # files unreadable, database error: nothing was swapped
            raise APIError(409, f"promotion of version {version} failed ({type(e).__name__}: {e}); "
                                "the previous model keeps serving", code="promotion_failed") from None


@router.post("/rollback", responses={409: _ERR})
async def rollback(request: Request, who: AdminKey) -> dict:
    from serving.adapt.registry import NotPromotable

    site = _site(request)
    async with site.lock:
        try:
            return await asyncio.to_thread(site.registry.rollback, who.actor)
        except NotPromotable as e:
            raise APIError(409, str(e), code="nothing_to_roll_back") from None


@router.post("/{version}/shadow", responses={404: _ERR, 409: _ERR})
async def shadow(request: Request, version: int, who: AdminKey) -> dict:
    from serving.adapt.registry import NotPromotable

    site = _site(request)
    async with site.lock:
        try:
            return await asyncio.to_thread(site.registry.shadow, version, who.actor)
        except KeyError:
            raise APIError(404, f"no site model version {version}") from None
        except NotPromotable as e:
            raise APIError(409, str(e)) from None


@router.delete("/shadow", responses={409: _ERR})
async def stop_shadow(request: Request, who: AdminKey) -> dict:
    site = _site(request)
    async with site.lock:
        return await asyncio.to_thread(site.registry.shadow, None, who.actor)
