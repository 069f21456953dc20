"""`GET /triage/load` on vLLM's own OpenAI API server.

vLLM 0.32's server takes `--middleware module.Object` (a class is added with
`app.add_middleware`); `triage instance` passes `serving.instance.middleware.TriageLoad`.
This pure ASGI middleware answers one path and hands everything else to vLLM unchanged:

    GET /triage/load  -> 200 load snapshot (serving.instance.load), plus "model" (served
                         names), "scheduler_cls" (as configured) and "fetched_at"
                      -> 501 when the engine does not run our scheduler class
                      -> 503 when the engine does not answer

    POST /triage/relabel  {"id": front end's request id, "level": n}  -> 202
    POST /triage/classes  PriorityClasses.to_dict()                   -> 202
                         (queued for the scheduler's next step, as in process; checked
                         first: an unknown level, a malformed table or one without a level
                         that live requests hold -> 400 with the reason)

It reaches the scheduler through vLLM's engine client (EngineCore utility call
`triage_control("load")`), answered between two engine steps. The snapshot holds
request ids, levels and token counts, never prompt text; like vLLM's own `/metrics`
it is not behind `--api-key` (keep instances on a private network: docs/deploy.md).
"""
from __future__ import annotations

import asyncio
import json
import time

PATH = "/triage/load"
CONTROL = {"/triage/relabel": "relabel", "/triage/classes": "set_classes"}
MAX_BODY = 1 << 20
TIMEOUT_S = 2.0


async def _json(send, status: int, body: dict) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": data})


def _config_facts(state) -> dict:
    out: dict = {}
    cfg = getattr(state, "vllm_config", None)
    if cfg is not None:
        sc = getattr(cfg, "scheduler_config", None)
        cls = getattr(sc, "scheduler_cls", None)
        out["scheduler_cls"] = cls if isinstance(cls, str) or cls is None else f"{cls.__module__}.{cls.__qualname__}"
        out["scheduling_policy"] = str(getattr(sc, "policy", ""))
        mc = getattr(cfg, "model_config", None)
        if mc is not None:
            out["model"] = list(getattr(mc, "served_model_name", None) or []) if not isinstance(
                getattr(mc, "served_model_name", None), str) else [mc.served_model_name]
    return out


class TriageLoad:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("path") in CONTROL:
            return await self._control(scope, receive, send, CONTROL[scope["path"]])
        if scope["type"] != "http" or scope.get("path") != PATH:
            return await self.app(scope, receive, send)
        if scope.get("method") not in ("GET", "HEAD"):
            return await _json(send, 405, {"error": f"{PATH} answers GET only"})
        state = scope["app"].state
        facts = _config_facts(state)
        client = getattr(state, "engine_client", None)
        core = getattr(client, "engine_core", None)
        if core is None:
            return await _json(send, 503, {"error": "the engine client is not ready", **facts})
        try:
            snap = await asyncio.wait_for(core.call_utility_async("triage_control", "load"), TIMEOUT_S)
        except asyncio.TimeoutError:
            return await _json(send, 503, {"error": f"the engine did not answer within {TIMEOUT_S} s", **facts})
        except Exception as e:   # a stock scheduler has no triage_control / no "load" op
            return await _json(send, 501, {"error": "this engine does not run serving.vllm_scheduler."
                                                    f"TriageScheduler ({type(e).__name__}: {e})", **facts})
        snap.update(facts)
        snap["fetched_at"] = time.time()
        return await _json(send, 200, snap)

    async def _control(self, scope, receive, send, op: str) -> None:
        if scope.get("method") != "POST":
            return await _json(send, 405, {"error": f"{scope['path']} answers POST only"})
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if len(body) > MAX_BODY:
                return await _json(send, 413, {"error": f"body over {MAX_BODY} bytes"})
            if not msg.get("more_body"):
                break
        try:
            payload = json.loads(body or b"null")
        except ValueError:
            return await _json(send, 400, {"error": "malformed JSON body"})
        if op == "relabel" and not (isinstance(payload, dict) and "id" in payload and isinstance(payload.get("level"), int)):
            return await _json(send, 400, {"error": 'expected {"id": request id, "level": int}'})
        if op == "set_classes" and not (isinstance(payload, dict) and isinstance(payload.get("classes"), list)):
            return await _json(send, 400, {"error": "expected a class table ({\"classes\": [...], ...})"})
        core = getattr(getattr(scope["app"].state, "engine_client", None), "engine_core", None)
        if core is None:
            return await _json(send, 503, {"error": "the engine client is not ready"})
        try:
            res = await asyncio.wait_for(core.call_utility_async("triage_control", op, payload), TIMEOUT_S)
        except asyncio.TimeoutError:
            return await _json(send, 503, {"error": f"the engine did not answer within {TIMEOUT_S} s"})
        except Exception as e:
            return await _json(send, 501, {"error": f"this engine does not run our scheduler class ({type(e).__name__})"})
        if isinstance(res, dict) and res.get("refused"):   # an unknown level, a malformed table
            return await _json(send, 400, {"error": f"{op} refused: {res['refused']}"})
        return await _json(send, 202, {"queued": op})
