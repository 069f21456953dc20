"""The audit database: migrations equal the models; an outage loses nothing.

The outage is real but local to the test: for SQLite another connection holds the write
lock; for PostgreSQL the service reaches its own database through a TCP proxy that the
test cuts (connections reset, new ones refused) and restores.
"""
from __future__ import annotations

import socket
import sqlite3
import threading
import time

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from conftest import PG_SERVER, Server, chat, free_port, make_keys, make_settings, pg_database


def test_alembic_head_equals_models(db_url):
    from serving.db.session import schema_diff, upgrade

    upgrade(db_url)
    assert schema_diff(db_url) == []


def test_cli_db_and_keys(tmp_path):
    from typer.testing import CliRunner

    from serving.cli import app

    url = f"sqlite:///{tmp_path / 'k.db'}"
    runner = CliRunner()
    r = runner.invoke(app, ["db", "upgrade", "--db", url])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["db", "check", "--db", url])
    assert r.exit_code == 0 and "equals" in r.output
    r = runner.invoke(app, ["keys", "create", "--role", "operator", "--db", url])
    assert r.exit_code == 0, r.output
    key = r.stdout.strip()
    assert key.startswith("tri_") and r.stdout == key + "\n"
    assert runner.invoke(app, ["keys", "create", "--role", "emperor", "--db", url]).exit_code == 2
    from serving.auth import KeyStore
    from serving.db.session import make_engine

    eng = make_engine(url)
    assert KeyStore(eng).check(key).role == "operator"
    with eng.connect() as c:   # stored hashed: the secret appears nowhere in the table
        rows = [tuple(map(str, r)) for r in c.exec_driver_sql("SELECT * FROM api_keys")]
    assert not any(key.split("_", 2)[2] in v for row in rows for v in row)
    eng.dispose()


def test_settings_refuse_unsafe_defaults(tmp_path):
    from serving.settings import Settings

    with pytest.raises(ValueError, match="refusing to bind"):
        Settings(host="0.0.0.0")
    with pytest.raises(ValueError, match="in-memory"):
        Settings(db_url="sqlite:///:memory:")
    with pytest.raises(ValueError):
        Settings(max_queue=0)
    with pytest.raises(ValueError):
        Settings(db_url="mysql://x/y")
    assert Settings(host="0.0.0.0", allow_public=True).host == "0.0.0.0"
    # the policy's options (TRIAGE_POLICY_PARAMS) are checked before anything starts
    with pytest.raises(ValueError, match="policy_params.*protected_pace"):
        Settings(policy_params={"protected_pace": 2})
    with pytest.raises(ValueError, match="policy_params.*no_such_knob"):
        Settings(policy_params={"no_such_knob": 1})
    assert Settings(policy_params={"solo_first_step": True}).policy_params == {"solo_first_step": True}


def test_first_start_prints_keys_once(tmp_path, predictors_dir, capfd):
    url = f"sqlite:///{tmp_path / 'boot.db'}"
    for i in range(2):
        s = make_settings(url, tmp_path, predictors_dir, bootstrap_keys=True)
        with Server(s):
            pass
        out = capfd.readouterr()
        if i == 0:
            assert out.out.count("tri_") == 2 and "admin" in out.out
        else:
            assert "tri_" not in out.out
        assert "tri_" not in out.err


def _finished(rid: str):
    from serving.db.models import RequestRow
    from serving.db.writer import Record

    row = {c.key: None for c in RequestRow.__table__.columns}
    row.update(id=rid, endpoint="chat", effective_level=3, ttft_slo=1.0, tpot_slo=0.1, classes_version=1,
               arrival=time.time(), prompt_tokens=5, output_tokens=5, slo_met=True, preemptions=0, outcome="ok")
    return Record(kind="request.finished", at=time.time(), request_id=rid, table="requests", rows=[row])


