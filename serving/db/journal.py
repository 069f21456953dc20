"""The audit writer's journal: what a process that dies leaves behind for the next start.

The writer batches records in memory before a transaction takes them, and a request leaves
its record only when it ends. A process killed meanwhile (SIGKILL, the OOM killer, a power
cut) took with it every request it had accepted and not finished, and the finished ones
whose records were still queued: the audit trail did not show they had ever existed (20
streaming calls, SIGKILL, restart: 0 rows). So each is appended here first, one JSON line:

    {"a": id, "t": at, "r": row}    a request accepted: its row as known at admission
    {"1": id, "t": at}              its first token went out
    {"s": seq, "r": record}         a record handed to the writer (seq: its place in the queue)
    {"d": seq}                      every record up to seq is durable (committed, or spooled
                                    and fsync'd)

Appends are plain writes to an O_APPEND file: a killed process's writes are already the
kernel's. The writer thread fsyncs once a batch, so a power cut loses at most one batch
interval. `open` (at the next start) returns the records after the last durable mark as
they were, and each request accepted with no record of its own (`Orphan`: its admission row,
its first token if one went out, the journal's last time). The writer spools them (its
replay is idempotent) and the journal starts empty. The file is held with an exclusive lock
while its writer runs (two services on one state directory would read each other's open
requests as interrupted), and rewritten with only what is still open when it grows past
`compact_bytes`.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path


log = logging.getLogger(__name__)


class JournalInUse(RuntimeError):
    pass


@dataclass
class Orphan:
    """A request the journal saw accepted and never saw end."""

    row: dict                    # as known at admission
    first_token: float | None    # when its first token went out, if one did
    last_seen: float             # the journal's last time: the process was alive then


def _line(obj: dict) -> bytes:
    # default=str: a value JSON cannot hold is kept as text rather than failing the request
    return json.dumps(obj, separators=(",", ":"), default=str).encode() + b"\n"


class Journal:
    def __init__(self, path: Path, *, compact_bytes: int = 4 << 20) -> None:
        self.path = Path(path)
        self.compact_bytes = compact_bytes
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._open: dict[str, list[bytes]] = {}              # request id -> its accepted / first-token lines
        self._pending: dict[int, tuple[str | None, bytes]] = {}  # seq -> (its request id, its line)
        self._size = 0
        self.failures = 0   # appends that failed (a full disk): the service serves on, unjournaled

    @property
    def active(self) -> bool:
        """Taken by `open` and not yet closed (a one-off tool's writer never takes it)."""
        return self._fd is not None

    # --- the next start ---------------------------------------------------------------------
    def open(self) -> tuple[list[dict], list[Orphan]]:
        """Take the journal (exclusive lock) and read what an earlier process left: the
        records it had not made durable, in order, and its orphaned requests. The caller
        makes them durable, then calls `reset`."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalInUse(f"the audit journal {self.path} is held by another running triage service: "
                               "give each service its own state directory (TRIAGE_HOME) or spool path "
                               "(TRIAGE_SPOOL_PATH)") from None
        self._fd = fd
        return self._read()

    def _read(self) -> tuple[list[dict], list[Orphan]]:
        accepted: dict[str, dict] = {}
        first: dict[str, float] = {}
        records: dict[int, dict] = {}
        durable, last = -1, 0.0
        with open(self.path, "rb") as f:
            for raw in f:
                try:
                    e = json.loads(raw)
                except ValueError:   # the line the process died writing: never acknowledged
                    continue
                if not isinstance(e, dict):
                    continue
                if "a" in e:
                    accepted[e["a"]] = e["r"]
                elif "1" in e:
                    first.setdefault(e["1"], e["t"])
                elif "s" in e:
                    records[e["s"]] = e["r"]
                    last = max(last, float(e["r"].get("at") or 0.0))
                elif "d" in e:
                    durable = max(durable, e["d"])
                last = max(last, float(e.get("t") or 0.0))
        ended = {row["id"] for r in records.values() if r.get("table") == "requests" for row in r.get("rows", [])}
        pending = [records[s] for s in sorted(records) if s > durable]
        orphans = [Orphan(row, first.get(rid), last) for rid, row in accepted.items() if rid not in ended]
        return pending, orphans

    def reset(self) -> None:
        """What `open` returned is durable elsewhere now: start the journal empty."""
        with self._lock:
            os.ftruncate(self._fd, 0)
            os.fsync(self._fd)
            self._size = 0

    def close(self) -> None:
        """The writer stopped with everything durable: nothing is left open but requests
        that never ended (there are none after a drain), so an empty journal stays empty."""
        with self._lock:
            if self._fd is None:
                return
            if not self._open and not self._pending:
                os.ftruncate(self._fd, 0)
            os.fsync(self._fd)
            os.close(self._fd)   # releases the lock
            self._fd = None

    # --- appends (any thread) ---------------------------------------------------------------
    def accepted(self, request_id: str, at: float, row: dict) -> None:
        line = _line({"a": request_id, "t": at, "r": row})
        with self._lock:
            self._open[request_id] = [line]
            self._append(line)

    def first_token(self, request_id: str, at: float) -> None:
        line = _line({"1": request_id, "t": at})
        with self._lock:
            lines = self._open.get(request_id)
            if lines is None:
                return
            lines.append(line)
            self._append(line)

    def record(self, seq: int, rec: dict) -> None:
        line = _line({"s": seq, "r": rec})
        rid = rec["rows"][0]["id"] if rec.get("table") == "requests" and rec.get("rows") else None
        with self._lock:
            self._pending[seq] = (rid, line)
            self._append(line)

    def durable(self, upto: int) -> None:
        """Every record up to `upto` is committed or spooled. Called by the writer thread
        alone (which is what lets the fsync run outside the lock: an admission on the event
        loop never waits for the disk)."""
        with self._lock:
            if self._fd is None:
                return
            for s in [s for s in self._pending if s <= upto]:
                rid, _ = self._pending.pop(s)
                if rid is not None:
                    self._open.pop(rid, None)
            self._append(_line({"d": upto}))
            if self._size > self.compact_bytes:
                try:
                    self._compact()
                except OSError as e:   # the journal grows on; the next mark tries again
                    log.error("audit journal %s: compaction failed (%s)", self.path, e)
            fd = self._fd
        try:
            os.fsync(fd)
        except OSError as e:
            log.error("audit journal %s: fsync failed (%s)", self.path, e)

    # --- internals (under the lock) -----------------------------------------------------------
    def _append(self, line: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, line)
        except OSError as e:   # never fail a request for its journal line
            self.failures += 1
            if self.failures == 1 or self.failures % 1000 == 0:
                log.error("audit journal %s: append failed (%s), %d so far; a crash now would leave those "
                          "requests unrecorded", self.path, e, self.failures)
            return
        self._size += len(line)

    def _compact(self) -> None:
        """Rewrite the file with what is still open; the lock moves to the new file."""
        body = b"".join(b"".join(v) for v in self._open.values()) + b"".join(line for _, line in
                                                                              (self._pending[s] for s in sorted(self._pending)))
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, body)
        os.fsync(fd)
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd, self._size = fd, len(body)
