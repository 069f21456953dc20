"""`triage bench serve`: the HTTP benchmark, our service beside stock vLLM."""
from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from serving.cli.sim_cmds import DEFAULT_TRACE

from serving.cli.apps import bench_app


@bench_app.command("serve")
def bench_serve(
    scenario: Annotated[str, typer.Option(help="burst (N calls within --spread s) or trace (a trace's arrivals)")] = "trace",
    requests: Annotated[int, typer.Option(help="calls per repetition")] = 300,
    spread: Annotated[float, typer.Option(help="burst: the calls arrive within this many seconds")] = 3.0,
    reps: Annotated[int, typer.Option(help="repetitions per system")] = 1,
    texts: Annotated[str, typer.Option(help="labelled texts: corpus-test, ktas or a JSONL file of {text, level}")] = "corpus-test",
    trace: Annotated[Path, typer.Option(help="trace scenario: the trace file")] = Path(DEFAULT_TRACE),
    rate_scale: Annotated[str, typer.Option(help="trace scenario: arrival-rate multiplier, or auto")] = "auto",
    systems: Annotated[str, typer.Option(help="comma-separated: triage, vllm-fcfs, vllm-priority, triage-instance (stock vLLM's "
                                                "server with our scheduler, fed our levels); "
                                                "triage:KEY=VALUE+KEY=VALUE is ours with those policy options or service settings")] = "triage,vllm-fcfs,vllm-priority",
    max_tokens: Annotated[int, typer.Option(help="burst: max_tokens of every call (temperature 0)")] = 64,
    max_tokens_cap: Annotated[int, typer.Option(help="trace: output lengths are clipped to this")] = 256,
    port: Annotated[int, typer.Option(help="the port every system is started on, in turn")] = 8100,
    seed: int = 0,
    workdir: Annotated[Optional[Path], typer.Option(help="logs and audit databases (default: a temp dir)")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="PNG: per-level first-token CDF per system, and the tokens/s each received second by second")] = None,
    turns: Annotated[bool, typer.Option(help="systems take turns: each repetition starts every system again, the order "
                                             "reversed every other turn, so a VM whose speed drifts charges every system "
                                             "alike; --no-turns: each system's repetitions back to back (one start each)")] = True,
    warm_cache: Annotated[bool, typer.Option(help="keep the prefix cache between repetitions (each repeat then finds its "
                                                  "prompts cached); off: emptied before each repetition, as new calls meet it")] = False,
    eager: Annotated[bool, typer.Option(help="every system without torch.compile (--enforce-eager): each starts in about "
                                             "half the time on CPU; the report's engine.eager says so")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report as the last line")] = False,
) -> None:
    """Start each system in turn (same model, engine sizes, port), replay the same calls
    over HTTP with streaming, and report first-token and token latency per gold level."""
    from serving.bench.report import against, against_line
    from serving.bench.serve import Turn, report_system, run_turn, slo_scale, with_predictions
    from serving.bench.systems import (SYSTEMS, BenchError, EngineSizes, alternating, check_system, dir_name,
                                       require_free_port)
    from serving.cli.progress import progress_bar

    names = [s.strip() for s in systems.split(",") if s.strip()]
    if not names:
        raise typer.BadParameter(f"no system given; systems are {', '.join(SYSTEMS)}", param_hint="--systems")
    for name in names:
        try:
            check_system(name)
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--systems")
    if scenario not in ("burst", "trace"):
        raise typer.BadParameter("scenario must be burst or trace", param_hint="--scenario")
    if requests < 1 or reps < 1 or spread < 0:
        raise typer.BadParameter("--requests and --reps must be >= 1, --spread >= 0")
    model = served_model_or_exit()
    sizes = EngineSizes(eager=eager)
    try:
        require_free_port(port)   # before the calls are classified and anything is started
    except BenchError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    tmp = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="triage-bench-"))
    try:
        calls, scale, auto = scenario_calls(scenario, texts, requests, spread, max_tokens, trace, rate_scale,
                                            max_tokens_cap, seed, calibrate=live_calibration(port, tmp, model, eager))
    except BenchError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    calls = with_predictions(calls)
    out = {"scenario": scenario, "trace": str(trace) if scenario == "trace" else None, "rate_scale": scale,
           "rate_scale_auto": auto, "spread_s": spread if scenario == "burst" else None, "slo_scale": slo_scale(),
           "texts": texts, "requests": len(calls), "reps": reps, "engine": sizes.__dict__, "systems": {}}
    raw: dict = {}
    turns = turns and reps > 1   # one repetition: one start a system either way
    rounds = alternating(names, reps) if turns else [(None, name) for name in names]
    acc: dict[str, Turn] = {name: Turn() for name in names}
    try:
        for rep, name in rounds:
            n_reps = reps if rep is None else 1
            label = name if rep is None else f"{name} (turn {rep + 1}/{reps})"
            with progress_bar(label, len(calls) * n_reps) as advance:
                done = [0]

                def tick(_r, done=done, advance=advance):
                    done[0] += 1
                    advance(done[0])

                acc[name].add(run_turn(name, calls, n_reps, sizes, port=port, workdir=tmp, model=str(model),
                                       on_done=tick, warm_cache=warm_cache))
            # each system's figures so far, after every turn: a run stopped later keeps them
            out["systems"][name], raw[name] = report_system(name, acc[name], tmp), acc[name].results
            (tmp / f"{dir_name(name)}.json").write_text(json.dumps({**out, "systems": {name: out["systems"][name]}}) + "\n")
            if rep is None or rep == reps - 1:
                typer.echo(_line(name, out["systems"][name]), err=True)
    except BenchError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    out["turns"] = turns
    if auto and "vllm-fcfs" in out["systems"]:
        from serving.bench.autoscale import TOO_LIGHT, live_check

        auto.update(live_check(auto, out["systems"]["vllm-fcfs"]))
        if auto.get("load_as_meant") is False:
            typer.echo(f"warning: the load auto chose was too light: stock fcfs met {auto['live_fcfs_esi1_attainment']} "
                       f"of its ESI-1 SLOs live (>= {TOO_LIGHT}; simulated {auto['fcfs_esi1_attainment']}), so there "
                       "was little queue to order. The calibration read the machine slower than the run found it "
                       f"(speed {auto.get('speed')}; see calibration_bursts). Run again, or pass --rate-scale.", err=True)
    # every other system as a multiple of each stock one's (issue 20's bars: ESI-1 at most
    # 0.5x vLLM priority's, tokens/s at least 0.95x vLLM fcfs's), repetition by repetition too
    out["x_stock"] = {b: against(out["systems"], b, "per_rep") for b in ("vllm-fcfs", "vllm-priority")
                      if b in out["systems"]}
    for b, xs in out["x_stock"].items():
        for name, x in xs.items():
            typer.echo(against_line(name, b, x), err=True)
    out["prefix_cache"] = "kept between repetitions" if warm_cache else "emptied before each repetition"
    out["workdir"] = str(tmp)
    if plot:
        _plot(out, raw, plot)
    typer.echo(json.dumps(out) if as_json else json.dumps(out, indent=1))


