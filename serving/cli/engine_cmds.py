"""Engine commands: models prepare (more registered by the vLLM work)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from serving.cli.sim_cmds import DEFAULT_TRACE

from serving.cli.apps import models_app


@models_app.command("prepare")
def models_prepare(
    out: Annotated[Optional[Path], typer.Option(help="Output directory (default: state dir)")] = None,
    force: bool = False,
) -> None:
    """Convert the embedded SmolLM2 GGUF into a Hugging Face directory vLLM can serve."""
    from serving.model_prep import prepare_default_model

    path = prepare_default_model(out, force=force)
    typer.echo(str(path))


# ------------------------------------------------------------------ latency profiles
from serving.cli.apps import bench_app, profile_app  # noqa: E402


def _fit_profile(backend: str, model: Optional[str], name: str, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, kv_cache_gib: float, samples_out: Optional[Path], as_json: bool) -> None:
    import asyncio
    import json

    if backend != "vllm":
        raise typer.BadParameter(f"backend {backend!r}: only 'vllm' can be profiled")
    from serving.model_prep import default_model_dir, prepare_default_model
    from serving.profiler import profile_engine

    model_path = model or str(default_model_dir())
    if model is None:
        prepare_default_model()
    path, prof = asyncio.run(profile_engine(
        model_path, name, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, kv_cache_gib=kv_cache_gib,
        samples_out=samples_out, progress=lambda m: typer.echo(m, err=True)))
    if as_json:
        typer.echo(json.dumps({"path": str(path), **prof}))
    else:
        typer.echo(f"wrote {path}: MAPE (held-out) proserve {prof['mape_detail']['proserve']:.3f}, "
                   f"slidingserve {prof['mape_detail']['slidingserve']:.3f}; slo_scale {prof['slo_scale']}")


@profile_app.callback()
def profile_main(
    ctx: typer.Context,
    backend: Annotated[Optional[str], typer.Option(help="Engine to profile (vllm): `triage profile --backend vllm --model …`")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model path or name (default: the embedded SmolLM2)")] = None,
    name: Annotated[str, typer.Option(help="Profile name: writes data/profiles/NAME.json")] = "vllm-cpu-smollm2",
) -> None:
    """Latency profiles: `profile --backend vllm --model …` (= `profile fit`), `profile show NAME`."""
    if ctx.invoked_subcommand is None:
        if backend is None:
            typer.echo(ctx.get_help())
            raise typer.Exit(0)
        _fit_profile(backend, model, name, 32, 512, 2048, 1.0, None, False)


@profile_app.command("fit")
def profile_fit(
    backend: Annotated[str, typer.Option(help="Engine to profile (vllm)")] = "vllm",
    model: Annotated[Optional[str], typer.Option(help="Model path or name (default: the embedded SmolLM2)")] = None,
    name: Annotated[str, typer.Option(help="Profile name: writes data/profiles/NAME.json")] = "vllm-cpu-smollm2",
    max_num_seqs: int = 32,
    max_num_batched_tokens: int = 512,
    max_model_len: int = 2048,
    kv_cache_gib: float = 1.0,
    samples_out: Annotated[Optional[Path], typer.Option(help="Also write the raw (batch, seconds) samples here")] = None,
    from_samples: Annotated[Optional[Path], typer.Option(help="Refit from samples saved with --samples-out (no engine)")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Sweep batches on the real engine, fit ProServe and SlidingServe, write the profile."""
    if from_samples is not None:
        import json

        from serving.profiler import refit

        path, prof = refit(from_samples, name)
        typer.echo(json.dumps({"path": str(path), **prof}) if as_json else
                   f"wrote {path}: MAPE (held-out) proserve {prof['mape_detail']['proserve']:.3f}, "
                   f"slidingserve {prof['mape_detail']['slidingserve']:.3f}; slo_scale {prof['slo_scale']}")
        return
    _fit_profile(backend, model, name, max_num_seqs, max_num_batched_tokens, max_model_len, kv_cache_gib,
                 samples_out, as_json)


