"""Fixtures for the service tests: a real uvicorn server on a free loopback port, a real
database (SQLite file, or a PostgreSQL database of the test's own), the real predictors.

PostgreSQL: `127.0.0.1:5432` by default (`TRIAGE_TEST_PG` overrides the server URL).
With CI=true or TRIAGE_REQUIRE_POSTGRES=1 an unreachable server fails the tests;
elsewhere they skip and say why. No file here may shadow a package: no __init__.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

PG_SERVER = os.environ.get("TRIAGE_TEST_PG", "postgresql://postgres@127.0.0.1:5432")


def require_postgres() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("TRIAGE_REQUIRE_POSTGRES") == "1"


def free_port() -> int:
    """A free port below the kernel's ephemeral range (Linux: 32768-60999): a server started
    on it binds only after its engine is up, and an ephemeral port (vLLM's own sockets take
    them meanwhile) could have been handed out again by then ("address already in use")."""
    import random

    for _ in range(500):
        port = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port in 20000-32000")


# --- predictors ---------------------------------------------------------------------------
def _have(home: Path) -> bool:
    return all((home / "predictors" / k / "triage_meta.json").exists() for k in ("urgency", "length"))


@pytest.fixture(scope="session")
def predictors_dir(tmp_path_factory) -> Path:
    """Trained predictors: the state dir's (`triage train all`), a prepared test home
    (TRIAGE_TEST_PREDICTORS_HOME), or small ones trained here (about a minute)."""
    from triage.paths import state_dir

    for home in (state_dir(), Path(os.environ.get("TRIAGE_TEST_PREDICTORS_HOME", "/nonexistent"))):
        if _have(home):
            return home / "predictors"
    from predictors.train import TrainConfig, train_length, train_urgency

    home = tmp_path_factory.mktemp("pred_home")
    cfg = TrainConfig(epochs=1, limit=320, seed=0)
    train_urgency(home / "predictors" / "urgency", cfg)
    train_length(home / "predictors" / "length", TrainConfig.length_head(limit=320, seed=0))
    return home / "predictors"


# --- databases ----------------------------------------------------------------------------
@pytest.fixture()
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'audit.db'}"


def pg_reachable() -> str | None:
    import psycopg

    try:
        with psycopg.connect(PG_SERVER + "/postgres", connect_timeout=3) as c:
            c.execute("SELECT 1")
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}".strip()


@contextlib.contextmanager
def pg_database(prefix: str = "triage_test"):
    """A PostgreSQL database of this test's own, dropped afterwards."""
    import psycopg

    why = pg_reachable()
    if why is not None:
        msg = f"PostgreSQL at {PG_SERVER} unreachable ({why})"
        if require_postgres():
            pytest.fail(msg + " and CI=true / TRIAGE_REQUIRE_POSTGRES=1 require it")
        pytest.skip(msg + "; set TRIAGE_REQUIRE_POSTGRES=1 to make this a failure")
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_SERVER + "/postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://{PG_SERVER.split('://', 1)[1]}/{name}", name
    finally:
        with psycopg.connect(PG_SERVER + "/postgres", autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'audit.db'}"
    else:
        with pg_database() as (url, _):
            yield url


# --- the server ---------------------------------------------------------------------------
class Server:
    """uvicorn serving `create_app(settings)` in a thread, on a free loopback port."""

    def __init__(self, settings, predictor=None) -> None:
        import uvicorn

        from serving.app import create_app

        self.settings = settings
        self.app = create_app(settings, predictor=predictor)
        # a stream still open at exit (a fixture's long blocker) is cancelled after 5 s, then the
        # app's own shutdown runs; without a limit uvicorn waits for it and the join gives up at 30 s
        self.config = uvicorn.Config(self.app, host="127.0.0.1", port=settings.port, log_level="warning",
                                     access_log=False, lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{settings.port}"

    def __enter__(self) -> "Server":
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("server failed to start (see log)")
            if time.monotonic() - t0 > 600:
                raise TimeoutError("server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def state(self):
        return self.app.state

    def client(self, key: str | None = None, timeout: float = 60.0) -> httpx.Client:
        h = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=h, timeout=timeout)

    def run_coro(self, coro):
        """Run a coroutine on the server's event loop (for white-box checks)."""
        loop = self.app.state.loop
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)


def make_settings(db_url: str, tmp_path: Path, predictors_dir: Path, **kw):
    from serving.settings import Settings

    base = dict(backend="simulated", db_url=db_url, port=free_port(), spool_path=tmp_path / "spool.jsonl",
                predictors_dir=predictors_dir, bootstrap_keys=False, writer_interval_s=0.05, db_retry_s=0.3,
                profile="a5000-qwen1.5-7b", max_inflight=4, max_queue=64, default_max_tokens=16)
    base.update(kw)
    return Settings(**base)


def make_keys(url: str) -> dict[str, str]:
    from serving.auth import create_key
    from serving.db.session import make_engine, upgrade

    upgrade(url)
    eng = make_engine(url)
    try:
        return {r: create_key(eng, r, "test") for r in ("client", "operator", "auditor", "admin")}
    finally:
        eng.dispose()


@pytest.fixture()
def service(db_url, tmp_path, predictors_dir):
    """A simulated-backend service on `db_url` with one key per role."""
    keys = make_keys(db_url)
    s = make_settings(db_url, tmp_path, predictors_dir)
    with Server(s) as srv:
        srv.keys = keys
        yield srv


def chat(client: httpx.Client, content: str, **kw) -> httpx.Response:
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": content}], **kw}
    return client.post("/v1/chat/completions", json=body)
