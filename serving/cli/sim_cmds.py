"""`triage simulate` and the policy benchmarks (`bench overhead`, `bench policies`, `bench goodput`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from serving.cli.apps import app, bench_app
from serving.cli.progress import progress_bar

DEFAULT_TRACE = "../shared/datasets/azure_llm_2023_conv.csv.gz"


def _parse_params(params: list[str]) -> dict:
    out = {}
    for p in params:
        k, sep, v = p.partition("=")
        if not sep:
            raise typer.BadParameter(f"--param expects KEY=VALUE, got {p!r}")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


@app.command()
def simulate(
    trace: Annotated[Path, typer.Option(help="Trace file (Azure, Mooncake or arrival,prompt_tokens,output_tokens[,level] CSV)")] = Path(DEFAULT_TRACE),
    policy: Annotated[str, typer.Option(help="Scheduling policy")] = "triage",
    profile: Annotated[str, typer.Option(help="Latency profile in data/profiles")] = "",
    rate_scale: Annotated[float, typer.Option(help="Arrival-rate multiplier (2 = twice the load)")] = 1.0,
    limit: Annotated[Optional[int], typer.Option(help="First N requests")] = None,
    seed: int = 0,
    param: Annotated[list[str], typer.Option(help="Policy parameter KEY=VALUE (repeatable)")] = [],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    requests_out: Annotated[Optional[Path], typer.Option(help="Write one JSON line per request (level, arrival, token times, preemptions)")] = None,
    instances: Annotated[int, typer.Option(help="Co-located engine instances behind the router")] = 1,
    router: Annotated[str, typer.Option(help="round_robin, min_load, pab, gorouting")] = "round_robin",
    pd: Annotated[Optional[str], typer.Option(help="P:D prefill and decode instances (disaggregated)")] = None,
) -> None:
    """Replay a trace through the simulator with one policy; print the per-class report."""
    from triage.classes import load_classes
    from triage.policies import make_policy
    from triage.profiles import DEFAULT_PROFILE, load_profile
    from triage.sim.metrics import summarize
    from triage.sim.simulator import simulate as run
    from triage.sim.traces import load_trace

    prof = load_profile(profile or DEFAULT_PROFILE)
    classes = load_classes().scaled(prof.slo_scale)
    try:
        reqs = load_trace(trace, limit=limit, rate_scale=rate_scale, seed=seed, max_len=prof.max_request_tokens)
        params = {**prof.policy_params(policy), **_parse_params(param)}
        pol = make_policy(policy, **params)
    except (ValueError, FileNotFoundError, TypeError) as e:
        raise typer.BadParameter(str(e)) from None
    with progress_bar(f"simulate {policy}", total=len(reqs)) as advance:
        if instances > 1 or pd:
            from triage.sim.cluster import simulate_cluster

            try:
                res = simulate_cluster(reqs, lambda: make_policy(policy, **params), prof, classes,
                                       instances=instances, router=router, pd=pd, seed=seed, progress=advance)
            except ValueError as e:
                raise typer.BadParameter(str(e)) from None
        else:
            res = run(reqs, pol, prof, classes, seed=seed, progress=advance)
    if requests_out:
        with open(requests_out, "w") as f:
            for r in res.requests:
                f.write(json.dumps({"id": r.id, "level": r.level, "arrival": r.arrival, "prompt_tokens": r.prompt_len,
                                    "token_times": r.token_times, "preemptions": r.preemptions}) + "\n")
    report = summarize(res.requests, classes, policy)
    report.update(profile=prof.name, rate_scale=rate_scale, steps=res.steps, sim_time_s=round(res.sim_time, 3),
                  instances=instances if not pd else pd, router=router)
    if as_json:
        typer.echo(json.dumps(report))
    else:
        print_report(report)


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    fmt = lambda v, d=3: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    t = Table(title=f"{report['policy']} — {report['requests']} requests, TDG ratio {fmt(report['tdg_ratio'])}, "
                    f"SLO attainment {fmt(report['slo_attainment'])}")
    for col in ("level", "requests", "SLO attained", "TDG ratio", "TTFT p50 s", "TTFT p99 s", "max-TPOT p99 s", "norm. wait s/tok"):
        t.add_column(col, justify="right")
    for level, c in report["per_class"].items():
        t.add_row(level, str(c["requests"]), fmt(c["slo_attainment"]), fmt(c["tdg_ratio"]), fmt(c["ttft_p50"]),
                  fmt(c["ttft_p99"]), fmt(c["tpot_p99"]), fmt(c["norm_wait_mean"], 4))
    Console().print(t)


@bench_app.command("overhead")
def bench_overhead(
    waiting: int = 1000,
    running: int = 256,
    policy: Annotated[str, typer.Option(help="Policy to time")] = "triage",
    peer: Annotated[Optional[str], typer.Option(help="Time vLLM's own schedule() instead (vllm-fcfs, vllm-priority)")] = None,
    repeats: int = 300,
    profile: str = "",
    seed: int = 0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Time one plan() call at a given queue state: p50/p99 in microseconds."""
    if peer:
        from serving.peers import peer_overhead

        out = peer_overhead(peer, waiting, running, repeats)
    else:
        from triage.overhead import time_plan

        out = time_plan(policy, waiting=waiting, running=running, repeats=repeats, profile=profile or None, seed=seed)
    cpu = f" (thread CPU: p50 {out['cpu_p50_us']:.0f} µs, p99 {out['cpu_p99_us']:.0f} µs)" if "cpu_p50_us" in out else ""
    typer.echo(json.dumps(out) if as_json else f"{out['name']}: p50 {out['p50_us']:.0f} µs, p99 {out['p99_us']:.0f} µs{cpu}")