@profile_app.command("show")
def profile_show(
    name: Annotated[str, typer.Argument(help="Profile name in data/profiles (or a .json path)")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Print a profile: name, fit error (MAPE on held-out batches), estimator, KV, limits."""
    import json

    from triage.profiles import load_profile

    try:
        prof = load_profile(name)
    except FileNotFoundError as e:
        raise typer.BadParameter(str(e)) from None
    out = {"name": prof.name, "mape": prof.raw.get("mape"), **{k: v for k, v in prof.raw.items() if k not in ("name", "mape")}}
    if as_json:
        typer.echo(json.dumps(out))
    else:
        typer.echo(json.dumps(out, indent=2))


# ------------------------------------------------------------------ bench peers
@bench_app.command("peers")
def bench_peers(
    trace: Annotated[Path, typer.Option(help="Trace file")] = Path(DEFAULT_TRACE),
    rate_scale: Annotated[float, typer.Option(help="Arrival-rate multiplier")] = 1.0,
    profile: Annotated[str, typer.Option(help="Latency profile in data/profiles")] = "vllm-cpu-smollm2",
    limit: Annotated[Optional[int], typer.Option(help="First N requests")] = None,
    seed: int = 0,
    scheduler: Annotated[list[str], typer.Option(help="Subset of vllm-fcfs, vllm-priority, triage (repeatable)")] = [],
    param: Annotated[list[str], typer.Option(help="Policy parameter of the triage row, KEY=VALUE (repeatable)")] = [],
    scenario: Annotated[str, typer.Option(help="trace, or burst: bench serve's burst (--requests calls within --spread s, its engine sizes)")] = "trace",
    requests: Annotated[int, typer.Option(help="burst: calls")] = 98,
    spread: Annotated[float, typer.Option(help="burst: the calls arrive within this many seconds")] = 3.0,
    texts: Annotated[str, typer.Option(help="burst: the labelled texts the calls are drawn from")] = "corpus-test",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """vLLM's own Scheduler (fcfs, priority) and our plugin on the same stream, with a
    model-runner stand-in timed by the profile (no model execution: a simulation of the
    engine, with each scheduler's own time per step measured)."""
    import json

    from serving.peers import SCHEDULERS, compare, compare_burst

    kinds = tuple(scheduler) or SCHEDULERS
    if scenario not in ("trace", "burst"):
        raise typer.BadParameter("--scenario must be trace or burst")
    if requests < 1 or spread < 0:
        raise typer.BadParameter("--requests must be >= 1 and --spread >= 0")
    for k in kinds:
        if k not in SCHEDULERS:
            raise typer.BadParameter(f"unknown scheduler {k!r}; known: {', '.join(SCHEDULERS)}")
    try:
        params = {}
        for p in param:
            k, sep, v = p.partition("=")
            if not sep:
                raise ValueError(f"--param expects KEY=VALUE, got {p!r}")
            try:
                params[k] = json.loads(v)
            except json.JSONDecodeError:
                params[k] = v
        progress = None if as_json else (lambda k, n: typer.echo(f"{k}: {n} done", err=True))
        if scenario == "burst":
            out = compare_burst(texts, requests, spread, profile_name=profile, seed=seed, schedulers=kinds,
                                policy_params=params or None, progress=progress)
        else:
            out = compare(str(trace), rate_scale=rate_scale, profile_name=profile, limit=limit, seed=seed,
                          schedulers=kinds, policy_params=params or None, progress=progress)
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e)) from None
    if as_json:
        typer.echo(json.dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    fmt = lambda v, d=3: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    what = f"burst of {requests} in {spread:g} s" if scenario == "burst" else f"rate x{rate_scale}"
    t = Table(title=f"bench peers (simulated engine) — {out['requests']} requests, {what}, profile {out['profile']}")
    for col in ("scheduler", "TDG ratio", "SLO att.", "ESI-1 SLO", "ESI-2 SLO", "ESI-1 TTFT p99 s", "step p99 µs",
                "steps", "sched ms/step", "preemptions"):
        t.add_column(col, justify="right")
    for r in out["rows"]:
        pc = r["per_class"]
        t.add_row(r["scheduler"], fmt(r["tdg_ratio"]), fmt(r["slo_attainment"]),
                  fmt(pc.get("1", {}).get("slo_attainment")), fmt(pc.get("2", {}).get("slo_attainment")),
                  fmt(pc.get("1", {}).get("ttft_p99")), fmt(r["step_overhead_p99_us"], 0), str(r["steps"]),
                  fmt(r["cpu_ms_per_step"], 2), str(r["preemptions"]))
    Console().print(t)
