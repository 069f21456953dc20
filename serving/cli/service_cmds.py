"""Service commands: `triage serve`, `triage keys create`, `triage db upgrade|check|verify`.

Heavy modules are imported inside the functions so `triage --help` stays fast.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from serving.cli.apps import app, db_app, keys_app

DbOpt = Annotated[Optional[str], typer.Option("--db", help="Database URL (default: SQLite in the state dir)")]


def _settings(**kw):
    from serving.settings import Settings, UnsafeSettings

    try:
        return Settings(**{k: v for k, v in kw.items() if v is not None})
    except (UnsafeSettings, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


@app.command("serve")
def serve(
    backend: Annotated[Optional[str], typer.Option(help="vllm (default), simulated or remote")] = None,
    instances: Annotated[Optional[str], typer.Option(help="remote: comma-separated `triage instance` URLs")] = None,
    router: Annotated[Optional[str], typer.Option(help="remote: gorouting (default), min_load, pab, round_robin")] = None,
    profile: Annotated[Optional[str], typer.Option(help="latency profile of the simulated backend")] = None,
    db: DbOpt = None,
    host: Annotated[Optional[str], typer.Option(help="bind address (default 127.0.0.1)")] = None,
    port: Annotated[Optional[int], typer.Option(help="port (default 8000)")] = None,
    policy: Annotated[Optional[str], typer.Option(help="engine-level scheduling policy (default triage)")] = None,
    model: Annotated[Optional[str], typer.Option(help="served model directory (vllm backend)")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
) -> None:
    """Start the triage service (OpenAI-compatible API, operators, auditors, metrics).
    SIGTERM drains it gracefully (exit 0); a second SIGTERM exits at once (exit 1)."""
    import logging
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    s = _settings(backend=backend, profile=profile, db_url=db, host=host, port=port, policy=policy, model=model,
                  instances=instances, router=router)
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _ensure_predictors(s)
    from serving.app import create_app
    from serving.drain import serve as serve_draining

    url = f"http://{s.host}:{s.port}"
    typer.echo(f"Triage ({s.backend} backend) starting on {url}\n"
               f"  try: curl -s {url}/v1/chat/completions -H 'Authorization: Bearer $KEY' "
               "-H 'Content-Type: application/json' "
               "-d '{\"model\": \"" + s.served_model_name + "\", \"messages\": "
               "[{\"role\": \"user\", \"content\": \"chest pain, short of breath\"}]}'\n"
               f"  operator page: {url}/ui   metrics: {url}/metrics")
    # SIGTERM drains (503 to new calls, in-flight ones finish, audit flushed, exit 0); a second exits now
    serve_draining(create_app(s), s, log_level=log_level)


def _ensure_predictors(s) -> None:
    """A missing predictor is trained now, with a progress bar (never replaced by a stub)."""
    from predictors.model import default_model_dir

    if s.predictors_dir:
        dirs = [Path(s.predictors_dir) / k for k in ("urgency", "length")]
    else:
        dirs = [default_model_dir(k) for k in ("urgency", "length")]
    if all((d / "triage_meta.json").exists() for d in dirs):
        return
    if s.predictors_dir:
        typer.echo(f"error: no trained predictors under {s.predictors_dir}", err=True)
        raise typer.Exit(2)
    typer.echo("The predictors are not trained yet: training them now (once).", err=True)
    from serving.cli.predictor_cmds import train_all

    train_all(if_missing=True)


@keys_app.command("create")
def keys_create(
    role: Annotated[str, typer.Option("--role", help="client | operator | auditor | admin")],
    db: DbOpt = None,
    name: Annotated[Optional[str], typer.Option(help="a note for people (not secret)")] = None,
) -> None:
    """Create an API key; prints the key alone on stdout (it is stored hashed)."""
    from serving.db.models import ROLES
    from serving.key_admin import create

    if role not in ROLES:
        typer.echo(f"error: unknown role {role!r}; roles: {', '.join(ROLES)}", err=True)
        raise typer.Exit(2)
    eng, spool = _key_db(db)
    try:
        _, key, rec = create(eng, role, name, "cli")
        _audited(eng, spool, rec)   # an audit event names the key id and role, never the secret
    finally:
        eng.dispose()
    sys.stdout.write(key + "\n")


def _key_db(db):
    from serving.db.session import make_engine, upgrade

    url = _settings(db_url=db).resolved_db_url()
    upgrade(url)
    return make_engine(url), _settings(db_url=db).resolved_spool_path()


def _audited(eng, spool, rec) -> None:
    from serving.db.writer import AuditWriter

    AuditWriter(eng, spool).write_now([rec])


@keys_app.command("list")
def keys_list(db: DbOpt = None) -> None:
    """List API keys (id, role, name, created, revoked); never the secrets."""
    from serving.key_admin import list_keys

    eng, _ = _key_db(db)
    try:
        for k in list_keys(eng):
            typer.echo(f"{k['id']}  {k['role']:<8}  {'revoked' if k['revoked'] else 'active ':<7}  "
                       f"{k['created_at']}  {k['name'] or ''}")
    finally:
        eng.dispose()


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="the key's id (tri_<id>_...)")], db: DbOpt = None) -> None:
    """Revoke a key. A running server refuses it within `key_cache_s` (5 s), no restart."""
    from serving.key_admin import KeyNotFound, LastAdmin, revoke

    eng, spool = _key_db(db)
    try:
        out, rec = revoke(eng, key_id, "cli")
        _audited(eng, spool, rec)
    except (KeyNotFound, LastAdmin) as e:
        typer.echo(f"error: {e if isinstance(e, LastAdmin) else f'no API key with id {key_id!r}'}", err=True)
        raise typer.Exit(2)
    finally:
        eng.dispose()
    typer.echo(f"revoked {out['id']} ({out['role']})", err=True)


@keys_app.command("rotate")
def keys_rotate(key_id: Annotated[str, typer.Argument(help="the key's id")], db: DbOpt = None) -> None:
    """Issue a new key with the same role and name and revoke the old one; prints the new key alone on stdout."""
    from serving.key_admin import KeyNotFound, rotate

    eng, spool = _key_db(db)
    try:
        out, key, rec = rotate(eng, key_id, "cli")
        _audited(eng, spool, rec)
    except KeyNotFound:
        typer.echo(f"error: no API key with id {key_id!r}", err=True)
        raise typer.Exit(2)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    finally:
        eng.dispose()
    sys.stdout.write(key + "\n")


@db_app.command("upgrade")
def db_upgrade(db: DbOpt = None) -> None:
    """Apply the Alembic migrations (alembic upgrade head)."""
    from serving.db.session import upgrade

    url = _settings(db_url=db).resolved_db_url()
    upgrade(url)
    typer.echo("database at head")


@db_app.command("check")
def db_check(db: DbOpt = None) -> None:
    """Compare the database schema with the models (exit 1 on any difference)."""
    from serving.db.session import schema_diff

    diff = schema_diff(_settings(db_url=db).resolved_db_url())
    if diff:
        for d in diff:
            typer.echo(repr(d))
        raise typer.Exit(1)
    typer.echo("schema equals the models")


def _existing_db(db: str | None) -> tuple[str, str]:
    """The audit database's URL and how to show it (no password); exit 2 where a SQLite
    file is not there (opening it would create an empty one)."""
    from sqlalchemy.engine import make_url

    url = _settings(db_url=db).resolved_db_url()
    shown = make_url(url).render_as_string(hide_password=True)
    if url.startswith("sqlite") and not Path(url.split("///", 1)[-1]).is_file():
        typer.echo(f"error: no database at {shown}", err=True)
        raise typer.Exit(2)
    return url, shown


def _driver_says(e: Exception) -> str:
    """The database driver's own first line: no password, no SQL."""
    return str(getattr(e, "orig", None) or type(e).__name__).strip().splitlines()[0][:200]