def served_model_or_exit() -> Path:
    """The prepared served model's directory, or a clear error and exit 2."""
    from serving.model_prep import default_model_dir

    model = default_model_dir()
    if not (model / "config.json").exists():
        typer.echo("error: the served model is not prepared: run `triage models prepare`", err=True)
        raise typer.Exit(2)
    return model


CALIBRATION_REPS = 2   # the faster of two: one disturbed burst (a slow spell of the VM, a cold server) moves auto a lot


def live_calibration(port: int, workdir: Path, model: Path, eager: bool = False) -> Callable[[list], dict]:
    """`calibrate` for scenario_calls: the calls' wall seconds on stock vLLM fcfs, started
    with the benchmark's engine sizes on the benchmark's port (then stopped), the faster of
    CALIBRATION_REPS bursts (the prefix cache emptied before each), and each burst's own
    figures (wall, VM steal, the engine's CPU seconds and CPU a step: a disturbed burst shows there). One
    burst taken alone read 10.98 s on a VM where three in a row then took 6.39, 5.92 and
    5.87 s: auto then ran at 0.24 instead of ~0.45, a load where every system met every SLO."""
    def run(calls: list) -> dict:
        from serving.bench.serve import run_system
        from serving.bench.systems import BenchError, EngineSizes

        typer.echo(f"rate scale auto: timing {len(calls)} calls on stock vLLM fcfs, {CALIBRATION_REPS} times "
                   "(today's machine speed)", err=True)
        out, _ = run_system("vllm-fcfs", calls, CALIBRATION_REPS, EngineSizes(eager=eager), port=port,
                            workdir=workdir / "calibration", model=str(model))
        if out["errors"] or not out["completed"]:
            raise BenchError(f"the calibration burst failed ({out['errors']} errors): see {workdir / 'calibration'}")
        walls = [r["wall_s"] for r in out["per_rep"]]
        typer.echo(f"rate scale auto: the bursts took {', '.join(f'{w:.2f}' for w in walls)} s", err=True)
        return {"wall_s": float(min(walls)), "per_rep": out["per_rep"]}

    return run


