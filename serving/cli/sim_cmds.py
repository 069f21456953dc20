"""`triage simulate` and the policy benchmarks (`bench overhead`, `bench policies`, `bench goodput`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from serving.cli.apps import app, bench_app
from serving.cli.progress import progress_bar
from triage.paths import shared_datasets_dir

DEFAULT_TRACE = str(shared_datasets_dir() / "azure_llm_2023_conv.csv.gz")  # beside the checkout, wherever the command runs


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


LEVELS_HELP = "What the scheduler is told: oracle (the gold level), predicted (our urgency model on a text from --texts), noisy:E (adjacent-level confusion of rate E)"
LENGTHS_HELP = "oracle (the true output length), predicted (the length head on the text), noisy:E (doubled or halved with probability E)"
TEXTS_HELP = "Labelled texts for predicted inputs: corpus-test, ktas or a JSONL file of {text, level}"
TPOT_HELP = "SLO attainment's TPOT: mean (per request, the papers'), running (seed 002's max running TPOT) or max-gap"
TRUTH_HELP = ("Step-time truth: auto (measured engine residuals when the profile has samples, else model), model, "
              "measured, or steplog:FILE (the steps of a live engine's step log: that machine's speed and step shape)")


def parse_truth(value: str):
    """--truth: a truth name, or steplog:FILE read into the measured steps it holds."""
    from triage.sim.truth import TRUTHS, MeasuredSteps

    if value.startswith("steplog:"):
        from serving.steplog_report import StepLogError, engine_steps, load

        path = value.split(":", 1)[1]
        try:
            steps = engine_steps(load(path))
            return MeasuredSteps(tuple(steps), f"step log {path} ({len(steps)} steps)")
        except (StepLogError, ValueError) as e:
            raise typer.BadParameter(str(e), param_hint="--truth") from None
    if value not in TRUTHS:
        raise typer.BadParameter(f"unknown --truth {value!r}; use one of {', '.join(TRUTHS)} or steplog:FILE")
    return value


class SimInputs:
    """The inputs every trace-replaying command shares, checked once."""

    def __init__(self, levels: str, lengths: str, texts: Optional[str], tpot_metric: str, truth: str) -> None:
        from triage.sim.inputs import parse_mode
        from triage.sim.metrics import check_tpot_metric

        try:
            self.levels = parse_mode(levels, "--levels")
            self.lengths = parse_mode(lengths, "--lengths")
            self.tpot_metric = check_tpot_metric(tpot_metric)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        self.truth = parse_truth(truth)
        self.needs_texts = "predicted" in (self.levels.kind, self.lengths.kind)
        self.texts = texts or "corpus-test"
        self.pool = None
        self.pool_info: dict = {}
        if self.needs_texts or texts:
            from serving.cli.sim_inputs import text_pool

            self.pool, _, self.pool_info = text_pool(self.texts, predict=self.needs_texts, progress=_say)

    def kwargs(self) -> dict:
        return {"levels": self.levels, "lengths": self.lengths, "pool": self.pool if self.needs_texts else None,
                "tpot_metric": self.tpot_metric, "truth": self.truth}


def _say(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command()
def simulate(
    trace: Annotated[Path, typer.Option(help="Trace file (Azure, Mooncake or arrival,prompt_tokens,output_tokens[,level] CSV)")] = Path(DEFAULT_TRACE),
    policy: Annotated[str, typer.Option(help="Scheduling policy")] = "triage",
    profile: Annotated[str, typer.Option(help="Latency profile in data/profiles (burst: vllm-cpu-smollm2)")] = "",
    rate_scale: Annotated[float, typer.Option(help="Arrival-rate multiplier (2 = twice the load)")] = 1.0,
    rate: Annotated[Optional[float], typer.Option(help="lengths:NAME traces (sharegpt, arxiv, bwb): Poisson arrivals at this many req/s")] = None,
    limit: Annotated[Optional[int], typer.Option(help="First N requests")] = None,
    seed: int = 0,
    param: Annotated[list[str], typer.Option(help="Policy parameter KEY=VALUE (repeatable)")] = [],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    requests_out: Annotated[Optional[Path], typer.Option(help="Write one JSON line per request (level, arrival, token times, preemptions)")] = None,
    instances: Annotated[int, typer.Option(help="Co-located engine instances behind the router")] = 1,
    router: Annotated[str, typer.Option(help="round_robin, min_load, pab, gorouting")] = "round_robin",
    router_param: Annotated[list[str], typer.Option(help="Router parameter KEY=VALUE (repeatable), e.g. seat_wait=false")] = [],
    steal: Annotated[bool, typer.Option(help="Instances with a free seat take calls waiting elsewhere (the live front end's remote_steal)")] = False,
    pd: Annotated[Optional[str], typer.Option(help="P:D prefill and decode instances (disaggregated)")] = None,
    levels: Annotated[str, typer.Option(help=LEVELS_HELP)] = "oracle",
    lengths: Annotated[str, typer.Option(help=LENGTHS_HELP)] = "oracle",
    texts: Annotated[Optional[str], typer.Option(help=TEXTS_HELP + " (default corpus-test)")] = None,
    tpot_metric: Annotated[str, typer.Option(help=TPOT_HELP)] = "mean",
    truth: Annotated[str, typer.Option(help=TRUTH_HELP)] = "auto",
    truth_bias: Annotated[float, typer.Option(help="Multiply the true step times by this (a known estimator bias, for the online β to correct)")] = 1.0,
    scenario: Annotated[str, typer.Option(help="trace, or burst: bench serve's burst (--requests calls within --spread s)")] = "trace",
    requests: Annotated[int, typer.Option(help="burst: calls")] = 98,
    spread: Annotated[float, typer.Option(help="burst: the calls arrive within this many seconds")] = 3.0,
    max_tokens: Annotated[int, typer.Option(help="burst: max_tokens of every call")] = 64,
    output_tokens: Annotated[int, typer.Option(help="burst: tokens each call really produces (capped by max_tokens); 0 = what the served model answers to each text (its length label; chat prompts run to the cap)")] = 0,
    max_num_seqs: Annotated[Optional[int], typer.Option(help="Engine seats (burst default 32; else the profile's)")] = None,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option(help="Engine token budget per step (burst default 2048; else the profile's)")] = None,
) -> None:
    """Replay a trace (or bench serve's burst) through the simulator with one policy; print
    the per-gold-level report. These are simulation results."""
    from triage.classes import load_classes
    from triage.profiles import DEFAULT_PROFILE, load_profile
    from triage.sim.inputs import apply_inputs
    from triage.sim.metrics import summarize
    from triage.sim.simulator import StalledError, simulate as run, with_limits
    from triage.sim.traces import resolve_trace

    if scenario not in ("trace", "burst"):
        raise typer.BadParameter("--scenario must be trace or burst")
    if rate_scale <= 0:
        raise typer.BadParameter("--rate-scale must be > 0")
    if limit is not None and limit < 1:
        raise typer.BadParameter("--limit must be >= 1")
    if truth_bias <= 0:
        raise typer.BadParameter("--truth-bias must be > 0")
    burst = scenario == "burst"
    inputs = SimInputs(levels, lengths, texts if not burst else None, tpot_metric, truth)
    try:
        prof = load_profile(profile or ("vllm-cpu-smollm2" if burst else DEFAULT_PROFILE))
        prof = with_limits(prof, max_num_seqs=max_num_seqs or (32 if burst else None),
                           max_num_batched_tokens=max_num_batched_tokens or (2048 if burst else None))
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e)) from None
    classes = load_classes().scaled(prof.slo_scale)
    try:
        if burst:
            if requests < 1 or spread < 0 or max_tokens < 1 or output_tokens < 0:
                raise ValueError("--requests and --max-tokens must be >= 1, --output-tokens and --spread >= 0")
            from serving.cli.sim_inputs import burst_trace

            rows, pool, picks, pinfo = burst_trace(texts or "corpus-test", requests, spread, seed=seed,
                                                   max_tokens=max_tokens, output_tokens=output_tokens,
                                                   predict=inputs.needs_texts, progress=_say)
            reqs, info = apply_inputs(rows, levels=inputs.levels, lengths=inputs.lengths, pool=pool, seed=seed,
                                      picks=picks)
            inputs.pool_info = pinfo
        else:
            reqs = resolve_trace(trace, rate=rate, limit=limit, rate_scale=rate_scale, seed=seed,
                                 max_len=prof.max_request_tokens)
            reqs, info = apply_inputs(reqs, levels=inputs.levels, lengths=inputs.lengths,
                                      pool=inputs.pool if inputs.needs_texts else None, seed=seed)
        params = _parse_params(param)
        pol = prof.make_policy(policy, **params)
        router_params = _parse_params(router_param)
        if instances > 1 or pd:
            from triage.routing import make_router

            rt = make_router(router, **router_params)   # (its parameters checked here)
    except (ValueError, FileNotFoundError, TypeError) as e:
        raise typer.BadParameter(str(e)) from None
    if inputs.pool_info:
        info["predictions"] = inputs.pool_info
    try:
        with progress_bar(f"simulate {policy}", total=len(reqs)) as advance:
            if instances > 1 or pd:
                from triage.sim.cluster import simulate_cluster

                try:
                    res = simulate_cluster(reqs, lambda: prof.make_policy(policy, **params), prof, classes,
                                           instances=instances, router=rt, pd=pd, seed=seed, progress=advance,
                                           truth=inputs.truth, bias=truth_bias, steal=steal)
                except ValueError as e:
                    raise typer.BadParameter(str(e)) from None
            else:
                res = run(reqs, pol, prof, classes, seed=seed, progress=advance, truth=inputs.truth, bias=truth_bias)
    except StalledError as e:
        typer.echo(f"error: the simulation stalled: {e}", err=True)
        raise typer.Exit(1)
    if not res.requests:
        typer.echo("error: no request completed", err=True)
        raise typer.Exit(1)
    if requests_out:
        gold = res.gold
        with open(requests_out, "w") as f:
            for r in res.requests:
                f.write(json.dumps({"id": r.id, "level": gold[r.id], "seen_level": r.level, "arrival": r.arrival,
                                    "prompt_tokens": r.prompt_len, "predicted_output_len": r.predicted_output_len,
                                    "token_times": r.token_times, "preemptions": r.preemptions}) + "\n")
    if burst:
        report = _burst_report(res, prof, classes, policy, inputs, info, requests, spread, max_tokens, output_tokens,
                               seed)
        if instances > 1 or pd:
            report.update(instances=instances if not pd else pd, router=router, router_params=router_params, steal=steal,
                          per_instance={str(i): {"calls": sum(1 for r in res.requests if r.instance == i),
                                                 "output_tokens": sum(len(r.token_times) for r in res.requests
                                                                      if r.instance == i),
                                                 "last_finish_s": round(max((r.finish_time for r in res.requests
                                                                             if r.instance == i), default=0.0), 3)}
                                        for i in sorted({r.instance for r in res.requests})})
        typer.echo(json.dumps(report) if as_json else json.dumps(report, indent=1))
        return
    report = summarize(res.requests, classes, policy, gold=res.gold, tpot_metric=inputs.tpot_metric)
    report.update(profile=prof.name, rate_scale=rate_scale, steps=res.steps, sim_time_s=round(res.sim_time, 3),
                  instances=instances if not pd else pd, router=router, router_params=router_params,
                  steal=steal, inputs=info, estimator=res.estimator,
                  simulated=True)
    if "classifier" in info:
        report["classifier"] = info["classifier"]
    if as_json:
        typer.echo(json.dumps(report))
    else:
        print_report(report)


def _burst_report(res, prof, classes, policy, inputs, info, n, spread, max_tokens, output_tokens, seed) -> dict:
    """bench serve's JSON shape, one system: the simulated `policy`."""
    from triage.sim.metrics import serve_report
    from triage.sim.simulator import simulate as run
    from triage.sim.traces import TraceRequest

    wall = max(r.finish_time for r in res.requests) - min(r.arrival for r in res.requests)
    system = serve_report(res.requests, classes, res.origin, wall, inputs.tpot_metric)
    # the idle floor: bench serve's IDLE_TEXT call alone on the idle engine
    from serving.bench.serve import IDLE_TEXT
    from serving.cli.sim_inputs import prompt_token_counter

    idle = TraceRequest(0.0, prompt_token_counter()(IDLE_TEXT), min(output_tokens or max_tokens, max_tokens), 1,
                        max_tokens=max_tokens)
    floor = run([idle], prof.make_policy(policy), prof, classes, seed=seed, truth=inputs.truth)
    system["idle_ttft_ms"] = round(1000 * floor.requests[0].ttft, 1)
    system["classifier"] = info.get("classifier", {})
    system["estimator"] = res.estimator
    lim = prof.limits
    return {"scenario": "burst", "simulated": True, "trace": None, "rate_scale": None, "spread_s": spread,
            "slo_scale": prof.slo_scale, "texts": info.get("texts", "corpus-test"), "requests": n, "reps": 1,
            "profile": prof.name, "truth": res.estimator.get("truth"), "tpot_metric": inputs.tpot_metric,
            "engine": {"max_num_seqs": lim.max_num_seqs, "max_num_batched_tokens": lim.max_num_batched_tokens,
                       "max_model_len": lim.max_model_len},
            "output_tokens_per_call": round(sum(len(r.token_times) for r in res.requests) / max(1, len(res.requests)), 1),
            "output_tokens": "answers" if output_tokens == 0 else min(output_tokens, max_tokens),
            "max_tokens": max_tokens, "seed": seed,
            "inputs": info, "systems": {f"sim-{policy}": system}}


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    fmt = lambda v, d=3: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    inp = report.get("inputs", {})
    t = Table(title=f"simulation: {report['policy']} — {report['requests']} requests, TDG ratio {fmt(report['tdg_ratio'])}, "
                    f"SLO attainment {fmt(report['slo_attainment'])} (TPOT {report.get('tpot_metric', 'mean')}; "
                    f"levels {inp.get('levels', 'oracle')}, lengths {inp.get('lengths', 'oracle')})")
    for col in ("gold level", "requests", "SLO attained", "TDG ratio", "TTFT p50 s", "TTFT p99 s", "TPOT p99 s",
                "max gap p99 s", "norm. wait s/tok"):
        t.add_column(col, justify="right")
    for level, c in report["per_class"].items():
        t.add_row(level, str(c["requests"]), fmt(c["slo_attainment"]), fmt(c["tdg_ratio"]), fmt(c["ttft_p50"]),
                  fmt(c["ttft_p99"]), fmt(c["tpot_p99"]), fmt(c.get("max_gap_p99")), fmt(c["norm_wait_mean"], 4))
    Console().print(t)
    if report.get("classifier"):
        Console().print(f"classifier on the texts used: {report['classifier']}")
    if report.get("estimator"):
        e = report["estimator"]
        Console().print(f"estimator MAPE {e.get('mape_uncorrected')} uncorrected, {e.get('mape_corrected')} with online β "
                        f"(final β {e.get('beta_final')}; truth {e.get('truth', {}).get('kind')})")


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


def _run_sim(fn):
    """Run a simulation benchmark; bad inputs and stalls end with a clear message."""
    from triage.sim.bench import NothingCompleted
    from triage.sim.simulator import StalledError

    try:
        return fn()
    except (NothingCompleted, StalledError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1)
    except (ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)


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
    rate: Annotated[Optional[float], typer.Option(help="lengths:NAME traces (sharegpt, arxiv, bwb): Poisson req/s at scale 1")] = None,
    limit: int = 4000,
    seed: int = 0,
    profile: str = "",
    instances: int = 1,
    router: Annotated[str, typer.Option(help="Comma-separated routers (round_robin, min_load, pab, gorouting)")] = "round_robin",
    pd: Annotated[Optional[str], typer.Option(help="P:D disaggregated")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="Write a PNG plot here")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    levels: Annotated[str, typer.Option(help=LEVELS_HELP)] = "oracle",
    lengths: Annotated[str, typer.Option(help=LENGTHS_HELP)] = "oracle",
    texts: Annotated[Optional[str], typer.Option(help=TEXTS_HELP + " (default corpus-test)")] = None,
    tpot_metric: Annotated[str, typer.Option(help=TPOT_HELP)] = "mean",
    truth: Annotated[str, typer.Option(help=TRUTH_HELP)] = "auto",
) -> None:
    """Every policy at every rate scale on the same trace: TDG ratio and SLO attainment
    per gold level (simulation results)."""
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
    if not scales or any(x <= 0 for x in scales):
        raise typer.BadParameter("--rate-scales must be numbers > 0")
    if limit < 1:
        raise typer.BadParameter("--limit must be >= 1")
    inputs = SimInputs(levels, lengths, texts, tpot_metric, truth)
    with progress_bar("bench policies", total=len(names) * len(scales) * len(routers)) as advance:
        out = _run_sim(lambda: run(trace, names, scales, limit=limit, seed=seed, profile=profile or None,
                                   instances=instances, routers=routers, pd=pd, progress=advance, rate=rate,
                                   **inputs.kwargs()))
    out["simulated"] = True
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
    levels: Annotated[str, typer.Option(help=LEVELS_HELP)] = "oracle",
    lengths: Annotated[str, typer.Option(help=LENGTHS_HELP)] = "oracle",
    texts: Annotated[Optional[str], typer.Option(help=TEXTS_HELP + " (default corpus-test)")] = None,
    tpot_metric: Annotated[str, typer.Option(help=TPOT_HELP)] = "mean",
    truth: Annotated[str, typer.Option(help=TRUTH_HELP)] = "auto",
) -> None:
    """The largest rate scale at which the policy keeps SLO attainment >= target (bisection;
    simulation results)."""
    from triage.sim.bench import goodput

    if not 0 < target <= 1:
        raise typer.BadParameter("--target must be in (0, 1]")
    if not 0 < lo < hi or tol <= 0:
        raise typer.BadParameter("need 0 < --lo < --hi and --tol > 0")
    if limit < 1:
        raise typer.BadParameter("--limit must be >= 1")
    inputs = SimInputs(levels, lengths, texts, tpot_metric, truth)
    with progress_bar(f"goodput {policy}", total=int(2 + max(1, (hi - lo) / tol).bit_length())) as advance:
        out = _run_sim(lambda: goodput(trace, policy, target, limit=limit, seed=seed, profile=profile or None, lo=lo,
                                       hi=hi, tol=tol, progress=advance, **inputs.kwargs()))
    out["simulated"] = True
    typer.echo(json.dumps(out) if as_json else f"{out['policy']}: goodput scale {out['goodput_scale']}")