def _floats(csv: str) -> list[float]:
    try:
        return [float(x) for x in csv.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, got {csv!r}") from None


@bench_app.command("policies")
def bench_policies(
    trace: Annotated[Path, typer.Option(help="Trace file")] = Path(DEFAULT_TRACE),
    policies: Annotated[str, typer.Option(help="Comma-separated policy names")] = "fcfs,sarathi-fcfs,slidebatching,triage",
    rate_scales: Annotated[str, typer.Option(help="Comma-separated rate scales")] = "0.05,0.1,0.15,0.2",
    limit: int = 4000,
    seed: int = 0,
    profile: str = "",
    instances: int = 1,
    router: Annotated[str, typer.Option(help="Comma-separated routers (round_robin, min_load, pab, gorouting)")] = "round_robin",
    pd: Annotated[Optional[str], typer.Option(help="P:D disaggregated")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write a PNG plot here")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Every policy at every rate scale on the same trace: TDG ratio and SLO attainment."""
    from triage.policies import POLICIES
    from triage.sim.bench import bench_policies as run, plot_policies

    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        raise typer.BadParameter(f"unknown policies {unknown}; known: {', '.join(sorted(POLICIES))}")
    from triage.routing import ROUTERS

    routers = [r.strip() for r in router.split(",") if r.strip()]
    unknown = [r for r in routers if r not in ROUTERS]
    if unknown or not routers:
        raise typer.BadParameter(f"unknown routers {unknown}; known: {', '.join(sorted(ROUTERS))}")
    scales = _floats(rate_scales)
    with progress_bar("bench policies", total=len(names) * len(scales) * len(routers)) as advance:
        out = run(trace, names, scales, limit=limit, seed=seed, profile=profile or None, instances=instances,
                  routers=routers, pd=pd, progress=advance)
    if plot:
        plot_policies(out["rows"], plot)
        out["plot"] = str(plot)
    if as_json:
        typer.echo(json.dumps(out))
    else:
        for r in out["rows"]:
            typer.echo(f"{r['rate_scale']:>6} {r['policy']:>18} {r['router']:>12}  TDG {r['tdg_ratio']:.3f}  SLO {r['slo_attainment']:.3f}  "
                       f"ESI-1 SLO {(r['per_class'].get('1') or {}).get('slo_attainment', float('nan')):.3f}")


@bench_app.command("goodput")
def bench_goodput(
    trace: Annotated[Path, typer.Option(help="Trace file")] = Path(DEFAULT_TRACE),
    policy: str = "triage",
    target: Annotated[float, typer.Option(help="Overall SLO attainment to sustain")] = 0.9,
    limit: int = 4000,
    seed: int = 0,
    profile: str = "",
    lo: float = 0.01,
    hi: float = 1.0,
    tol: float = 0.005,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The largest rate scale at which the policy keeps SLO attainment >= target (bisection)."""
    from triage.sim.bench import goodput

    if not 0 < target <= 1:
        raise typer.BadParameter("--target must be in (0, 1]")
    with progress_bar(f"goodput {policy}", total=int(2 + max(1, (hi - lo) / tol).bit_length())) as advance:
        out = goodput(trace, policy, target, limit=limit, seed=seed, profile=profile or None, lo=lo, hi=hi, tol=tol,
                      progress=advance)
    typer.echo(json.dumps(out) if as_json else f"{out['policy']}: goodput scale {out['goodput_scale']}")
