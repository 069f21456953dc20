"""`triage bench faults`: fault scenarios against a live server (serving/bench/faults.py)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from serving.cli.apps import bench_app


@bench_app.command("faults")
def bench_faults(
    scenarios: Annotated[str, typer.Option(help="comma-separated, run in this order: client_disconnect, slowloris, "
                                                "engine_kill, db_outage, sigterm_drain")] =
        "client_disconnect,slowloris,engine_kill,db_outage,sigterm_drain",
    backend: Annotated[str, typer.Option(help="vllm (default; engine_kill needs it) or simulated")] = "vllm",
    clients: Annotated[int, typer.Option(help="client_disconnect: clients that vanish mid-stream")] = 1000,
    outage: Annotated[float, typer.Option(help="db_outage: seconds PostgreSQL stays stopped")] = 30.0,
    db: Annotated[str, typer.Option(help="postgres (a throw-away cluster started here) or sqlite (no db_outage)")] = "postgres",
    port: Annotated[int, typer.Option(help="the server's port")] = 8130,
    max_num_seqs: Annotated[int, typer.Option(help="engine seats (vllm)")] = 8,
    workdir: Annotated[Optional[Path], typer.Option(help="logs, database, spool (default: a temp dir)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report as the last line")] = False,
) -> None:
    """Start a server (and a throw-away PostgreSQL cluster), run fault scenarios against it,
    report each one: {"scenarios": {NAME: {"ok": bool, ...figures}}}. Exit 1 unless all are ok."""
    from serving.bench.faults import SCENARIOS, run
    from serving.bench.systems import BenchError, EngineSizes, port_free
    from serving.model_prep import default_model_dir

    names = [s.strip() for s in scenarios.split(",") if s.strip()]
    bad = [s for s in names if s not in SCENARIOS]
    if bad or not names:
        raise typer.BadParameter(f"unknown scenario(s) {bad}; scenarios are {', '.join(SCENARIOS)}",
                                 param_hint="--scenarios")
    if backend not in ("vllm", "simulated"):
        raise typer.BadParameter("backend must be vllm or simulated", param_hint="--backend")
    if db not in ("postgres", "sqlite"):
        raise typer.BadParameter("db must be postgres or sqlite", param_hint="--db")
    if clients < 1 or outage <= 0 or max_num_seqs < 1:
        raise typer.BadParameter("--clients and --max-num-seqs must be >= 1, --outage > 0")
    if not port_free(port):
        raise typer.BadParameter(f"port {port} is in use", param_hint="--port")
    model = default_model_dir()
    if backend == "vllm" and not (model / "config.json").exists():
        typer.echo("error: the served model is not prepared: run `triage models prepare`", err=True)
        raise typer.Exit(2)
    tmp = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="triage-faults-"))
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    import sys

    console = Console(file=sys.stderr)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=not console.is_terminal) as prog:
        task = prog.add_task("faults", total=len(names) + 1)
        cd = prog.add_task("client_disconnect clients", total=clients, visible="client_disconnect" in names)

        def stage(s: str) -> None:
            if s != "starting the server":
                prog.advance(task)
            prog.update(task, description=s)

        try:
            out = run(names, backend=backend, workdir=tmp, port=port, model=str(model), clients=clients,
                      outage_s=outage, use_pg=db == "postgres",
                      sizes=EngineSizes(max_num_seqs=max_num_seqs), on_stage=stage,
                      tick=lambda: prog.advance(cd))
        except BenchError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1)
        prog.advance(task)
    for name, r in out["scenarios"].items():
        figs = ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("ok", "outcomes", "backend_after"))
        typer.echo(f"{name}: {'ok' if r['ok'] else 'FAILED'} ({figs})", err=True)
    typer.echo(json.dumps(out) if as_json else json.dumps(out, indent=1))
    if not all(r["ok"] for r in out["scenarios"].values()):
        raise typer.Exit(1)