def test_verify_reads_one_snapshot_while_requests_keep_finishing(db_url, tmp_path):
    """A request that finishes while the chain is being checked (its row and its event are
    committed together, between verify's read of the events and its read of the rows) is not
    reported as an unsealed row: an auditor's check under live traffic gives no false alarm."""
    from sqlalchemy import event

    from serving.db.session import make_engine, upgrade
    from serving.db.writer import AuditWriter, verify

    upgrade(db_url)
    checker, other = make_engine(db_url), make_engine(db_url)
    writer = AuditWriter(other, tmp_path / "spool.jsonl")
    writer.write_now([_finished("before")])
    landed: list[str] = []

    @event.listens_for(checker, "before_cursor_execute")
    def finish_one_meanwhile(conn, cursor, statement, params, context, executemany):
        if not landed and "FROM requests" in statement:
            writer.write_now([_finished("meanwhile")])
            landed.append("meanwhile")

    try:
        res = verify(checker)
        assert landed, "the request did not finish between the two reads"
        assert res == {"ok": True, "events": 1, "problem": None}, res
        assert verify(checker) == {"ok": True, "events": 2, "problem": None}
    finally:
        checker.dispose()
        other.dispose()


def test_verify_catches_an_altered_relabel_example_the_site_adapter_would_learn_from(tmp_path):
    """The operators' relabels that a site adapter trains on are sealed by their events like
    requests and relabels: a level changed in the table afterwards (poisoning the next
    adapter) fails the check."""
    import numpy as np

    from serving.adapt.examples import example_record
    from serving.db.session import make_engine, upgrade
    from serving.db.writer import AuditWriter, verify

    url = f"sqlite:///{tmp_path / 'ex.db'}"
    upgrade(url)
    eng = make_engine(url)
    try:
        AuditWriter(eng, tmp_path / "spool.jsonl").write_now(
            [example_record(f"req-{i}", np.full(4, i, dtype=np.float32), 2, 3, "k1", "operator", "fp", 1) for i in range(3)])
        assert verify(eng) == {"ok": True, "events": 3, "problem": None}
        with eng.begin() as c:
            c.exec_driver_sql("UPDATE relabel_examples SET level = 5 WHERE request_id = 'req-1'")
        res = verify(eng)
        assert res["ok"] is False and res["problem"].startswith("relabel_examples: 1 sealed rows altered"), res
    finally:
        eng.dispose()


def test_verify_catches_an_altered_class_table_version_old_or_new(tmp_path):
    """The class-table history the console shows (`/admin/classes/history`) is sealed by its
    events: a past version's SLO changed in the table afterwards fails the check, for rows
    sealed since 2026-12-05 (by digest) and for rows written before (against the table the
    event carries)."""
    from sqlalchemy import insert

    from serving.db.models import PriorityClassRow
    from serving.db.session import make_engine, upgrade
    from serving.db.writer import AuditWriter, Record, verify
    from triage.classes import load_classes

    url = f"sqlite:///{tmp_path / 'cls.db'}"
    upgrade(url)
    eng = make_engine(url)
    t = load_classes()

    def rows(version, at):
        return [{"version": version, "level": c["level"], "name": c["name"], "weight": c["weight"], "ttft": c["ttft"],
                 "tpot": c["tpot"], "w_first": t.w_first, "w_decode": t.w_decode, "actor": "system", "created": at,
                 "escalate_below": None, "reason": "first start"} for c in t.to_dict()["classes"]]

    try:
        w = AuditWriter(eng, tmp_path / "spool.jsonl")
        # version 1 as an older build wrote it: the event carries the table, the rows go in unsealed
        w.write_now([Record("classes.loaded", 1.0, "system", None, {**t.to_dict(), "version": 1, "escalate_below": None})])
        with eng.begin() as c:
            c.execute(insert(PriorityClassRow), rows(1, 1.0))
        # version 2 as this build writes it: sealed
        w.write_now([Record("classes.updated", 2.0, "op", None, {**t.to_dict(), "version": 2}, "priority_classes", rows(2, 2.0))])
        assert verify(eng) == {"ok": True, "events": 2, "problem": None}
        for version, problem in ((2, "priority_classes: 1 sealed rows altered"),
                                 (1, "priority_classes: version 1 level 3 differs from its audit event")):
            with eng.begin() as c:
                c.exec_driver_sql(f"UPDATE priority_classes SET ttft = ttft * 2 WHERE version = {version} AND level = 3")
            res = verify(eng)
            assert res["ok"] is False and res["problem"].startswith(problem), res
            with eng.begin() as c:
                c.exec_driver_sql(f"UPDATE priority_classes SET ttft = ttft / 2 WHERE version = {version} AND level = 3")
            assert verify(eng)["ok"] is True
    finally:
        eng.dispose()


