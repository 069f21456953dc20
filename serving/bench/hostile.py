"""Hand-made hostile requests that a schema-driven fuzzer does not produce: bodies over the
limit (declared and chunked), JSON nested 100,000 deep, bytes that are not UTF-8, NUL
characters and unpaired surrogates, integers with a million digits, huge `n`,
`max_tokens`, `logprobs`, a 100 KB API key. Each must end in a clear 4xx with an
OpenAI-style error body; a 5xx, a dropped connection or another body shape is a finding.

    for case in hostile_cases(limit_bytes):
        outcome = send(client, case, key)   # {"name", "status", "server_error", "schema_violation", "why"}
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx

MODEL = "smollm2-135m-instruct"
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Hostile:
    name: str
    path: str
    body: bytes | None                      # raw bytes, sent as they are
    headers: dict = field(default_factory=dict)
    chunked: bool = False                   # stream the body without Content-Length
    method: str = "POST"
    key: str | None = "default"             # "default": the caller's key; None: no Authorization
    may_accept: bool = False                # valid where the backend has no vocabulary (simulated): 200 is fine


def _chat(**kw) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "chest pain"}], **kw}).encode()


def hostile_cases(limit_bytes: int) -> list[Hostile]:
    big = b'{"model": "%s", "messages": [{"role": "user", "content": "' % MODEL.encode()
    big += b"x" * (limit_bytes + 10) + b'"}]}'
    deep = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    deep_obj = b'{"model": "m", "logit_bias": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b"}"
    return [
        Hostile("oversized body (Content-Length)", CHAT, big),
        Hostile("oversized body (chunked, no Content-Length)", CHAT, big, chunked=True),
        Hostile("JSON nested 100,000 arrays deep", CHAT, deep),
        Hostile("JSON nested 50,000 objects deep", CHAT, deep_obj),
        Hostile("invalid UTF-8 in the body", CHAT,
                b'{"model": "%s", "messages": [{"role": "user", "content": "chest \xff\xfe pain"}]}' % MODEL.encode()),
        Hostile("invalid UTF-8 (overlong NUL)", CHAT,
                b'{"model": "%s", "messages": [{"role": "user", "content": "a\xc0\x80b"}]}' % MODEL.encode()),
        Hostile("NUL character in a message", CHAT, _chat(messages=[{"role": "user", "content": "chest\u0000pain"}])),
        Hostile("unpaired surrogate in a message", CHAT,
                b'{"model": "%s", "messages": [{"role": "user", "content": "chest \\ud800 pain"}]}' % MODEL.encode()),
        Hostile("NUL in client_request_id", CHAT, _chat(client_request_id="id\u0000x")),
        Hostile("unpaired surrogate in /v1/triage", "/v1/triage", b'{"text": "\\udfff"}'),
        Hostile("integer with a million digits", CHAT, _chat()[:-1] + b', "max_tokens": ' + b"9" * 1_000_000 + b"}"),
        Hostile("float overflow (1e999999)", CHAT, _chat()[:-1] + b', "temperature": 1e999999}'),
        Hostile("NaN literal", CHAT, _chat()[:-1] + b', "temperature": NaN}'),
        Hostile("n = 1,000,000", CHAT, _chat(n=1_000_000)),
        Hostile("n = 2", CHAT, _chat(n=2)),
        Hostile("max_tokens = 10**30", CHAT, _chat(max_tokens=10 ** 30)),
        Hostile("max_tokens = 2**63", CHAT, _chat(max_tokens=2 ** 63)),
        Hostile("max_completion_tokens = 10**12", CHAT, _chat(max_completion_tokens=10 ** 12)),
        Hostile("min_tokens = 10**12", CHAT, _chat(min_tokens=10 ** 12)),
        Hostile("logprobs = true", CHAT, _chat(logprobs=True)),
        Hostile("top_logprobs = 10**9", CHAT, _chat(top_logprobs=10 ** 9)),
        Hostile("completions logprobs = 10**9", "/v1/completions",
                json.dumps({"model": MODEL, "prompt": "chest pain", "logprobs": 10 ** 9}).encode()),
        Hostile("prompt_logprobs = 5", CHAT, _chat(prompt_logprobs=5)),
        Hostile("seed = 2**64", CHAT, _chat(seed=2 ** 64)),
        # token ids are checked against the vocabulary (400 on vllm); the simulated backend has none
        Hostile("stop_token_ids = [2**40]", CHAT, _chat(stop_token_ids=[2 ** 40], max_tokens=2), may_accept=True),
        Hostile("logit_bias of 60,000 entries", CHAT, _chat(logit_bias={str(i): 1.0 for i in range(60_000)}, max_tokens=2),
                may_accept=True),
        Hostile("10,000 messages", CHAT,
                json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "pain"}] * 10_000}).encode()),
        Hostile("vllm_xargs speaking for the scheduler", CHAT, _chat(vllm_xargs={"triage": {"level": 1}})),
        Hostile("priority from a client key out of range", CHAT, _chat(priority=-10 ** 9)),
        Hostile("slo of 10**300 ms", CHAT, _chat(slo={"ttft_ms": 1e300})),
        Hostile("body that is a JSON string", CHAT, b'"just a string"'),
        Hostile("body that is a huge JSON array", CHAT, b"[" + b"1," * 300_000 + b"1]"),
        Hostile("empty body", CHAT, b""),
        Hostile("text/plain content type", CHAT, _chat(), headers={"Content-Type": "text/plain"}),
        Hostile("API key of 100 KB", "/v1/models", None, method="GET",
                headers={"Authorization": "Bearer tri_" + "a" * 100_000}, key=None),
        Hostile("API key with many underscores", "/v1/models", None, method="GET",
                headers={"Authorization": "Bearer tri_" + "_" * 5_000}, key=None),
        Hostile("unknown key", "/v1/models", None, method="GET",
                headers={"Authorization": "Bearer tri_000000000000_secret"}, key=None),
        Hostile("NUL in an audit path", "/audit/requests/req-%00x", None, method="GET"),
        Hostile("path of 8 KB", "/audit/requests/" + "r" * 8_000, None, method="GET"),
        Hostile("query with NUL", "/audit/latency?since=%00", None, method="GET"),
        Hostile("query since=nan", "/audit/latency?since=nan&until=inf", None, method="GET"),
        Hostile("admin key id with NUL", "/admin/keys/ab%00cd", None, method="DELETE"),
    ]


def send(client: httpx.Client, case: Hostile, key: str | None) -> dict:
    headers = {"Content-Type": "application/json"} if case.body is not None else {}
    if case.key == "default" and key:
        headers["Authorization"] = f"Bearer {key}"
    headers.update(case.headers)
    content = case.body
    if case.chunked and content is not None:
        data = content

        def gen():
            for i in range(0, len(data), 65536):
                yield data[i:i + 65536]

        content = gen()
    out = {"name": case.name, "status": None, "server_error": False, "schema_violation": False, "why": None}
    try:
        r = client.request(case.method, case.path, content=content, headers=headers)
    except httpx.HTTPError as e:   # a dropped connection is not a clear answer either
        out.update(server_error=True, why=f"{type(e).__name__}: {e}")
        return out
    out["status"] = r.status_code
    if r.status_code >= 500:
        out.update(server_error=True, why=r.text[:300])
    elif r.status_code < 400:
        if not (case.may_accept and r.status_code == 200):
            out.update(schema_violation=True, why=f"accepted with {r.status_code}: {r.text[:200]}")
    elif r.status_code not in (431,):   # h11 answers oversized headers itself, before the app
        try:
            err = r.json()["error"]
            ok = isinstance(err.get("message"), str) and err["message"] and {"type", "param", "code"} <= set(err)
        except (ValueError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            out.update(schema_violation=True, why=f"error body is not OpenAI-style: {r.text[:200]}")
    return out
