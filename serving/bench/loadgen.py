"""The load generator: streaming chat completions posted at planned offsets, timed at
the client (send, first content token, every chunk, end), as a user of either server
would see them. One `Call` in, one `Result` out; errors are results, never exceptions.

The generator runs inside the bench process, whose heap (the classifier that labelled the
calls, the plotting and report code) is large: a full garbage collection in the middle of a
burst stopped it for 0.23-0.6 s (measured with a gc callback, 2026-11-28), posting the calls
planned meanwhile all at once, a wave no real set of callers sends (`client_late_max_ms` 592-624
ms in runs against our front end, whose chunks allocate more, 30-34 ms against stock vLLM).
`run_calls` therefore collects and freezes the heap before its first call, as vLLM's and our
own API servers do after start-up (serving/gc_heap.py), and unfreezes it after the last.
"""
from __future__ import annotations

import asyncio
import gc
import json
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx

from serving.model_prep import chat_messages, served_sampling_defaults


@dataclass(frozen=True)
class Call:
    idx: int
    text: str
    gold: int                  # the true urgency (reports are per gold level)
    kind: str                  # dispatch | chat
    at: float                  # seconds after the start
    max_tokens: int
    predicted: int | None = None   # our classifier's level (sent as `priority` to vllm-priority)
    ignore_eos: bool = False


@dataclass
class Result:
    call: Call
    sent: float = 0.0
    first: float | None = None
    end: float | None = None
    tokens: int = 0
    chunk_times: list[float] = field(default_factory=list)
    # the tokens received by each chunk's end, where the server says (our service's chunks carry
    # `triage.completion_tokens`: below the most urgent level a chunk holds several tokens)
    chunk_tokens: list[int] = field(default_factory=list)
    level: int | None = None       # the level the system served it at
    request_id: str | None = None  # our service's id for the call (its audit row), None for stock vLLM
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and self.first is not None

    def token_times(self) -> list[float]:
        """One time per output token: each token at the arrival of the chunk that brought it
        (one a chunk where the server does not say how many), any the chunks do not account
        for (usage counts every token) at the end."""
        if len(self.chunk_tokens) == len(self.chunk_times):
            t, before = [], 0
            for at, upto in zip(self.chunk_times, self.chunk_tokens):
                t += [at] * max(0, min(upto, self.tokens) - before)
                before = max(before, upto)
        else:
            t = list(self.chunk_times[: self.tokens])
        if self.end is not None:
            t += [self.end] * (self.tokens - len(t))
        return t


def body_for(call: Call, model: str, *, send_priority: bool, temperature: float) -> dict:
    """The call as a streaming chat completion. The system turn and the sampling defaults our
    service applies to a call that sets none are sent explicitly, so stock vLLM gets the very
    same request (its server drops frequency_penalty from generation_config.json)."""
    body = {**served_sampling_defaults(), "model": model, "messages": chat_messages([{"role": "user", "content": call.text}]),
            "stream": True, "max_tokens": call.max_tokens, "temperature": temperature,
            "stream_options": {"include_usage": True}}
    if call.ignore_eos:
        body["ignore_eos"] = True
    if send_priority and call.predicted is not None:
        body["priority"] = int(call.predicted)
    return body


async def _one(client: httpx.AsyncClient, call: Call, body: dict, t0: float) -> Result:
    res = Result(call)
    await asyncio.sleep(max(0.0, t0 + call.at - time.perf_counter()))
    res.sent = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200].decode(errors='replace')}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                now = time.perf_counter()
                if "error" in obj:
                    res.error = f"stream error: {obj['error'].get('message', obj['error'])}"
                    return res
                if res.level is None and isinstance(obj.get("triage"), dict):
                    res.level = int(obj["triage"]["level"])
                    res.request_id = obj["triage"].get("request_id")
                said = (obj.get("triage") or {}).get("completion_tokens")
                for ch in obj.get("choices") or []:
                    if (ch.get("delta") or {}).get("content"):
                        res.chunk_times.append(now)
                        if isinstance(said, int):
                            res.chunk_tokens.append(said)
                        if res.first is None:
                            res.first = now
                if obj.get("usage"):
                    res.tokens = int(obj["usage"].get("completion_tokens") or 0)
        res.end = time.perf_counter()
        if res.tokens == 0:
            res.tokens = len(res.chunk_times)
        if res.first is None:
            res.error = "no token received"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


_running = 0   # run_calls in progress (bench cluster runs one per stock instance at once)


async def run_calls(url: str, key: str | None, model: str, calls: list[Call], *, send_priority: bool = False,
                    temperature: float = 0.0, timeout_s: float = 900.0,
                    on_done: Callable[[Result], None] | None = None) -> list[Result]:
    """Post every call at its offset (concurrently), return results in call order."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Limits(max_connections=len(calls) + 8, max_keepalive_connections=len(calls) + 8)
    global _running
    if not _running:
        gc.collect()
        gc.freeze()   # the bench's own heap out of the collections a burst's allocations trigger
    _running += 1
    try:
        return await _run(url, headers, limits, calls, model, send_priority, temperature, timeout_s, on_done)
    finally:
        _running -= 1
        if not _running:
            gc.unfreeze()


async def _run(url, headers, limits, calls, model, send_priority, temperature, timeout_s, on_done) -> list[Result]:
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=httpx.Timeout(timeout_s, connect=30.0),
                                 limits=limits) as client:
        t0 = time.perf_counter() + 0.2

        async def one(c: Call) -> Result:
            res = await _one(client, c, body_for(c, model, send_priority=send_priority, temperature=temperature), t0)
            if res.level is None and send_priority:
                res.level = c.predicted
            if on_done:
                on_done(res)
            return res

        return list(await asyncio.gather(*(one(c) for c in calls)))


async def idle_ttft(url: str, key: str | None, model: str, text: str, n: int = 3) -> float:
    """Median first-token time of `n` single calls on an idle server (the floor), in s."""
    out = []
    for i in range(n):
        [r] = await run_calls(url, key, model, [Call(i, text, 1, "dispatch", 0.0, 8)])
        if r.ttft is not None:
            out.append(r.ttft)
    out.sort()
    return out[len(out) // 2] if out else float("nan")
