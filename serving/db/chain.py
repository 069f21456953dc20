"""The audit hash chain.

Each `audit_events` row stores `hash = sha256(prev_hash + canonical_json(row))`, where the
row is {at, kind, actor, request_id, payload} and `prev_hash` is the previous row's hash
(GENESIS for the first). Events about a request or a relabel carry `row_sha256`, the hash
of that table row's canonical JSON, so altering a `requests` or `relabels` row is caught
by `verify` as well as altering the chain itself.
"""
from __future__ import annotations

import hashlib
import json
import math
from types import SimpleNamespace
from typing import Any, Iterable

GENESIS = "0" * 64

def canonical(obj: Any) -> str:
    return json.dumps(_normalise(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _normalise(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {str(k): _normalise(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_normalise(x) for x in v]
    return v


def row_digest(row: dict) -> str:
    """Hash of a table row (requests, relabels) as a dict of plain values."""
    return hashlib.sha256(canonical(_stable(row)).encode()).hexdigest()


def _stable(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        if isinstance(v, float):
            v = round(v, 6)   # floats round-trip through every backend at this precision
        if isinstance(v, bool):
            v = int(v)
        out[k] = v
    return out


def event_hash(prev_hash: str, at: float, kind: str, actor: str | None, request_id: str | None, payload: str) -> str:
    body = canonical({"at": round(at, 6), "kind": kind, "actor": actor, "request_id": request_id, "payload": payload})
    return hashlib.sha256((prev_hash + body).encode()).hexdigest()


def verify_events(rows: Iterable[Any], start: str = GENESIS) -> tuple[bool, int, str | None]:
    """Walk events in id order from the hash `start`. Returns (ok, events checked, first problem)."""
    prev = start
    n = 0
    for r in rows:
        n += 1
        if r.prev_hash != prev:
            return False, n, f"event {r.id}: prev_hash does not match the previous event's hash"
        h = event_hash(r.prev_hash, r.at, r.kind, r.actor, r.request_id, r.payload)
        if h != r.hash:
            return False, n, f"event {r.id}: hash does not match its contents"
        prev = r.hash
    return True, n, None


def verify_export(lines: Iterable[str]) -> dict[str, Any]:
    """Re-verify the JSON lines of `GET /audit/export` without the database. A windowed
    export starts mid-chain: it is checked from its first event's `prev_hash`, which must
    equal the `last_hash` of the export before it (`starts_at_genesis` says which)."""
    events = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            o = json.loads(line)
            events.append(SimpleNamespace(id=o["id"], at=float(o["at"]), kind=o["kind"], actor=o.get("actor"),
                                          request_id=o.get("request_id"), payload=canonical(o["payload"]),
                                          prev_hash=o["prev_hash"], hash=o["hash"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"line {i} is not an audit event ({type(e).__name__}: {e})") from None
    if not events:
        raise ValueError("no audit events in the export")
    ok, n, problem = verify_events(events, start=events[0].prev_hash)
    return {"ok": ok, "events": n, "problem": problem, "first_id": events[0].id, "last_id": events[-1].id,
            "starts_at_genesis": events[0].prev_hash == GENESIS, "first_prev_hash": events[0].prev_hash,
            "last_hash": events[-1].hash}
