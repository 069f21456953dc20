"""The operator console's routes: login, the pages, the live queue stream.

    POST /ui/login {"key": ...}   -> HTTP-only session cookie (client keys: 403)
    POST /ui/logout
    GET  /ui/api/me               -> role, actor, the pages it may open, its CSRF token
    GET  /ui/api/queue/stream     -> Server-Sent Events: the live queue every `interval`
    GET  /ui/api/queue            -> the same view once (JSON)
    GET  /ui/api/models           -> the predictors in use and their figures
    GET  /ui/{page}               -> the page (login first; a page the role may not open: 403)

Every asset is served from `serving/static` (the machine may be offline: no CDN).
Message text reaches a page only for roles that operate (operator, admin); an
auditor's view of the queue has no text field at all.
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, StreamingResponse
from pydantic import Field

from serving.api.errors import APIError
from serving.api.schemas import Strict
from serving.auth import AuthError, StaffKey, principal
from serving.console.live import live_view
from serving.console.sessions import COOKIE

STATIC = Path(__file__).resolve().parent.parent / "static"

# page -> roles that may open it (admin opens all); the order is the navigation's
PAGES: dict[str, tuple[str, ...]] = {
    "queue": ("operator", "auditor"),
    "classes": ("operator", "auditor"),
    "history": ("operator", "auditor"),
    "latency": ("auditor",),
    "audit": ("auditor",),
    "models": ("operator", "auditor"),
    "record": ("auditor",),   # one request's audit record (linked from History), not in the navigation
}
NAV = [p for p in PAGES if p != "record"]
# the pages load only what the service serves itself
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
TITLES = {"queue": "Live queue", "classes": "Priority classes", "history": "History", "latency": "Latency",
          "audit": "Audit", "models": "Models", "record": "Audit record"}

router = APIRouter(prefix="/ui", include_in_schema=False)


class LoginBody(Strict):
    key: str = Field(..., min_length=1, max_length=512)


def pages_for(p) -> list[str]:
    return [name for name in NAV if any(p.can(r) for r in PAGES[name])]


@router.post("/login")
async def login(request: Request, body: LoginBody):
    p = request.app.state.keys.check(body.key.strip())   # 401 for a wrong or revoked key
    if not pages_for(p):
        raise AuthError(403, f"a {p.role} key cannot use the operator console (operator, auditor or admin keys can)")
    secure = request.url.scheme == "https"
    sid, s = request.app.state.sessions.open(body.key.strip(), p.role)
    resp = JSONResponse({"role": p.role, "actor": p.actor, "pages": pages_for(p), "csrf": s.csrf})
    resp.set_cookie(COOKIE, sid, httponly=True, samesite="strict", secure=secure, path="/",
                    max_age=int(request.app.state.sessions.ttl_s))
    return resp


@router.post("/logout")
async def logout(request: Request):
    request.app.state.sessions.close(request.cookies.get(COOKIE))
    resp = JSONResponse({"ok": True})
    resp.delete_cookie(COOKIE, path="/")
    return resp


@router.get("/api/me")
async def me(request: Request, who: StaffKey) -> dict:
    s = request.app.state.sessions.get(request.cookies.get(COOKIE))
    return {"role": who.role, "actor": who.actor, "pages": pages_for(who), "titles": TITLES,
            "csrf": s.csrf if s else None, "can_edit": who.can("operator"), "can_audit": who.can("auditor"),
            "text": who.can("operator")}


def _view(request: Request, who) -> dict:
    return live_view(request.app.state.frontend, time.time(), with_text=who.can("operator"))


@router.get("/api/queue")
async def queue_once(request: Request, who: StaffKey) -> dict:
    return _view(request, who)


@router.get("/api/queue/stream")
async def queue_stream(request: Request, who: StaffKey, interval: float = Query(0.5, ge=0.1, le=10)):
    async def events():
        yield "retry: 2000\n\n"
        while not await request.is_disconnected():
            yield f"data: {json.dumps(_view(request, who), separators=(',', ':'))}\n\n"
            await asyncio.sleep(interval)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


@router.get("/api/models")
async def models_info(request: Request, _: StaffKey) -> dict:
    svc = request.app.state.predictor
    p = getattr(svc, "predictor", None)
    fe = request.app.state.frontend

    def meta(clf) -> dict:
        m = clf.meta
        scalars = {k: v for k, v in (m.metrics or {}).items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
        return {"kind": m.kind, "encoder": Path(str(m.encoder)).name, "labels": m.labels, "temperature": m.temperature,
                "escalate_below_trained": m.escalate_below, "bucket_edges": m.bucket_edges, "metrics": scalars,
                "runtime": getattr(clf, "runtime", None)}

    out = {"escalate_below_in_force": fe.escalate_below, "backend": request.app.state.backend.name,
           "served_model": request.app.state.settings.served_model_name, "urgency": None, "length": None}
    if p is not None:
        out["urgency"], out["length"] = meta(p.urgency), meta(p.length)
        out["shared_encoder"] = bool(getattr(p, "shared_encoder", False))
    return out


@router.get("")
async def root(request: Request):
    return RedirectResponse("/ui/queue", status_code=303)


@router.get("/login")
async def login_page() -> FileResponse:
    return FileResponse(STATIC / "login.html", headers={"Cache-Control": "no-store", "Content-Security-Policy": CSP})


@router.get("/{page}")
async def page(request: Request, page: str):
    if page not in PAGES:
        raise APIError(404, f"no console page {page!r}; pages: {', '.join(PAGES)}")
    try:
        who = principal(request)
    except AuthError:
        return RedirectResponse(f"/ui/login?next=/ui/{page}", status_code=303)
    if not any(who.can(r) for r in PAGES[page]):
        allowed = pages_for(who)
        if not allowed:   # a client key: no console at all
            raise AuthError(403, f"a {who.role} key cannot use the operator console")
        body = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Not for this role</title>"
                f"<link rel=stylesheet href=/ui/static/console.css></head><body><main id=main>"
                f"<h1>Not available to a {who.role} key</h1><p>The {TITLES[page]} page needs one of: "
                f"{', '.join(PAGES[page])} (or admin).</p>"
                + (f'<p><a href="/ui/{allowed[0]}">Go to {TITLES[allowed[0]]}</a></p>' if allowed else "")
                + "</main></body></html>")
        return HTMLResponse(body, status_code=403)
    return FileResponse(STATIC / "console.html", headers={"Cache-Control": "no-store", "Content-Security-Policy": CSP})


def mount_static(app) -> None:
    from fastapi.staticfiles import StaticFiles

    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")

