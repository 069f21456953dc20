"""Abuse limits and key management against a real server (uvicorn on loopback, SQLite
file, real predictors, simulated backend): per-key rate limits and concurrency caps by
role (429 with Retry-After), revocation and rotation without a restart (API and CLI),
admin actions in the hash-chained audit log."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from conftest import Server, chat, make_keys, make_settings

ROOT = Path(__file__).resolve().parents[2]
LIMITS = {"client": {"rps": 0.5, "burst": 5, "concurrency": 2}}


@pytest.fixture(scope="module")
def limited(tmp_path_factory, predictors_dir):
    tmp = tmp_path_factory.mktemp("abuse")
    url = f"sqlite:///{tmp / 'audit.db'}"
    keys = make_keys(url)
    keys["client2"] = make_keys(url)["client"]
    # sim_speed 0.5: a 30-token answer streams for about a second (the cap test holds two open)
    s = make_settings(url, tmp, predictors_dir, role_limits=LIMITS, key_cache_s=0.5, sim_speed=0.5,
                      max_inflight=8, default_max_tokens=8)
    with Server(s) as srv:
        srv.keys, srv.db_url, srv.tmp = keys, url, tmp
        yield srv


def _models(srv, key) -> httpx.Response:
    return srv.client(key).get("/v1/models")


def _wait_tokens(srv, key_id: str, n: int = 0, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while srv.state.limiter.active(key_id) != n:
        assert time.monotonic() < deadline, f"key {key_id} still holds {srv.state.limiter.active(key_id)} slots"
        time.sleep(0.05)


def test_rate_limit_is_per_key_with_retry_after(limited):
    with limited.client(limited.keys["client"]) as c:
        codes = [c.get("/v1/models").status_code for _ in range(8)]
        assert codes[:5] == [200] * 5 and codes[5:] == [429] * 3, codes   # a burst of 5, then 0.5 per second
        r = c.get("/v1/models")
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
    assert "0.5 requests per second" in r.json()["error"]["message"]
    wait = int(r.headers["Retry-After"])
    assert 1 <= wait <= 2
    # another client key and an operator key are not slowed by the first key's flood
    assert _models(limited, limited.keys["client2"]).status_code == 200
    assert [_models(limited, limited.keys["operator"]).status_code for _ in range(10)] == [200] * 10
    time.sleep(wait)
    assert _models(limited, limited.keys["client"]).status_code == 200
    assert 'triage_rate_limited_total{reason="rate",role="client"}' in limited.client().get("/metrics").text


def test_concurrency_cap_per_key_and_slots_come_back(limited):
    key = make_keys(limited.db_url)["client"]   # a fresh key: a full bucket
    kid = key.split("_")[1]
    body = {"model": "smollm2-135m-instruct", "stream": True, "max_tokens": 30, "ignore_eos": True,
            "messages": [{"role": "user", "content": "question about my bill"}]}

    async def run():
        async with httpx.AsyncClient(base_url=limited.url, timeout=60, headers={"Authorization": f"Bearer {key}"}) as c:
            async def stream():
                async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    assert r.status_code == 200
                    return [line async for line in r.aiter_lines() if line.startswith("data: ")]

            held = [asyncio.create_task(stream()) for _ in range(2)]
            await asyncio.sleep(0.5)
            third = await c.post("/v1/chat/completions", json={**body, "stream": False})
            other = await asyncio.to_thread(chat, limited.client(limited.keys["client2"]), "question about my bill",
                                            max_tokens=2)
            outs = await asyncio.gather(*held)
            return third, other, outs

    third, other, outs = asyncio.run(run())
    assert third.status_code == 429 and third.json()["error"]["code"] == "concurrency_limited", third.text
    assert int(third.headers["Retry-After"]) >= 1
    assert other.status_code == 200   # a different key at the same level is not held back
    assert all(o[-1] == "data: [DONE]" for o in outs)
    _wait_tokens(limited, kid, 0)
    assert chat(limited.client(key), "question about my bill", max_tokens=2).status_code == 200


def test_client_that_vanishes_mid_stream_gives_its_slot_back(limited):
    key = make_keys(limited.db_url)["client"]
    kid = key.split("_")[1]
    body = {"model": "smollm2-135m-instruct", "stream": True, "max_tokens": 60, "ignore_eos": True,
            "messages": [{"role": "user", "content": "question about parking"}]}
    for _ in range(3):   # more than the cap of 2: leaked slots would show as a 429
        with httpx.Client(base_url=limited.url, timeout=30, headers={"Authorization": f"Bearer {key}"}) as c:
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                next(r.iter_lines())   # one chunk, then hang up
        time.sleep(0.1)
    _wait_tokens(limited, kid, 0)


def _events(srv, kind: str) -> list:
    from serving.db.models import AuditEventRow

    srv.state.writer.sync(10)
    with Session(srv.state.db) as s:
        return list(s.scalars(select(AuditEventRow).where(AuditEventRow.kind == kind)))


def test_revoke_and_rotate_through_the_api_without_restart(limited):
    admin = limited.client(limited.keys["admin"])
    admin_id = limited.keys["admin"].split("_")[1]
    r = admin.post("/admin/keys", json={"role": "client", "name": "ambulance app"})
    assert r.status_code == 201, r.text
    new = r.json()
    assert new["key"].startswith(f"tri_{new['id']}_") and new["role"] == "client"
    assert _models(limited, new["key"]).status_code == 200          # checked and now cached
    r = admin.delete(f"/admin/keys/{new['id']}")
    assert r.status_code == 200 and r.json()["revoked"] is True
    r = _models(limited, new["key"])                                 # at once, cache or not
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]

    r = admin.post("/admin/keys", json={"role": "operator", "name": "night shift"})
    old = r.json()
    assert limited.client(old["key"]).get("/admin/queue").status_code == 200
    r = admin.post(f"/admin/keys/{old['id']}/rotate")
    assert r.status_code == 201, r.text
    rot = r.json()
    assert rot["replaces"] == old["id"] and rot["role"] == "operator" and rot["name"] == "night shift"
    assert limited.client(old["key"]).get("/admin/queue").status_code == 401
    assert limited.client(rot["key"]).get("/admin/queue").status_code == 200
    listed = {k["id"]: k for k in admin.get("/admin/keys").json()["keys"]}
    assert listed[old["id"]]["revoked"] and not listed[rot["id"]]["revoked"]
    assert all("key" not in k and "hash" not in k and "salt" not in k for k in listed.values())

    assert admin.delete("/admin/keys/ffffffffffff").status_code == 404
    assert limited.client(limited.keys["operator"]).get("/admin/keys").status_code == 403   # admins only
    # the last active admin key cannot be revoked (nobody could manage keys afterwards)
    others = [k for k in listed.values() if k["role"] == "admin" and not k["revoked"] and k["id"] != admin_id]
    for k in others:
        assert admin.delete(f"/admin/keys/{k['id']}").status_code == 200
    r = admin.delete(f"/admin/keys/{admin_id}")
    assert r.status_code == 409 and "last active admin" in r.json()["error"]["message"]

    # every admin action is an audit event with the admin as actor, and no secret in it
    created = [json.loads(e.payload) for e in _events(limited, "key.created") if e.actor == f"admin:{admin_id}"]
    assert {c["key_id"] for c in created} >= {new["id"], old["id"]}
    revoked = [e for e in _events(limited, "key.revoked") if json.loads(e.payload)["key_id"] == new["id"]]
    assert len(revoked) == 1 and revoked[0].actor == f"admin:{admin_id}"
    rotated = [json.loads(e.payload) for e in _events(limited, "key.rotated")]
    assert {"key_id": rot["id"], "replaces": old["id"], "role": "operator", "name": "night shift"} in rotated
    for kind in ("key.created", "key.revoked", "key.rotated"):
        for e in _events(limited, kind):
            assert new["key"] not in e.payload and rot["key"] not in e.payload and old["key"] not in e.payload
    aud = make_keys(limited.db_url)["auditor"]
    assert limited.client(aud).get("/audit/verify").json()["ok"] is True


def test_revoke_from_the_cli_reaches_the_running_server(limited):
    key = make_keys(limited.db_url)["client"]
    kid = key.split("_")[1]
    assert _models(limited, key).status_code == 200
    env = {**os.environ, "TRIAGE_SPOOL_PATH": str(limited.tmp / "cli-spool.jsonl"), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-m", "serving.cli", "keys", "revoke", kid, "--db", limited.db_url],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    t0 = time.monotonic()
    while _models(limited, key).status_code != 401:   # key_cache_s = 0.5 s: no restart
        assert time.monotonic() - t0 < 3, "a key revoked from the CLI still works after 3 s"
        time.sleep(0.1)
    ev = [e for e in _events(limited, "key.revoked") if json.loads(e.payload)["key_id"] == kid]
    assert len(ev) == 1 and ev[0].actor == "cli"
