"""Batched audit writer: off the request path, never drops a record.

    writer.submit(Record(...))      # from the event loop: O(1), never blocks on the database
    writer.sync(timeout)            # wait until everything submitted so far is written or spooled

A background thread takes records off a queue and writes them in batches, one
transaction per batch (table row + its hash-chained audit event). If the database
errors, the batch is appended to a spool file (JSON lines, fsync'd) and from then on
everything goes to the spool, in order, until a replay succeeds: the whole spool is
written in one transaction and then truncated. Replays are idempotent: a record whose
event the chain already holds (same time to the microsecond, kind, actor and request) is
skipped, as is a request whose row exists, so a crash between commit and truncate
duplicates nothing and cannot wedge the spool on a unique key.

A process that dies outright loses nothing either: every record, and every request at its
admission, is first appended to the writer's journal (serving/db/journal.py), and the next
`start` spools what was not durable and records each request that never ended as
`interrupted`.
"""
from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection, Engine

from serving.db.chain import GENESIS, canonical, event_hash, row_digest
from serving.db.journal import Journal, Orphan
from serving.db.models import AuditEventRow, PriorityClassRow, RelabelExampleRow, RelabelRow, RequestRow
from serving.db.session import CHAIN_LOCK, write_lock

log = logging.getLogger(__name__)

TABLES = {"requests": RequestRow, "relabels": RelabelRow, "priority_classes": PriorityClassRow,
          "relabel_examples": RelabelExampleRow}


@dataclass
class Record:
    """One audit event, optionally with the table rows it seals."""

    kind: str                       # request.finished | relabel | classes.updated | key.created | ...
    at: float
    actor: str | None = None
    request_id: str | None = None
    payload: dict = field(default_factory=dict)
    table: str | None = None        # requests | relabels | priority_classes
    rows: list[dict] = field(default_factory=list)


