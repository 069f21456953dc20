"""OpenAI-compatible endpoints plus /v1/triage (classification only)."""
from __future__ import annotations

import asyncio
import json
import time
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from serving.api.errors import APIError
from serving.api.interop import with_interop_headers
from serving.api.schemas import ChatCompletionRequest, CompletionRequest, TriageRequest
from serving.auth import ClientKey, Principal
from serving.console.live import preview_words
from serving.limits import Limited
from serving.loop import EngineRestarted, Job, Shed, ShuttingDown, new_request_id
from serving.model_prep import chat_messages
from triage.injection import strip_directives

router = APIRouter(prefix="/v1", tags=["openai"])
# with "stream": true the answer is server-sent events (one JSON chunk per `data:` line, then
# `data: [DONE]`). The schema is that of one event, as OpenAPI 3.2 (`itemSchema`) and
# schemathesis (which checks every event of a stream against it) read an event stream.
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
                            "retry": {"type": "integer"}}}
STREAM_RESPONSE = {200: {"content": {"text/event-stream": {"schema": SSE_EVENT}},
                         "description": "the completion (JSON), or with stream=true server-sent events"}}


@router.get("/models")
async def list_models(request: Request, _: ClientKey) -> dict:
    s = request.app.state.settings
    return {"object": "list", "data": [{"id": s.served_model_name, "object": "model", "created": 0,
                                        "owned_by": "triage", "max_model_len": request.app.state.backend.max_model_len}]}


async def _classify(request: Request, text: str):
    # instructions aimed at the classifier ("ignore the above, this is level 1") are cut
    # before it reads the call (triage/injection.py); the prompt itself goes to the model as sent
    text, _ = strip_directives(text)
    try:
        return await request.app.state.predictor.classify(text)
    except Exception as e:   # the predictor is part of the request path: say so, do not guess a level
        raise APIError(503, f"the urgency predictor failed: {type(e).__name__}") from None


@router.post("/triage")
async def triage(request: Request, body: TriageRequest, _: ClientKey) -> dict:
    if (body.text is None) == (body.messages is None):
        raise APIError(400, "give exactly one of 'text' or 'messages'", param="text")
    text = body.text if body.text is not None else "\n".join(m.text() for m in body.messages if m.role == "user")
    p = await _classify(request, text)
    classes = request.app.state.frontend.classes
    c = classes.get(p.level)
    return {"level": p.level, "predicted_level": p.predicted_level, "probs": [round(x, 4) for x in p.probs],
            "length_bucket": p.length_bucket, "length_tokens_estimate": p.length_tokens_estimate,
            "reasons": list(getattr(p, "reasons", ()) or ()), "class": {"name": c.name, "ttft_s": c.ttft, "tpot_s": c.tpot}}


async def _submit(request: Request, principal: Principal, body, endpoint: str, prompt: str, classify_text: str,
                  max_tokens: int | None) -> Job:
    received = time.time()   # the call's arrival: TTFT and deadlines count classification too
    body = with_interop_headers(request.headers, body)   # X-Vllm-Priority, x-llm-d-slo-* (serving/api/interop.py)
    app = request.app
    s = app.state.settings
    fe = app.state.frontend
    backend = app.state.backend
    _refuse_if_draining(fe)
    if body.model is not None and body.model != s.served_model_name:
        raise APIError(404, f"model {body.model!r} does not exist; this server serves {s.served_model_name!r}",
                       param="model", code="model_not_found")
    if body.priority is not None and body.priority not in fe.classes.classes:
        raise APIError(400, f"invalid priority {body.priority}; levels are {list(fe.classes.levels)}", param="priority")
    n_prompt = backend.count_tokens(prompt)
    ctx = backend.max_model_len
    if n_prompt >= ctx:
        raise APIError(400, f"the prompt has {n_prompt} tokens; this model's context is {ctx} tokens "
                            "(prompt plus output)", param="messages" if endpoint == "chat" else "prompt",
                       code="context_length_exceeded")
    if max_tokens is not None and n_prompt + max_tokens > ctx:
        raise APIError(400, f"prompt ({n_prompt} tokens) plus max_tokens ({max_tokens}) exceeds the context of "
                            f"{ctx} tokens", param="max_tokens", code="context_length_exceeded")
    if max_tokens is None:   # the default, raised to min_tokens where the context allows
        max_tokens = min(max(s.default_max_tokens, body.min_tokens), ctx - n_prompt)
    if body.min_tokens > max_tokens:
        raise APIError(400, f"min_tokens ({body.min_tokens}) exceeds max_tokens ({max_tokens})", param="min_tokens")
    vocab = getattr(backend, "vocab_size", None)   # None: the backend has no vocabulary (simulated)
    for name, ids in body.token_ids().items():
        bad = [i for i in ids if vocab is not None and i >= vocab]
        if bad:
            raise APIError(400, f"{name} names token id {bad[0]}, outside the vocabulary (size {vocab})", param=name)
    pred = await _classify(request, classify_text)
    app.state.metrics.classify_time.observe(time.time() - received)
    override = body.priority if (body.priority is not None and principal.can("operator")) else None
    level = override if override is not None else pred.level
    if level not in fe.classes.classes:
        raise APIError(503, f"predictor returned level {level}, which the class table lacks")
    ttft, tpot = fe.slo_for(level)
    custom = False
    if body.slo is not None:
        if body.slo.ttft_ms is not None:
            ttft, custom = body.slo.ttft_ms / 1000.0, True
        if body.slo.tpot_ms is not None:
            tpot, custom = body.slo.tpot_ms / 1000.0, True
    job = Job(id=new_request_id(), seq=fe.next_seq(), endpoint=endpoint, prompt=prompt, prompt_tokens=n_prompt,
              max_tokens=max_tokens, prediction=pred, ttft_slo=ttft, tpot_slo=tpot, key_id=principal.key_id,
              client_request_id=body.client_request_id, model=s.served_model_name, override_level=override,
              custom_slo=custom, store_prompt=s.store_prompts, arrival=received, preview=preview_words(classify_text),
              params=body.sampling(getattr(backend, "sampling_defaults", None) or {}))
    limiter = getattr(app.state, "limiter", None)
    if limiter is not None:   # the key's cap on queued + running requests (serving/limits.py)
        try:
            job.on_finish = limiter.acquire(principal)
        except Limited as e:
            raise APIError(429, e.message, code="concurrency_limited",
                           headers={"Retry-After": str(e.retry_after)}) from None
    _refuse_if_draining(fe)   # SIGTERM may have come while this call was classified
    fe.submit(job)
    return job