def test_two_processes_writing_audit_events_at_once_keep_one_chain(db_url, tmp_path):
    """The service's writer and a CLI command (`triage keys create`, `triage adapt`) append to
    the chain at the same moment, each through its own connection: every event still links to
    the one before it (neither reads a last hash the other is about to extend)."""
    from serving.db.session import make_engine, upgrade
    from serving.db.writer import AuditWriter, Record, verify

    upgrade(db_url)
    engines = [make_engine(db_url) for _ in range(2)]
    writers = [AuditWriter(e, tmp_path / f"spool{i}.jsonl") for i, e in enumerate(engines)]
    start = threading.Barrier(2)
    failed: list[BaseException] = []

    def append(i: int) -> None:
        start.wait()
        try:
            for k in range(150):
                writers[i].write_now([Record("key.created", time.time(), "cli", None, {"key_id": f"{i}-{k}"})])
        except BaseException as e:   # a thread's exception would otherwise vanish
            failed.append(e)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not failed, failed   # on SQLite neither starves the other into "database is locked"
        assert verify(engines[0]) == {"ok": True, "events": 300, "problem": None}
    finally:
        for e in engines:
            e.dispose()


def test_a_writer_connecting_while_another_holds_a_fresh_sqlite_file_still_writes(tmp_path):
    """A new database file is not in WAL mode until a connection switches it, and switching
    needs the file to itself: a second writer connecting while the first one wrote failed with
    "database is locked" on its WAL pragma (the failure CI met in the test above). It now
    connects, and writes once the lock is free."""
    from serving.db.session import make_engine, upgrade
    from serving.db.writer import AuditWriter, Record, verify

    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    upgrade(url)
    holder = sqlite3.connect(tmp_path / "fresh.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    eng = make_engine(url, busy_timeout_s=0.2)
    try:
        eng.connect().close()
        holder.execute("COMMIT")
        AuditWriter(eng, tmp_path / "spool.jsonl").write_now([Record("key.created", time.time(), "cli", None, {})])
        assert verify(eng) == {"ok": True, "events": 1, "problem": None}
    finally:
        holder.close()
        eng.dispose()


# --- outage ---------------------------------------------------------------------------------
class TcpProxy:
    """Forwards 127.0.0.1:port to an upstream; cut() resets everything, restore() resumes."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = free_port()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", self.port))
        ls.listen(64)
        self._listener = ls
        threading.Thread(target=self._accept, args=(ls,), daemon=True).start()

    def _accept(self, ls: socket.socket) -> None:
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                c.close()
                continue
            with self._lock:
                self._socks += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        if self._listener:   # shutdown first: close() alone leaves a blocked accept() listening
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:   # shutdown wakes the pump threads blocked in recv, then the peers see EOF
            for op in (lambda: s.shutdown(socket.SHUT_RDWR), s.close):
                try:
                    op()
                except OSError:
                    pass


def _rows(db) -> int:
    from serving.db.models import RequestRow

    with Session(db) as s:
        return s.scalar(select(func.count()).select_from(RequestRow))


def _outage_run(srv, outage_on, outage_off, db_for_count):
    c = srv.client(srv.keys["client"])
    ids = [chat(c, f"sprained wrist {i}", max_tokens=3).json()["id"] for i in range(3)]
    srv.state.writer.sync(10)
    outage_on()
    during = [chat(c, f"back pain {i}", max_tokens=3) for i in range(6)]
    assert all(r.status_code == 200 for r in during), [r.text for r in during]
    ids += [r.json()["id"] for r in during]
    deadline = time.monotonic() + 20
    while srv.state.writer.spool_lines() == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert srv.state.writer.spool_lines() > 0, "the outage did not reach the writer"
    assert srv.client().get("/metrics").text.count("triage_database_up 0.0") == 1
    outage_off()
    deadline = time.monotonic() + 30
    while srv.state.writer.spool_lines() > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert srv.state.writer.spool_lines() == 0, "spool not replayed"
    a = srv.client(srv.keys["auditor"])
    got = {rid: a.get(f"/audit/requests/{rid}").status_code for rid in ids}
    assert set(got.values()) == {200}, got
    assert _rows(db_for_count) == len(ids)
    assert a.get("/audit/verify").json()["ok"] is True
    assert srv.state.writer.replays >= 1


def test_sqlite_outage_loses_nothing(tmp_path, predictors_dir):
    path = tmp_path / "out.db"
    url = f"sqlite:///{path}"
    keys = make_keys(url)
    s = make_settings(url, tmp_path, predictors_dir, max_inflight=4)
    holder: list[sqlite3.Connection] = []

    def on():
        con = sqlite3.connect(path, timeout=0.1, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        holder.append(con)

    def off():
        holder.pop().execute("ROLLBACK")

    with Server(s) as srv:
        srv.keys = keys
        _outage_run(srv, on, off, srv.state.db)


def test_an_operator_change_is_acknowledged_once_its_audit_record_is_durable(tmp_path, predictors_dir):
    """A relabel and a class edit answer 200 only when their audit records are in the
    database or fsync'd to the spool, so a process killed right after the answer loses
    neither. Here the SQLite file is locked by another connection: the writer waits out its
    busy timeout, spools, and only then does the operator get the answer."""
    path = tmp_path / "ack.db"
    url = f"sqlite:///{path}"
    keys = make_keys(url)
    with Server(make_settings(url, tmp_path, predictors_dir, writer_interval_s=0.2)) as srv:
        op, admin = srv.client(keys["operator"]), srv.client(keys["admin"])
        call = threading.Thread(target=chat, args=(srv.client(keys["client"]), "a long routine question"),
                                kwargs={"max_tokens": 400})
        call.start()
        deadline = time.monotonic() + 20
        while not (running := op.get("/admin/queue").json()["running_requests"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert running, "the call never ran"
        srv.state.writer.sync(10)
        lock = sqlite3.connect(path, timeout=0.1, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        try:
            classes = op.get("/admin/classes").json()
            classes["classes"][4]["ttft"] += 1.0
            answers = {
                "relabel": op.patch(f"/admin/requests/{running[0]['request_id']}", json={"level": 2, "reason": "stroke signs"}),
                "classes": op.put("/admin/classes", json={"classes": classes["classes"], "reason": "night shift"}),
            }
            spooled = srv.state.writer.spool_lines()   # read at once, before the lock goes
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        assert {k: r.status_code for k, r in answers.items()} == {"relabel": 200, "classes": 200}
        assert all(r.json()["recorded"] is True for r in answers.values()), {k: r.text for k, r in answers.items()}
        assert spooled >= 2, "an operator was answered before the change's record was durable"
        deadline = time.monotonic() + 30
        while srv.state.writer.spool_lines() > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        a = srv.client(keys["auditor"])
        call.join(60)
        assert a.get(f"/audit/requests/{running[0]['request_id']}").json()["relabels"][0]["reason"] == "stroke signs"
        assert a.get("/admin/classes/history").json()["versions"][0]["reason"] == "night shift"
        key = admin.post("/admin/keys", json={"role": "auditor", "name": "inspector"})   # the database is back
        assert key.status_code == 201 and key.json()["recorded"] is True
        assert a.get("/audit/verify").json()["ok"] is True


def test_a_spool_line_cut_short_by_a_crash_is_set_aside_and_everything_else_is_written(tmp_path):
    """A process killed while appending to the outage spool leaves a torn last line. The next
    start must not stop auditing over it: the torn bytes go to `<spool>.torn`, the whole
    records before it and every record spooled after it (while the database is still
    locked) are written once the database answers, and the chain verifies."""
    import json
    from dataclasses import asdict

    from serving.db.session import make_engine, upgrade
    from serving.db.writer import AuditWriter, Record, verify

    path = tmp_path / "torn.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    spool = tmp_path / "spool.jsonl"
    whole = json.dumps(asdict(Record("key.created", time.time(), "cli", None, {"key_id": "before-the-crash"})))
    cut = json.dumps(asdict(Record("key.revoked", time.time(), "cli", None, {"key_id": "mid-append"})))[:37]
    spool.write_text(whole + "\n" + cut)   # no newline: the process died inside this line
    lock = sqlite3.connect(path, timeout=0.1, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")   # the database is still out when the writer starts
    eng = make_engine(url)
    writer = AuditWriter(eng, spool, interval_s=0.05, retry_s=0.2).start()
    try:
        writer.submit(Record("key.created", time.time(), "cli", None, {"key_id": "after-the-restart"}))
        assert writer.sync(10), "the writer stopped"
        lines = spool.read_text().splitlines()
        assert all(json.loads(line)["kind"] for line in lines), lines   # every spooled record is a whole line
        lock.execute("ROLLBACK")
        lock.close()
        deadline = time.monotonic() + 20
        while writer.spool_lines() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert writer.spool_lines() == 0
        with eng.connect() as c:
            keys = [json.loads(p)["key_id"] for p in c.exec_driver_sql("SELECT payload FROM audit_events ORDER BY id").scalars()]
        assert keys == ["before-the-crash", "after-the-restart"]
        assert (tmp_path / "spool.jsonl.torn").read_text() == cut + "\n"
        assert verify(eng)["ok"] is True
        writer.submit(Record("key.created", time.time(), "cli", None, {"key_id": "later"}))
        assert writer.sync(10) and verify(eng)["events"] == 3
    finally:
        writer.stop()
        eng.dispose()


def test_a_replay_the_process_died_in_is_not_written_twice(db_url, tmp_path):
    """The process dies after a spool replay committed and before it emptied the spool. The
    next start replays the same records: what the chain already holds is skipped (a class
    version written twice would break its unique key and the spool would never drain), the
    rest is written, the spool empties, and the chain verifies with each event once."""
    import json
    from dataclasses import asdict

    from serving.db.session import make_engine, upgrade
    from serving.db.writer import AuditWriter, Record, verify
    from triage.classes import load_classes

    upgrade(db_url)
    t = load_classes()
    now = time.time()
    class_rows = [{"version": 9, "level": c["level"], "name": c["name"], "weight": c["weight"], "ttft": c["ttft"],
                   "tpot": c["tpot"], "w_first": t.w_first, "w_decode": t.w_decode, "actor": "op", "created": now,
                   "escalate_below": None, "reason": "night shift"} for c in t.to_dict()["classes"]]
    replayed = [Record("classes.updated", now, "op", None, {**t.to_dict(), "version": 9}, "priority_classes", class_rows),
                Record("key.revoked", now + 0.001, "cli", None, {"key_id": "k-old"}),
                _finished("req-replayed")]
    spool = tmp_path / "spool.jsonl"
    eng = make_engine(db_url)
    try:
        AuditWriter(eng, spool).write_now(replayed)   # the replay's commit ...
        later = Record("key.created", now + 0.002, "cli", None, {"key_id": "k-new"})
        spool.write_text("".join(json.dumps(asdict(r)) + "\n" for r in [*replayed, later]))   # ... and no truncate
        writer = AuditWriter(eng, spool, interval_s=0.05).start()
        try:
            writer.submit(Record("key.created", time.time(), "cli", None, {"key_id": "k-after"}))
            deadline = time.monotonic() + 20
            while writer.spool_lines() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert writer.sync(10) and writer.spool_lines() == 0, "the spool never drained"
        finally:
            writer.stop()
        with eng.connect() as c:
            kinds = [k for (k,) in c.exec_driver_sql("SELECT kind FROM audit_events ORDER BY id")]
        assert kinds == ["classes.updated", "key.revoked", "request.finished", "key.created", "key.created"], kinds
        assert verify(eng)["ok"] is True
    finally:
        eng.dispose()


@pytest.mark.postgres
def test_postgres_outage_loses_nothing(tmp_path, predictors_dir):
    from serving.db.session import make_engine

    with pg_database() as (url, name):
        host, port = PG_SERVER.rsplit("@", 1)[1].split(":")
        proxy = TcpProxy((host, int(port)))
        proxied = url.replace(f"{host}:{port}", f"127.0.0.1:{proxy.port}")
        keys = make_keys(url)
        s = make_settings(proxied, tmp_path, predictors_dir, max_inflight=4)
        direct = make_engine(url)
        try:
            with Server(s) as srv:
                srv.keys = keys
                _outage_run(srv, proxy.cut, proxy.restore, direct)
        finally:
            proxy.cut()
            direct.dispose()


_DIES = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
from test_service_db import _finished
from serving.db.session import make_engine
from serving.db.writer import AuditWriter, Record

w = AuditWriter(make_engine({url!r}), __import__("pathlib").Path({spool!r}), interval_s=0.05).start()
w.submit(_finished("written"))
assert w.sync(10)
w._io.acquire()                            # the writer stuck in a slow transaction: nothing more is written
w.submit(Record("key.created", time.time(), "cli", None, {{"key_id": "k-1"}}))
queued = _finished("finished-not-written")
w.accepted("finished-not-written", queued.rows[0]["arrival"], dict(queued.rows[0], outcome="interrupted"))
w.submit(queued)
for rid, streamed in (("streaming", True), ("waiting", False)):
    row = dict(_finished(rid).rows[0], outcome="interrupted", effective_level=1)
    w.accepted(rid, row["arrival"], row)
    if streamed:
        w.first_token(rid, row["arrival"] + 0.25)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_process_killed_outright_leaves_its_requests_to_the_next_start(db_url, tmp_path):
    """SIGKILL while the writer holds records in memory and requests are open: the next start
    writes the finished request's own record as it was, and one record, outcome
    `interrupted`, for each request that never ended (with its first token's time where one
    went out). Recovering the same journal a second time (a crash during the recovery)
    duplicates nothing; a second writer on the same journal is refused with a clear error."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from serving.db.journal import JournalInUse
    from serving.db.session import make_engine, upgrade
    from serving.db.writer import AuditWriter, verify

    upgrade(db_url)
    spool = tmp_path / "spool.jsonl"
    code = _DIES.format(tests=str(Path(__file__).parent), url=db_url, spool=str(spool))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    eng = make_engine(db_url)
    try:
        with eng.connect() as c:
            assert [i for (i,) in c.exec_driver_sql("SELECT id FROM requests")] == ["written"]
        journal = spool.with_name(spool.name + ".journal")
        copy = tmp_path / "journal.copy"
        shutil.copy(journal, copy)

        def restart() -> dict:
            w = AuditWriter(eng, spool, interval_s=0.05).start()
            try:
                with pytest.raises(JournalInUse, match="another running triage service"):
                    AuditWriter(eng, spool).start()
                deadline = time.monotonic() + 20
                while w.spool_lines() and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                w.stop()
            with eng.connect() as c:
                return {i: (o, ft) for i, o, ft in c.exec_driver_sql("SELECT id, outcome, first_token FROM requests")}

        rows = restart()
        arrival = rows["streaming"][1] - 0.25
        assert {k: v[0] for k, v in rows.items()} == {"written": "ok", "finished-not-written": "ok",
                                                      "streaming": "interrupted", "waiting": "interrupted"}
        assert rows["waiting"][1] is None and arrival > 0
        assert journal.stat().st_size == 0 and spool.stat().st_size == 0
        shutil.copy(copy, journal)       # died after spooling the recovery, before emptying the journal
        assert restart() == rows
        with eng.connect() as c:
            kinds = [k for (k,) in c.exec_driver_sql("SELECT kind FROM audit_events ORDER BY id")]
        assert kinds.count("request.finished") == 4 and kinds.count("key.created") == 1, kinds
        assert verify(eng)["ok"] is True
    finally:
        eng.dispose()
