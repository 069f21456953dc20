"""`triage bench load`: N concurrent streaming clients against a real `triage serve`
(uvicorn, its own process, loopback), then the audit database is read back.

Every stream is a chat completion with `ignore_eos` and a fixed `max_tokens`, tagged
`client_request_id = load-<i>`, so each outcome is unambiguous:

    completed : HTTP 200, the stream ended with [DONE] and carried max_tokens tokens
    errors    : a clear error: an HTTP 4xx/5xx with an error body, or an error event in the stream
    lost      : neither (connection dropped, timeout, a stream cut short without an error)

`audit_rows` counts the `requests` rows tagged load-*; every request should leave one.

The front end's own added latency of a completed stream is what the client waited for its
first token minus the time the engine itself took (from the front end handing the
request to the backend until the backend produced the first token; from its audit row):

    added = (client first token - client send) - (row.first_token - row.dispatched)

It holds HTTP parsing, auth and limits, classification, our queue and dispatch, and the
delivery of the token back through the event loop and the socket. The admission bound
(`max_inflight`) is raised to the stream count so waiting for engine capacity happens in
the engine and is not counted as front-end time. Server memory is the peak RSS of the
server's process tree (the API process plus engine processes, if any), sampled every
0.25 s.
"""
from __future__ import annotations

import asyncio
import json
import math
import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx
import numpy as np

from serving.bench.systems import MODEL_NAME, EngineSizes, admin_key, start_system

TEXTS = [
    "My neighbour fell off a ladder and is not moving.",
    "I have had a mild headache since this morning.",
    "Can I get a refill of my inhaler prescription?",
    "My child has a fever of 39C and is very sleepy.",
    "Chest pain spreading to my left arm, sweating.",
    "What are the opening hours of the clinic?",
    "Twisted my ankle playing football, it is swollen.",
    "Elderly man confused and slurring his words since an hour.",
]


@dataclass
class Stream:
    i: int
    sent: float = 0.0
    first: float | None = None
    end: float | None = None
    status: int | None = None
    tokens: int = 0
    done: bool = False
    finish_reason: str | None = None
    error: str | None = None      # a clear error the client was given
    failure: str | None = None    # what went wrong when there was no clear answer

    def outcome(self, max_tokens: int) -> str:
        if self.error is not None:
            return "error"
        if self.done and self.failure is None and self.tokens == max_tokens and self.first is not None:
            return "completed"
        return "lost"


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


async def _one(client: httpx.AsyncClient, s: Stream, body: dict, start_at: float, gate: asyncio.Event | None) -> Stream:
    await asyncio.sleep(max(0.0, start_at - time.time()))
    s.sent = time.time()

    async def trace(name: str, info) -> None:
        # the request is on the wire: time spent before (pool, connect) is the load generator's
        if name == "http11.send_request_body.complete":
            s.sent = time.time()

    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, extensions={"trace": trace}) as r:
            s.status = r.status_code
            if r.status_code != 200:
                raw = await r.aread()
                try:
                    s.error = f"HTTP {r.status_code}: {json.loads(raw)['error']['message']}"
                except (ValueError, KeyError, TypeError):
                    s.failure = f"HTTP {r.status_code} without an error body: {raw[:120]!r}"
                return s
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    s.done = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    s.error = f"stream error: {obj['error'].get('message')}"
                    break
                for ch in obj.get("choices") or []:
                    if (ch.get("delta") or {}).get("content") and s.first is None:
                        s.first = time.time()
                    if ch.get("finish_reason"):
                        s.finish_reason = ch["finish_reason"]
                if obj.get("usage"):
                    s.tokens = int(obj["usage"].get("completion_tokens") or 0)
        s.end = time.time()
        if not s.done and s.error is None:
            s.failure = "stream ended without [DONE] or an error event"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        s.failure = f"{type(e).__name__}: {e}"
    return s


