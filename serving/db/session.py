"""Engines and sessions for SQLite (default) and PostgreSQL; schema via Alembic."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import sessionmaker

REPO_ROOT = Path(__file__).resolve().parents[2]

CHAIN_LOCK = 742617   # every writer of audit events (the last hash is read, then extended)
SITE_LOCK = 742618    # site-model versions (the last version is read, then the next inserted)


def write_lock(conn: Connection, key: int) -> None:
    """Serialise this transaction's read-then-write with every other writer's, in any process:
    two writers that both read the chain's last hash would fork the chain. PostgreSQL: a
    transaction-scoped advisory lock on `key`. SQLite: the database's write lock, taken now
    (BEGIN IMMEDIATE: pysqlite would begin only at the first write, after the read), unless
    this transaction has written already and so holds it."""
    if conn.dialect.name == "postgresql":
        conn.execute(text(f"SELECT pg_advisory_xact_lock({int(key)})"))
    elif conn.dialect.name == "sqlite" and not conn.connection.dbapi_connection.in_transaction:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str, *, busy_timeout_s: float = 2.0) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        eng = create_engine(url, connect_args={"timeout": busy_timeout_s, "check_same_thread": False})

        @event.listens_for(eng, "connect")
        def _pragmas(dbapi_conn, _rec):
            cur = dbapi_conn.cursor()
            try:
                cur.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError:
                # "database is locked": another connection held the file at this instant (seen
                # in CI: two writers connecting at once, one of them switching the file to WAL).
                # WAL is a property of the file, kept once any connection set it, and every
                # connection uses it from its next transaction; failing here failed the write
                # for nothing.
                pass
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return eng
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5,
                         # a dead peer must not hang the writer: TCP keepalive and a statement timeout
                         connect_args={"connect_timeout": 3, "keepalives": 1, "keepalives_idle": 5,
                                       "keepalives_interval": 2, "keepalives_count": 2,
                                       "options": "-c statement_timeout=15000"})


def make_sessionmaker(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str):
    from alembic.config import Config

    cfg = Config(str(REPO_ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str) -> None:
    """`alembic upgrade head` on `url` (the only way the schema changes)."""
    from alembic import command

    url_dir = url.split("///", 1)[-1] if url.startswith("sqlite") else None
    if url_dir:
        Path(url_dir).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(url), "head")


def schema_diff(url: str) -> list:
    """Autogenerate's comparison of the database at `url` with the models ([] = equal)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from serving.db.models import Base

    eng = make_engine(url)
    try:
        with eng.connect() as conn:
            mc = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
            return compare_metadata(mc, Base.metadata)
    finally:
        eng.dispose()


def ping(engine: Engine) -> bool:
    try:
        with engine.connect() as c:
            c.execute(text("SELECT 1"))
        return True
    except Exception:
        return False