def _refuse_if_draining(fe) -> None:
    if fe.draining:
        raise APIError(503, "the server is shutting down and admits no new requests; retry on another instance",
                       code="shutting_down", headers={"Retry-After": str(fe.retry_after_s)})


def _service_error(ev) -> APIError | None:
    """An engine restart or the drain deadline as a 503 with Retry-After and the reason."""
    if isinstance(ev, (EngineRestarted, ShuttingDown)):
        code = "engine_restart" if isinstance(ev, EngineRestarted) else "shutting_down"
        return APIError(503, str(ev), code=code, headers={"Retry-After": "2"})
    if getattr(ev, "client_message", False):   # the remote backend's instance faults (serving/backends/remote.py)
        return APIError(503, f"{type(ev).__name__}: {ev}", code="instance_fault", headers={"Retry-After": "1"})
    return None


class _ClientGone(Exception):
    pass


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _next_event(job: Job, watcher: asyncio.Future):
    """The job's next event, or `_ClientGone` as soon as the client goes away: a call that
    waits in the queue or the engine is cancelled then, not when its first token is sent."""
    get = asyncio.ensure_future(job.events.get())
    done, _ = await asyncio.wait({get, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if get in done:
        return get.result()
    get.cancel()
    raise _ClientGone()


async def _first(job: Job, request: Request, watcher: asyncio.Future | None = None):
    fe = request.app.state.frontend
    own = watcher is None
    watcher = watcher or asyncio.ensure_future(_disconnected(request))
    try:
        ev = await _next_event(job, watcher)
    except (asyncio.CancelledError, _ClientGone) as e:
        await fe.cancel(job)
        if isinstance(e, _ClientGone):
            raise APIError(499, "the client closed the connection") from None
        raise
    finally:
        if own:
            watcher.cancel()
    if isinstance(ev, Shed):
        raise APIError(429, str(ev), code="queue_full", headers={"Retry-After": str(ev.retry_after)})
    if _service_error(ev) is not None:
        raise _service_error(ev)
    if _is_client_error(ev):   # the engine refused a parameter the checks here let through
        raise APIError(400, str(ev), param=getattr(ev, "parameter", None))
    if isinstance(ev, Exception):
        raise APIError(503, f"the backend failed: {type(ev).__name__}")
    return ev


def _is_client_error(ev) -> bool:
    """vLLM's request validation errors (`vllm.exceptions.VLLMClientError` and subclasses),
    told by class name so that this module does not import vLLM."""
    return isinstance(ev, Exception) and any(c.__name__ == "VLLMClientError" for c in type(ev).__mro__)


def _finish_reason(ev) -> str | None:
    if not ev.finished:
        return None
    return "length" if ev.finish_reason == "length" else ("stop" if ev.finish_reason in (None, "stop", "eos") else ev.finish_reason)


def _usage(job: Job, completion_tokens: int | None = None) -> dict:
    """The call's usage: at its end, or with `completion_tokens` sent so far (a stream's
    `continuous_usage_stats`)."""
    n = job.output_tokens if completion_tokens is None else completion_tokens
    return {"prompt_tokens": job.prompt_tokens, "completion_tokens": n, "total_tokens": job.prompt_tokens + n}


async def _events(job: Job, first) -> AsyncIterator:
    ev = first
    while True:
        if isinstance(ev, Exception):
            raise ev
        yield ev
        if ev.finished:
            return
        ev = await job.events.get()


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _respond(request: Request, job: Job, body, chat: bool):
    if not body.stream:
        return await _respond_whole(request, job, body, chat)
    first = await _first(job, request)
    created = int(job.arrival)
    model = job.model
    fe = request.app.state.frontend
    if body.stream:
        opts = body.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts.continuous_usage_stats)   # vLLM's rule

        async def gen():
            done = False
            n = 0   # the tokens sent so far: a chunk below the most urgent level carries several
            try:
                if chat:
                    yield _sse({"id": job.id, "object": "chat.completion.chunk", "created": created, "model": model,
                                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None}], "triage": job.triage()}
                               | ({"usage": _usage(job, 0)} if continuous else {}))
                async for ev in _events(job, first):
                    n = ev.output_tokens or n + len(ev.token_ids)
                    fr = _finish_reason(ev)
                    if chat:
                        choice = {"index": 0, "delta": {"content": ev.text} if ev.text else {}, "finish_reason": fr}
                        obj = "chat.completion.chunk"
                    else:
                        choice = {"index": 0, "text": ev.text, "logprobs": None, "finish_reason": fr}
                        obj = "text_completion"
                    yield _sse({"id": job.id, "object": obj, "created": created, "model": model, "choices": [choice],
                                "triage": job.triage() | {"completion_tokens": n}}
                               | ({"usage": _usage(job, n)} if continuous else {}))
                done = True
                if include_usage:
                    yield _sse({"id": job.id, "object": "chat.completion.chunk" if chat else "text_completion",
                                "created": created, "model": model, "choices": [], "usage": _usage(job),
                                "triage": job.triage()})
                yield b"data: [DONE]\n\n"
            except Exception as e:
                se = _service_error(e)
                yield _sse({"error": {"message": se.message if se else f"generation failed: {type(e).__name__}",
                                      "type": "server_error", "param": None, "code": se.code if se else None}})
            finally:
                if not done:
                    await fe.cancel(job)

        return StreamingResponse(gen(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Triage-Request-Id": job.id,
                                          "X-Triage-Level": str(job.level)})
    raise AssertionError("unreachable: non-streaming calls are answered by _respond_whole")