async def drive(url: str, keys: list[str], n: int, *, max_tokens: int, ramp_s: float, timeout_s: float,
                on_done: Callable[[Stream], None] | None = None, open_counter: list | None = None) -> list[Stream]:
    limits = httpx.Limits(max_connections=n + 16, max_keepalive_connections=n + 16)
    clients = [httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {k}"}, limits=limits,
                                 timeout=httpx.Timeout(timeout_s)) for k in keys]
    t0 = time.time() + 0.5
    opened = [0, 0]   # now, peak

    async def one(i: int) -> Stream:
        body = {"model": MODEL_NAME, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0, "stream_options": {"include_usage": True}, "client_request_id": f"load-{i}",
                "messages": [{"role": "user", "content": f"{TEXTS[i % len(TEXTS)]} (call {i})"}]}
        s = Stream(i)
        at = t0 + (ramp_s * i / max(1, n - 1) if n > 1 else 0.0)
        await asyncio.sleep(max(0.0, at - time.time()))
        opened[0] += 1
        opened[1] = max(opened[1], opened[0])
        try:
            await _one(clients[i % len(clients)], s, body, at, None)
        finally:
            opened[0] -= 1
        if on_done:
            on_done(s)
        return s

    try:
        res = list(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        for c in clients:
            await c.aclose()
    if open_counter is not None:
        open_counter.append(opened[1])
    return res


class RssSampler:
    """Peak resident memory of a process and its descendants, sampled in a thread."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.every_s = every_s
        self.peak = 0
        self.api_peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                api = self.proc.memory_info().rss
                total = api
                for c in self.proc.children(recursive=True):
                    try:
                        total += c.memory_info().rss
                    except psutil.Error:
                        pass
                self.api_peak = max(self.api_peak, api)
                self.peak = max(self.peak, total)
            except psutil.Error:
                return
            self._stop.wait(self.every_s)

    def __enter__(self) -> "RssSampler":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(5)


def _rows(db_url: str) -> dict[int, dict]:
    from sqlalchemy import create_engine, text

    eng = create_engine(db_url)
    try:
        with eng.connect() as c:
            rows = c.execute(text("SELECT client_request_id, arrival, dispatched, first_token, outcome FROM requests "
                                  "WHERE client_request_id LIKE 'load-%'")).mappings().all()
    finally:
        eng.dispose()
    return {int(r["client_request_id"].split("-", 1)[1]): dict(r) for r in rows}


def _pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 2) if xs else None


def run_load(streams: int, backend: str, *, workdir: Path, port: int, model: str, max_tokens: int = 64,
             ramp_s: float = 0.0, keys: int = 10, timeout_s: float = 900.0, sim_speed: float = 1.0,
             on_done: Callable[[Stream], None] | None = None, env: dict | None = None,
             ready_timeout_s: float = 600.0) -> tuple[dict, dict]:
    """Returns (the issue's summary, details). The client's send time is taken when the
    request body is on the wire (httpcore trace), so a busy load generator's own queueing
    before the send is not charged to the server."""
    raise_fd_limit()
    per_key = math.ceil(streams / max(1, keys))
    big = {"rps": 100_000, "burst": 100_000, "concurrency": per_key + 8}
    triage_env = {"TRIAGE_BACKEND": backend, "TRIAGE_MAX_INFLIGHT": str(max(streams + 8, 512)),
                  "TRIAGE_MAX_QUEUE": str(max(streams + 8, 1024)), "TRIAGE_SIM_SPEED": str(sim_speed),
                  "TRIAGE_ROLE_LIMITS": json.dumps({"client": big, "admin": big}), **(env or {})}
    workdir.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{workdir / 'triage' / 'audit.db'}"
    with start_system("triage", EngineSizes(), port=port, workdir=workdir / "triage", model=model,
                      triage_env=triage_env, timeout_s=ready_timeout_s) as srv:
        admin = admin_key(srv.log)
        if not admin:
            raise RuntimeError("the server did not print its first admin key")
        with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as c:
            client_keys = []
            for k in range(keys):
                r = c.post("/admin/keys", json={"role": "client", "name": f"bench-load-{k}"})
                r.raise_for_status()
                client_keys.append(r.json()["key"])
        peak_open: list[int] = []
        with RssSampler(srv.proc.pid) as rss:
            t0 = time.time()
            res = asyncio.run(drive(srv.url, client_keys, streams, max_tokens=max_tokens, ramp_s=ramp_s,
                                    timeout_s=timeout_s, on_done=on_done, open_counter=peak_open))
            wall = time.time() - t0
        # the audit writer batches every writer_interval_s: wait until the rows stop arriving
        rows, last, t1 = {}, -1, time.time()
        while time.time() - t1 < 60:
            rows = _rows(db_url)
            if len(rows) == last and len(rows) >= sum(1 for s in res if s.status == 200):
                break
            last = len(rows)
            time.sleep(1.0)
        with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {admin}"}, timeout=300) as c:
            chain = c.get("/audit/verify").json()
    outcomes = [s.outcome(max_tokens) for s in res]
    added, pre, fe_queue, engine, deliver = [], [], [], [], []
    for s in res:
        row = rows.get(s.i)
        if s.outcome(max_tokens) != "completed" or not row or row["first_token"] is None or row["dispatched"] is None:
            continue
        eng = row["first_token"] - row["dispatched"]
        added.append(1000 * ((s.first - s.sent) - eng))
        pre.append(1000 * (row["arrival"] - s.sent))
        fe_queue.append(1000 * (row["dispatched"] - row["arrival"]))
        engine.append(1000 * eng)
        deliver.append(1000 * (s.first - row["first_token"]))
    summary = {"streams": streams, "completed": outcomes.count("completed"), "errors": outcomes.count("error"),
               "lost": outcomes.count("lost"), "audit_rows": len(rows), "p50_added_ms": _pct(added, 50),
               "p99_added_ms": _pct(added, 99), "server_rss_mb": round(rss.peak / 2 ** 20, 1)}
    details = {
        "backend": backend, "max_tokens": max_tokens, "ramp_s": ramp_s, "keys": keys, "sim_speed": sim_speed,
        "peak_open_streams": peak_open[0] if peak_open else None, "wall_s": round(wall, 1),
        "tokens_per_s": round(sum(s.tokens for s in res) / wall, 1) if wall > 0 else None,
        "api_rss_mb": round(rss.api_peak / 2 ** 20, 1), "audit_chain": chain,
        "added_ms": {"p50": _pct(added, 50), "p90": _pct(added, 90), "p99": _pct(added, 99), "max": _pct(added, 100)},
        "parts_p50_p99_ms": {"http_auth_parse": [_pct(pre, 50), _pct(pre, 99)],
                             "classify_and_dispatch": [_pct(fe_queue, 50), _pct(fe_queue, 99)],
                             "delivery": [_pct(deliver, 50), _pct(deliver, 99)],
                             "engine_ttft (not counted)": [_pct(engine, 50), _pct(engine, 99)]},
        "errors_seen": sorted({s.error for s in res if s.error})[:5],
        "lost_seen": sorted({s.failure or "short stream" for s in res if s.outcome(max_tokens) == "lost"})[:5],
        "audit_outcomes": {o: sum(1 for r in rows.values() if r["outcome"] == o)
                           for o in sorted({r["outcome"] for r in rows.values()})},
        "workdir": str(workdir),
    }
    return summary, {"added": added, **details}