class AuditWriter:
    def __init__(self, engine: Engine, spool_path: Path, *, batch: int = 200, interval_s: float = 0.2,
                 retry_s: float = 1.0, on_state: Callable[[str, int], None] | None = None) -> None:
        self.engine = engine
        self.spool_path = Path(spool_path)
        # taken by `start` (the service's writer); one-off tools that only `write_now` leave it be
        self.journal = Journal(self.spool_path.with_name(self.spool_path.name + ".journal"))
        self.interrupted: Counter = Counter()   # by level: the requests `start` found a dead process left
        self.batch, self.interval_s, self.retry_s = batch, interval_s, retry_s
        self.on_state = on_state or (lambda state, n: None)
        self._q: queue.Queue = queue.Queue()
        self._cv = threading.Condition()
        self._submitted = 0
        self._done = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._next_retry = 0.0
        self.db_ok = True
        self.written = 0
        self.spooled = 0
        self.replays = 0
        self._io = threading.Lock()   # held while a batch is written or spooled: never cut half-way

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> "AuditWriter":
        self.spool_path.parent.mkdir(parents=True, exist_ok=True)
        self._recover()
        if self.spool_lines() > 0:
            log.warning("audit spool %s holds %d records from an earlier run; replaying", self.spool_path, self.spool_lines())
        self._thread = threading.Thread(target=self._run, name="triage-audit-writer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Write or spool everything submitted, then flush the spool: one last replay into
        the database; what it cannot take stays in the spool for the next start."""
        if self._thread is None:
            return
        self.sync(timeout)
        self._stop.set()
        self._q.put(None)
        self._thread.join(timeout)
        self._thread = None
        if self.spool_lines():
            with self._io:
                self._replay()
            left = self.spool_lines()
            if left:
                log.warning("audit spool: %d records stay in %s (database unreachable); they are written at the "
                            "next start", left, self.spool_path)
        self.journal.close()

    def _recover(self) -> None:
        """Take the journal; spool what an earlier process that died left in it (records it
        had not made durable, and a record, outcome `interrupted`, for each request it had
        accepted and not ended); then start the journal empty."""
        pending, orphans = self.journal.open()
        recs = [Record(**r) for r in pending] + [_interrupted(o) for o in orphans]
        if recs:
            self._append_spool(recs)
            self.interrupted = Counter(o.row["effective_level"] for o in orphans)
            log.warning("audit journal: the previous run ended without writing %d records and with %d requests "
                        "unfinished (by level: %s); spooled, the unfinished ones as outcome `interrupted`",
                        len(pending), len(orphans), dict(sorted(self.interrupted.items())) or "none")
        self.journal.reset()

    def emergency_spool(self, wait_s: float = 2.0) -> int | None:
        """Exit now (second SIGTERM): wait for the batch being written (whole transactions,
        whole spool lines), then append every record not yet handled to the spool, fsync'd,
        and keep the writer from starting another. Returns the records spooled. The caller
        exits; the next start replays the spool.

        Where the journal runs, a batch still being written after `wait_s` (the database
        holds a lock, the disk stalls: a PostgreSQL statement may wait 15 s) is not waited
        for: returns None and spools nothing. Nothing is lost that way either. Every record
        went to the journal before its queue, and the next start spools those no durable
        mark covers. The exit rolls back the batch's open transaction. A spool line the exit
        cuts short is set aside at the replay (its records are in the journal), and the
        replay skips what is already written."""
        self._stop.set()
        # without a journal, the queued records live only here: wait for the batch however long
        if not self._io.acquire(timeout=wait_s if self.journal.active else -1):   # never released: exiting
            return None
        items: list[Record] = []
        while True:
            try:
                r = self._q.get_nowait()
            except queue.Empty:
                break
            if r is not None:
                items.append(r)
        if items:
            self._append_spool(items)
        if self.journal.active:
            self.journal.durable(self._submitted - 1)
        return len(items)

    # --- API -------------------------------------------------------------------------------
    def submit(self, rec: Record) -> None:
        # the journal line, the record's place and the queue move together: the writer's
        # count of records handled is then also the journal's durable mark
        with self._cv:
            if self.journal.active:
                self.journal.record(self._submitted, asdict(rec))
            self._submitted += 1
            self._q.put(rec)

    def accepted(self, request_id: str, at: float, row: dict) -> None:
        """A request was admitted: journal its row as it stands (see `_recover`)."""
        if self.journal.active:
            self.journal.accepted(request_id, at, row)

    def first_token(self, request_id: str, at: float) -> None:
        if self.journal.active:
            self.journal.first_token(request_id, at)

    def sync(self, timeout: float = 10.0) -> bool:
        """Wait until every record submitted so far is written or spooled."""
        deadline = time.monotonic() + timeout
        with self._cv:
            target = self._submitted
            while self._done < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def write_now(self, items: list[Record]) -> None:
        """Write records in the calling thread, one transaction, now (one-off tools such as
        `triage keys revoke`; the chain lock keeps a running server's writer in order)."""
        self._write(items)

    def spool_lines(self) -> int:
        try:
            with self.spool_path.open("rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    # --- worker ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            items: list[Record] = []
            # taking records and writing them is one step under `_io`: `emergency_spool` finds
            # every record either handled or still in the queue, never in between
            with self._io:
                try:
                    first = self._q.get(timeout=self.interval_s)
                    if first is not None:
                        items.append(first)
                    while len(items) < self.batch:
                        try:
                            nxt = self._q.get_nowait()
                        except queue.Empty:
                            break
                        if nxt is not None:
                            items.append(nxt)
                except queue.Empty:
                    pass
                n = len(items)
                try:
                    self._handle(items)
                except Exception:   # the writer must outlive any one batch: there is no other
                    log.exception("audit writer: a batch failed unexpectedly; spooling its %d records", len(items))
                    self._spool_anyway(items)   # those not yet written or spooled (`_handle` clears them)
                if n and self.journal.active:
                    self.journal.durable(self._done + n - 1)
            with self._cv:
                self._done += n
                self._cv.notify_all()
            if self._stop.is_set() and self._q.empty():
                return

    def _handle(self, items: list[Record]) -> None:
        spool_has = self.spool_path.exists() and self.spool_path.stat().st_size > 0
        if spool_has:
            if items:
                self._append_spool(items)
                items.clear()   # durable: whatever the replay below meets
            if time.monotonic() >= self._next_retry:
                self._replay()
            return
        if not items:
            return
        try:
            self._write(items)
            self.written += len(items)
            items.clear()
            self._set_ok(True)
        except Exception as e:
            log.warning("audit database write failed (%s); spooling %d records to %s", type(e).__name__, len(items), self.spool_path)
            self._append_spool(items)
            items.clear()
            self._set_ok(False)
            self._next_retry = time.monotonic() + self.retry_s

    def _set_ok(self, ok: bool) -> None:
        if ok != self.db_ok:
            self.db_ok = ok
            log.warning("audit database %s", "reachable again" if ok else "unreachable")
        self.on_state("ok" if ok else "spooling", self.spool_lines() if not ok else 0)

    def _append_spool(self, items: list[Record]) -> None:
        with self.spool_path.open("a+b") as f:
            end = f.seek(0, os.SEEK_END)
            if end:   # a line cut short by a process that died mid-append stays a line of its own
                f.seek(end - 1)
                torn = f.read(1) != b"\n"
                f.seek(0, os.SEEK_END)
                if torn:
                    f.write(b"\n")
            f.write(b"".join(json.dumps(asdict(r), separators=(",", ":")).encode() + b"\n" for r in items))
            f.flush()
            os.fsync(f.fileno())
        self.spooled += len(items)

    def _spool_anyway(self, items: list[Record]) -> None:
        try:
            if items:
                self._append_spool(items)
        except OSError:
            log.error("audit writer: %d records could be neither written nor spooled (%s)", len(items), self.spool_path)
        self._set_ok(False)
        self._next_retry = time.monotonic() + self.retry_s

    def _read_spool(self) -> list[Record]:
        """The spool's records. A line that does not parse can only be one the process was
        appending when it died (so its record was never acknowledged): it is moved, bytes
        as they were, to `<spool>.torn` for inspection, and the rest replays."""
        recs: list[Record] = []
        torn: list[bytes] = []
        good: list[bytes] = []
        with self.spool_path.open("rb") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    recs.append(Record(**json.loads(line)))
                    good.append(line if line.endswith(b"\n") else line + b"\n")
                except (ValueError, TypeError):
                    torn.append(line if line.endswith(b"\n") else line + b"\n")
        if torn:
            side = self.spool_path.with_name(self.spool_path.name + ".torn")
            with side.open("ab") as f:
                f.write(b"".join(torn))
                f.flush()
                os.fsync(f.fileno())
            tmp = self.spool_path.with_suffix(".tmp")
            with tmp.open("wb") as f:
                f.write(b"".join(good))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.spool_path)
            log.warning("audit spool: %d unreadable line(s), cut short by a process that died while writing, "
                        "moved to %s; %d records replay", len(torn), side, len(recs))
        return recs

    def _replay(self) -> None:
        try:
            recs = self._read_spool()
        except FileNotFoundError:
            return
        try:
            self._write(recs, replay=True)   # one transaction: all or nothing
        except Exception as e:
            log.warning("audit spool replay failed (%s); %d records wait in %s", type(e).__name__, len(recs), self.spool_path)
            self._set_ok(False)
            self._next_retry = time.monotonic() + self.retry_s
            return
        tmp = self.spool_path.with_suffix(".tmp")
        tmp.write_text("")
        os.replace(tmp, self.spool_path)
        self.replays += 1
        self.written += len(recs)
        log.warning("audit spool replayed: %d records written", len(recs))
        self._set_ok(True)

    def _write(self, items: list[Record], replay: bool = False) -> None:
        with self.engine.begin() as conn:
            write_lock(conn, CHAIN_LOCK)
            prev = last_hash(conn)
            req_ids = [row["id"] for r in items if r.table == "requests" for row in r.rows]
            existing = set()
            if req_ids:
                existing = set(conn.execute(select(RequestRow.id).where(RequestRow.id.in_(req_ids))).scalars())
            written = _events_present(conn, items) if replay else set()
            for r in items:
                key = _event_key(r.at, r.kind, r.actor, r.request_id)
                if key in written:
                    continue   # committed by a replay the process died in before it emptied the spool
                if replay:     # or spooled twice: by a process that died, then from its journal
                    written.add(key)
                payload = dict(r.payload)
                if r.table:
                    if r.table == "requests" and any(row["id"] in existing for row in r.rows):
                        continue   # already written by an earlier (interrupted) replay, or in this batch
                    if r.table == "requests":
                        existing.update(row["id"] for row in r.rows)
                    model = TABLES[r.table]
                    conn.execute(insert(model), r.rows)
                    if r.table in SEALED_TABLE_NAMES:
                        payload["row_sha256"] = [row_digest(row) for row in r.rows]
                prev = insert_event(conn, prev, r.at, r.kind, r.actor, r.request_id, canonical(payload))


def last_hash(conn: Connection) -> str:
    """The chain's last hash (GENESIS when it is empty). A writer takes `write_lock` first."""
    return conn.execute(select(AuditEventRow.hash).order_by(AuditEventRow.id.desc()).limit(1)).scalar() or GENESIS


def insert_event(conn: Connection, prev: str, at: float, kind: str, actor: str | None, request_id: str | None,
                 body: str) -> str:
    """Append one event (payload `body`, canonical JSON) after the hash `prev`; returns its hash."""
    h = event_hash(prev, at, kind, actor, request_id, body)
    conn.execute(insert(AuditEventRow).values(at=round(at, 6), kind=kind, actor=actor, request_id=request_id,
                                              payload=body, prev_hash=prev, hash=h))
    return h


def verify_url(url: str) -> dict[str, Any]:
    """`verify` on the database at `url` (its errors propagate: the caller says what failed)."""
    from serving.db.session import make_engine

    eng = make_engine(url)
    try:
        return verify(eng)
    finally:
        eng.dispose()


def _event_key(at: float, kind: str, actor: str | None, request_id: str | None) -> tuple:
    return round(float(at), 6), kind, actor, request_id


def _events_present(conn: Connection, items: list[Record]) -> set[tuple]:
    """Which of `items` the chain already holds, by (time to the microsecond, kind, actor,
    request): a replay must skip what an interrupted replay committed (a class version
    written twice would break its unique key, and the spool would never drain)."""
    ats = sorted({round(float(r.at), 6) for r in items})
    found: set[tuple] = set()
    for k in range(0, len(ats), 500):
        q = select(AuditEventRow.at, AuditEventRow.kind, AuditEventRow.actor, AuditEventRow.request_id)
        found |= {_event_key(*row) for row in conn.execute(q.where(AuditEventRow.at.in_(ats[k:k + 500])))}
    return found


# the tables whose rows an audit event seals (`row_sha256`): (table, model, whether the
# row has a database key of its own, left out of the sealed row), and the events that do
SEALED_TABLES = (("requests", RequestRow, False), ("relabels", RelabelRow, True),
                 ("relabel_examples", RelabelExampleRow, True), ("priority_classes", PriorityClassRow, True))
SEALED_TABLE_NAMES = frozenset(t for t, _, _ in SEALED_TABLES)
SEALED_BY = {"request.finished": "requests", "relabel": "relabels", "relabel.example": "relabel_examples",
             "classes.loaded": "priority_classes", "classes.updated": "priority_classes"}


def _legacy_class_row(row: dict, table: dict) -> str | None:
    """A class-table row written before its event sealed it (builds before 2026-12-05),
    checked against the table its event carries. Returns the problem, or None."""
    c = next((c for c in table.get("classes", []) if c.get("level") == row["level"]), None)
    want = None if c is None else {"name": c.get("name"), "weight": c.get("weight"), "ttft": c.get("ttft"),
                                   "tpot": c.get("tpot"), "w_first": table.get("w_first"), "w_decode": table.get("w_decode")}
    if want is None or any(row[k] != v if isinstance(v, str) or v is None else not math.isclose(row[k], v)
                           for k, v in want.items()):
        return f"priority_classes: version {row['version']} level {row['level']} differs from its audit event"
    return None


def verify(engine: Engine) -> dict[str, Any]:
    """Recompute the chain and check that every sealed row is unchanged and present.

    The events and the rows are read in one snapshot: the writer commits a row with its
    event, so a request finishing between two separate reads would read as a row "not
    sealed by an audit event" (a false alarm of tampering under live traffic)."""
    from serving.db.chain import verify_events

    with _snapshot(engine) as conn:
        events = conn.execute(select(AuditEventRow).order_by(AuditEventRow.id)).all()
        ok, n, problem = verify_events(events)
        if not ok:
            return {"ok": False, "events": n, "problem": problem}
        sealed: dict[str, list[str]] = {table: [] for table, _, _ in SEALED_TABLES}
        legacy: dict[int, dict] = {}   # class versions whose event predates the seal
        for e in events:
            if e.kind in SEALED_BY:
                payload = json.loads(e.payload)
                if "row_sha256" in payload:
                    sealed[SEALED_BY[e.kind]].extend(payload["row_sha256"])
                elif SEALED_BY[e.kind] == "priority_classes":
                    legacy[payload.get("version")] = payload
        for table, model, keyed in SEALED_TABLES:
            cols = [c.key for c in model.__table__.columns]
            digests = []
            for row in conn.execute(select(model)).mappings():
                if table == "priority_classes" and row["version"] in legacy:
                    problem = _legacy_class_row(dict(row), legacy[row["version"]])
                    if problem:
                        return {"ok": False, "events": n, "problem": problem}
                    continue
                d = {c: row[c] for c in cols}
                if keyed:
                    d.pop("id")
                digests.append(row_digest(d))
            want = sorted(sealed[table])
            got = sorted(digests)
            if want != got:
                missing = len(set(want) - set(got))
                extra = len(set(got) - set(want))
                return {"ok": False, "events": n,
                        "problem": f"{table}: {missing} sealed rows altered or missing, {extra} rows not sealed by an audit event"}
        return {"ok": True, "events": n, "problem": None}


@contextmanager
def _snapshot(engine: Engine) -> Iterator[Connection]:
    """A read-only connection whose statements all see one snapshot of the database."""
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            # pysqlite starts no transaction for a SELECT, so each read would see its own
            # snapshot; an explicit BEGIN holds the first read's (WAL) snapshot to the end
            conn.exec_driver_sql("BEGIN")
            yield conn
            conn.rollback()
        return
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        yield conn
        conn.rollback()


def _interrupted(o: Orphan) -> Record:
    """The record of a request an earlier process accepted and never ended: its row as known
    at admission, its first token if one went out, ended when the journal last heard from
    the process (so a second recovery of the same journal makes the same record, which the
    spool's replay then skips)."""
    row = dict(o.row, outcome="interrupted", finish=o.last_seen, first_token=o.first_token,
               ttft=(o.first_token - o.row["arrival"]) if o.first_token is not None else None)
    return Record("request.finished", o.last_seen, None, row["id"],
                  {"level": row["effective_level"], "outcome": "interrupted"}, "requests", [row])
