"""`triage bench error-rate`: seed 004 §4.1's classifier error-rate study, in the simulator."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from serving.cli.apps import bench_app
from serving.cli.progress import progress_bar
from serving.cli.sim_cmds import DEFAULT_TRACE, TPOT_HELP, TRUTH_HELP, _floats, _parse_params, _run_sim, parse_truth


@bench_app.command("error-rate")
def bench_error_rate(
    rates: Annotated[str, typer.Option(help="Comma-separated level error rates E (noisy:E), each in [0, 1]")] = "0,0.1,0.2,0.3,0.4",
    policies: Annotated[str, typer.Option(help="Comma-separated policies")] = "triage,semantic,fcfs,sarathi-priority",
    trace: Annotated[Path, typer.Option(help="Trace file")] = Path(DEFAULT_TRACE),
    rate_scale: Annotated[float, typer.Option(help="Arrival-rate multiplier of the trace")] = 0.1,
    limit: int = 4000,
    seed: int = 0,
    profile: str = "",
    predicted_texts: Annotated[Optional[str], typer.Option(help="Also run --levels predicted on these labelled texts (ktas, corpus-test or a JSONL file); 'none' to skip")] = "ktas",
    lengths: Annotated[str, typer.Option(help="Lengths the scheduler sees: oracle, noisy:E (predicted needs texts)")] = "oracle",
    tpot_metric: Annotated[str, typer.Option(help=TPOT_HELP)] = "mean",
    truth: Annotated[str, typer.Option(help=TRUTH_HELP)] = "auto",
    param: Annotated[list[str], typer.Option(help="A parameter of the triage policy, KEY=VALUE (repeatable), e.g. protected_pace=0.25")] = [],
    plot: Annotated[Optional[Path], typer.Option(help="PNG: ESI-1 normalized wait and SLO attainment against E")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON report as the last line")] = False,
) -> None:
    """ESI-1 normalized waiting time and SLO attainment (by gold level) per policy as the
    scheduler's levels get noisier (simulation results)."""
    from triage.policies import POLICIES, make_policy
    from triage.sim.error_rate import error_rate_study, plot_error_rate
    from triage.sim.inputs import parse_mode
    from triage.sim.metrics import check_tpot_metric

    es = _floats(rates)
    if not es or any(not 0.0 <= e <= 1.0 for e in es):
        raise typer.BadParameter(f"--rates must be numbers in [0, 1], got {rates!r}")
    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise typer.BadParameter(f"unknown policies {unknown}; known: {', '.join(sorted(POLICIES))}")
    if rate_scale <= 0 or limit < 1:
        raise typer.BadParameter("--rate-scale must be > 0 and --limit >= 1")
    try:
        ln = parse_mode(lengths, "--lengths")
        check_tpot_metric(tpot_metric)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if ln.kind == "predicted":
        raise typer.BadParameter("--lengths predicted is not part of this study; use oracle or noisy:E")
    triage_params = _parse_params(param)
    try:
        make_policy("triage", **triage_params)
    except (TypeError, ValueError) as e:
        raise typer.BadParameter(f"bad triage parameter: {e}", param_hint="--param") from None
    truth = parse_truth(truth)
    pool = None
    if predicted_texts and predicted_texts.lower() != "none":
        from serving.cli.sim_inputs import text_pool

        pool, _, _ = text_pool(predicted_texts, predict=True, progress=lambda m: typer.echo(m, err=True))
    total = len(es) * len(names) + (len(names) if pool is not None else 0)
    with progress_bar("bench error-rate", total=total) as advance:
        out = _run_sim(lambda: error_rate_study(trace, es, policies=names, rate_scale=rate_scale, limit=limit, seed=seed,
                                                profile=profile or None, predicted_pool=pool, lengths=str(ln),
                                                tpot_metric=tpot_metric, truth=truth,
                                                params={"triage": triage_params} if triage_params else None,
                                                progress=advance))
    out["simulated"] = True
    if plot:
        plot_error_rate(out, plot)
        out["plot"] = str(plot)
    if as_json:
        typer.echo(json.dumps(out))
        return
    for r in out["rows"]:
        w = r["esi1_norm_wait"]
        a = r["esi1_slo_attainment"]
        typer.echo(f"{r['levels']:>12} E={r['rate']:<6} {r['policy']:>17}  ESI-1 norm. wait "
                   f"{'-' if w is None else f'{w:.4f}'} s/tok  ESI-1 SLO {'-' if a is None else f'{a:.3f}'}  "
                   f"TDG {r['tdg_ratio']:.4f}")
    if plot:
        typer.echo(f"plot: {plot}")