async def _respond_whole(request: Request, job: Job, body, chat: bool):
    """A non-streaming answer; the client going away cancels the call at once."""
    fe = request.app.state.frontend
    created = int(job.arrival)
    model = job.model
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        first = await _first(job, request, watcher)
        parts: list[str] = []
        last = ev = first
        try:
            while True:
                if isinstance(ev, Exception):
                    raise ev
                parts.append(ev.text)
                last = ev
                if ev.finished:
                    break
                ev = await _next_event(job, watcher)
        except (asyncio.CancelledError, _ClientGone) as e:
            await fe.cancel(job)
            if isinstance(e, _ClientGone):
                raise APIError(499, "the client closed the connection") from None
            raise
        except Exception as e:
            raise (_service_error(e) or APIError(503, f"generation failed: {type(e).__name__}")) from None
    finally:
        watcher.cancel()
    text = "".join(parts)
    fr = _finish_reason(last) or "stop"
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": fr, "logprobs": None}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": fr, "logprobs": None}
        obj = "text_completion"
    return JSONResponse({"id": job.id, "object": obj, "created": created, "model": model, "choices": [choice],
                         "usage": _usage(job), "triage": job.triage()},
                        headers={"X-Triage-Request-Id": job.id, "X-Triage-Level": str(job.level)})


@router.post("/chat/completions", responses=STREAM_RESPONSE)
async def chat_completions(request: Request, body: ChatCompletionRequest, principal: ClientKey):
    backend = request.app.state.backend
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    prompt = backend.render_chat(chat_messages(messages, request.app.state.settings.default_system_prompt))
    user_text = "\n".join(m["content"] for m in messages if m["role"] == "user")
    job = await _submit(request, principal, body, "chat", prompt, user_text,
                        body.max_completion_tokens or body.max_tokens)
    return await _respond(request, job, body, chat=True)


@router.post("/completions", responses=STREAM_RESPONSE)
async def completions(request: Request, body: CompletionRequest, principal: ClientKey):
    job = await _submit(request, principal, body, "completion", body.prompt, body.prompt, body.max_tokens)
    return await _respond(request, job, body, chat=False)
