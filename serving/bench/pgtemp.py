"""A throw-away PostgreSQL cluster for benchmarks that stop the database on purpose
(`triage bench faults`, scenario db_outage): its own data directory, port and socket
directory, never the machine's shared server.

    with ThrowawayPostgres(workdir) as pg:
        pg.url            # postgresql://postgres@127.0.0.1:PORT/triage
        pg.stop()         # pg_ctl stop -m fast (an outage)
        pg.start()

PostgreSQL refuses to run as root: as root the cluster runs as the `postgres` user
(runuser). Binaries: `pg_config --bindir`, else /usr/lib/postgresql/<newest>/bin.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    pass


def _bindir() -> Path:
    pgc = shutil.which("pg_config")
    if pgc:
        d = Path(subprocess.run([pgc, "--bindir"], capture_output=True, text=True, check=True).stdout.strip())
        if (d / "initdb").exists():
            return d
    roots = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name)
                   if p.parent.name.isdigit() else 0)
    for d in reversed(roots):
        if (d / "initdb").exists():
            return d
    raise PostgresUnavailable("PostgreSQL server binaries (initdb, pg_ctl) not found; install postgresql")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThrowawayPostgres:
    def __init__(self, workdir: Path, port: int | None = None, dbname: str = "triage") -> None:
        self.bin = _bindir()
        self.workdir = Path(workdir)
        self.base = self.workdir / "pg"
        self.dir = self.base / "data"
        self.sock = self.base / "sock"
        self.log = self.base / "postgres.log"
        self.port = port or free_port()
        self.dbname = dbname
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.dbname}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([*self._as, *args], capture_output=True, text=True)
        if check and r.returncode != 0:
            raise PostgresUnavailable(f"{' '.join(args[:2])} failed ({r.returncode}): {(r.stderr or r.stdout)[-600:]}")
        return r

    def _own(self, *paths: Path) -> None:
        if self._as:
            for p in paths:
                shutil.chown(p, "postgres", "postgres")

    def __enter__(self) -> "ThrowawayPostgres":
        for p in (self.dir, self.sock):
            p.mkdir(parents=True, exist_ok=True)
        self.log.touch()
        if self._as:   # the postgres user must reach its directory
            self.workdir.chmod(self.workdir.stat().st_mode | 0o711)
        self._own(self.base, self.dir, self.sock, self.log)
        self.dir.chmod(0o700)
        self._run(str(self.bin / "initdb"), "-D", str(self.dir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync")
        self.start()
        self._run(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", self.dbname)
        return self

    def start(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.dir), "-l", str(self.log), "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.sock} -c listen_addresses=127.0.0.1 -c fsync=on", "start")

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.dir), "-m", "fast", "-w", "stop", check=False)

    def __exit__(self, *exc) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.dir), "-m", "immediate", "-w", "stop", check=False)