@db_app.command("verify")
def db_verify(
    db: DbOpt = None,
    export: Annotated[Optional[Path], typer.Option("--export", help="an export of GET /audit/export (JSON lines; - for stdin) instead of the database")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Re-verify the audit hash chain offline, as GET /audit/verify does: every event's hash
    and link, and (with the database) that every sealed request and relabel row is unchanged
    and present. Exit 0: intact; 1: a problem (printed); 2: nothing readable to verify."""
    import json

    if export is not None and db is not None:
        typer.echo("error: give --db or --export, not both", err=True)
        raise typer.Exit(2)
    if export is not None:
        from serving.db.chain import verify_export

        try:
            text = sys.stdin.read() if str(export) == "-" else export.read_text(encoding="utf-8")
            res = verify_export(text.splitlines())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            typer.echo(f"error: {export}: {e}", err=True)
            raise typer.Exit(2)
        what = f"export {export}, events {res['first_id']}-{res['last_id']}" + (
            "" if res["starts_at_genesis"] else f", from prev_hash {res['first_prev_hash'][:16]}… (a window: match it to the export before)")
    else:
        from sqlalchemy.exc import SQLAlchemyError

        from serving.db.writer import verify_url

        url, shown = _existing_db(db)
        try:
            res = verify_url(url)
        except SQLAlchemyError as e:
            typer.echo(f"error: cannot read the audit events of {shown}: {_driver_says(e)}", err=True)
            raise typer.Exit(2)
        what = f"database {shown}"
    if as_json:
        typer.echo(json.dumps(res))
    elif res["ok"]:
        typer.echo(f"intact: {res['events']} audit events ({what})")
    else:
        typer.echo(f"BROKEN after {res['events']} audit events ({what}): {res['problem']}")
    if not res["ok"]:
        raise typer.Exit(1)


@db_app.command("order")
def db_order(
    db: DbOpt = None,
    since: Annotated[Optional[str], typer.Option(help="calls that arrived from (ISO 8601 with a zone, or UNIX seconds)")] = None,
    until: Annotated[Optional[str], typer.Option(help="... until (exclusive)")] = None,
    tolerance: Annotated[float, typer.Option(min=0, max=60, help="s: a call started within this of a more urgent one's arrival was already running")] = 1.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Was the most urgent call served first? The order check of GET /audit/order, offline on
    the audit database: every call started while a more urgent one on its engine waited (the
    inversions, per level). Exit 0: no ESI-1 call was overtaken; 1: some were (listed); 2:
    nothing readable."""
    import json

    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import Session

    from serving.api.audit_routes import parse_time
    from serving.api.errors import APIError
    from serving.db.order import order_calls
    from serving.db.session import make_engine
    from triage.order_audit import order_audit

    try:
        t0, t1 = parse_time(since, "--since"), parse_time(until, "--until")
    except APIError as e:
        raise typer.BadParameter(e.message) from None
    url, shown = _existing_db(db)
    eng = make_engine(url)
    try:
        with Session(eng) as s:
            calls, more = order_calls(s, t0, t1)
    except SQLAlchemyError as e:
        typer.echo(f"error: cannot read the requests of {shown}: {_driver_says(e)}", err=True)
        raise typer.Exit(2)
    finally:
        eng.dispose()
    res = {"truncated": more, **order_audit(calls, tolerance_s=tolerance)}
    if as_json:
        typer.echo(json.dumps(res))
    else:
        e1 = res["esi1"]
        typer.echo(f"{res['calls']} calls{' (the first 20,000)' if more else ''}: {e1['overtaken']} of {e1['calls']} ESI-1 "
                   f"calls overtaken by a less urgent one ({e1['overtaken_by_later']} by one that came later), "
                   f"{res['inversions']} inversions at any level (tolerance {tolerance:g} s)")
        for lv, x in res["per_level"].items():
            by = ", ".join(f"L{b} {n}" for b, n in x["overtaken_by_levels"].items()) or "-"
            typer.echo(f"  L{lv}: {x['calls']} calls, {x['overtaken']} overtaken, {x['overtaken_by_later']} by a later "
                       f"call (pairs by level: {by})")
        for w in res["worst"][:5]:
            typer.echo(f"  {w['id']} (L{w['level']}) waited {w['waited_after_s']:.2f} s more after "
                       f"{w['first_overtaker']['id']} (L{w['first_overtaker']['level']}) had its first token")
    if not res["ok"]:
        raise typer.Exit(1)