def scenario_calls(scenario: str, texts: str, requests: int, spread: float, max_tokens: int, trace: Path,
                   rate_scale: str, max_tokens_cap: int, seed: int, load_factor: float = 1.0,
                   calibrate: Optional[Callable[[list], float]] = None):
    """The calls of a burst or a trace replay, the trace's rate scale and, for `auto`, how
    it was found. `load_factor` multiplies an `auto` scale (e.g. by the number of
    instances); `calibrate(calls)` runs calls on the live engine and returns their wall
    seconds (`wall_s`) and each burst's figures (`per_rep`), so the simulator's search runs
    at today's machine speed. Bad input exits 2."""
    from serving.bench.serve import burst_calls, trace_calls
    from serving.bench.texts import PoolError, load_chat, load_pool

    try:
        pool = load_pool(texts)
        if scenario == "burst":
            return burst_calls(pool, load_chat(), requests, spread, seed=seed, max_tokens=max_tokens), None, None
        if not trace.exists():
            raise PoolError(f"trace {trace} not found")
        if rate_scale != "auto":
            scale = _rate_scale(rate_scale)
            return trace_calls(str(trace), pool, requests, scale, seed=seed, max_tokens_cap=max_tokens_cap), scale, None
        from serving.bench.autoscale import auto_rate_scale, calibration_calls, measure_speed
        from serving.bench.systems import EngineSizes
        from serving.cli.sim_inputs import prompt_token_counter

        sizes = EngineSizes()
        engine = dict(max_num_seqs=sizes.max_num_seqs, max_num_batched_tokens=sizes.max_num_batched_tokens, seed=seed)
        # the run's own calls at rate scale 1: the search compresses their arrivals
        calls = trace_calls(str(trace), pool, requests, 1.0, seed=seed, max_tokens_cap=max_tokens_cap)
        count = prompt_token_counter()
        prompt_tokens = [count(c.text) for c in calls]
        info: dict = {"found_in": "simulator (fcfs, profile vllm-cpu-smollm2, the run's own calls)", "speed": 1.0}
        if calibrate is not None:
            calib = calibration_calls(calls)
            timed = calibrate(calib)
            info.update(measure_speed(calib, prompt_tokens[:len(calib)], timed["wall_s"], **engine),
                        calibration_bursts=timed["per_rep"])
        found = auto_rate_scale(calls, prompt_tokens, speed=info["speed"], **engine)
        scale = found.pop("scale")
        info.update(found, single_instance_scale=scale)
        typer.echo(f"rate scale auto: x{scale} (simulated fcfs keeps {found['fcfs_esi1_attainment']} of the run's "
                   f"{found['esi1_calls']} ESI-1 calls in their SLO there, {found['fcfs_esi1_attainment_lighter']} "
                   "one step lighter)", err=True)
        scale = round(scale * load_factor, 4)
        return [replace(c, at=c.at / scale) for c in calls], scale, info
    except (PoolError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


def _rate_scale(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"--rate-scale must be a number or auto, got {value!r}") from None
    if x <= 0:
        raise ValueError("--rate-scale must be > 0")
    return x


def _line(name: str, s: dict) -> str:
    from serving.bench.report import order_note, steal_note

    one = s["per_level"].get("1", {})
    return (f"{name}: {s['completed']} ok, {s['errors']} errors, {s['tokens_per_s']} tok/s, burst {s['wall_s']} s, "
            f"ESI-1 TTFT p50 {one.get('ttft_p50_ms')} ms p99 {one.get('ttft_p99_ms')} ms "
            f"(caught: {s['esi1_caught']}), idle {s['idle_ttft_ms']} ms, client late <= {s['client_late_max_ms']} ms"
            + order_note(s.get("order")) + steal_note(s.get("vm_steal_s")))


def _plot(out: dict, raw: dict, path: Path) -> None:
    """Per gold level, the CDF of first-token times of every system; below them, the tokens
    each system's clients received second by second since its burst (or replay) began,
    averaged over its repetitions: where one system's tokens/s is lost (a slow ramp while
    the calls arrive, a long tail) shows as the gap between the lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from serving.bench.report import received_timeline
    from triage.sim.figure import save_figure

    levels = sorted({r.call.gold for res in raw.values() for r in res})
    fig, axes = plt.subplot_mosaic([[f"L{lv}" for lv in levels], ["T"] * len(levels)],
                                   figsize=(3.2 * len(levels), 6.4), height_ratios=(1, 0.9))
    for lv in levels:
        ax = axes[f"L{lv}"]
        for name, res in raw.items():
            xs = np.sort([r.ttft for r in res if r.call.gold == lv and r.ok])
            if len(xs):
                ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=name)
        ax.set_title(f"gold ESI-{lv}")
        ax.set_xlabel("first token (s)")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[f"L{levels[0]}"].set_ylabel("fraction of calls")
    axes[f"L{levels[0]}"].legend(fontsize=7)
    ax = axes["T"]
    for name, res in raw.items():
        starts, rates = received_timeline(res, reps=out["reps"])
        if len(starts):
            ax.step(starts, rates, where="post", label=name)
    ax.set_xlabel("seconds since the first call was sent")
    ax.set_ylabel("tokens/s received")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(f"bench serve: {out['scenario']}, {out['requests']} calls x {out['reps']} per system")
    save_figure(fig, path)


@bench_app.command("reproduce")
def bench_reproduce(
    seed: Annotated[str, typer.Option(help="Seed paper: 000 (ProServe), 001 (SlidingServe), 002 (FairBatching), 003 (FlowPrefill), 004 (semantic scheduling)")],
    quick: Annotated[bool, typer.Option(help="Fewer requests and loads (a smoke run; figures are not the documented ones)")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="PNG of the experiment's main figure")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report as the last line")] = False,
) -> None:
    """Replay a seed paper's headline experiment in the simulator as closely as our traces
    and profiles allow; per row the paper's figure, ours and the setup difference
    (simulation results; docs/reproduction.md)."""
    from serving.cli.progress import progress_bar
    from triage.sim import reproduce

    seed = seed.strip()
    if seed not in reproduce.SEEDS:
        raise typer.BadParameter(f"unknown seed {seed!r}; seeds: {', '.join(reproduce.SEEDS)}", param_hint="--seed")
    with progress_bar(f"reproduce seed {seed}", None) as advance:
        try:
            out = reproduce.run(seed, quick=quick, progress=advance)
        except (ValueError, FileNotFoundError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2)
    if plot:
        out["plot"] = str(reproduce.plot(out, plot))
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(f"seed {seed} (simulation results)")
    for r in out["rows"]:
        typer.echo(f"{r['metric']}\n    paper: {r['paper']}\n    ours:  {r['ours']}\n    setup: {r['setup']}")
