"""Policy benchmarks over a trace (`triage bench policies`, `triage bench goodput`).

    bench_policies: for each rate scale, replay the same trace (first `limit` requests,
                    levels drawn with `seed`) through every policy, one or several
                    instances behind a router → rows of TDG ratio and SLO attainment
    goodput:        the largest rate scale whose overall SLO attainment is ≥ target,
                    by bisection (attainment falls as the load rises)
    plot_policies:  TDG ratio and ESI-1 SLO attainment against load, one line per policy

Every run takes the scheduler's inputs (`levels`, `lengths`: oracle | predicted |
noisy:E, with a `TextPool` for predicted; triage.sim.inputs), the TPOT definition of
its SLO attainment (`tpot_metric`) and the step-time truth (`truth`); results are per
gold level. These are simulation results.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from triage.classes import load_classes
from triage.profiles import DEFAULT_PROFILE, load_profile
from triage.sim.cluster import simulate_cluster
from triage.sim.inputs import TextPool, apply_inputs
from triage.sim.metrics import summarize
from triage.sim.traces import resolve_trace


class NothingCompleted(RuntimeError):
    """A run in which no request finished: its figures would be meaningless."""


def _setup(profile: str | None):
    prof = load_profile(profile or DEFAULT_PROFILE)
    return prof, load_classes().scaled(prof.slo_scale)


def run_one(trace_path, policy: str, rate_scale: float, *, limit: int | None, seed: int, prof, classes,
            instances: int = 1, router: str = "round_robin", pd=None, levels: str = "oracle",
            lengths: str = "oracle", pool: TextPool | None = None, tpot_metric: str = "mean",
            truth: str = "auto", rate: float | None = None, params: dict | None = None) -> dict:
    """One simulation; `params` override the profile's parameters of `policy`."""
    trace = resolve_trace(trace_path, rate=rate, limit=limit, rate_scale=rate_scale, seed=seed,
                          max_len=prof.max_request_tokens)
    trace, info = apply_inputs(trace, levels=levels, lengths=lengths, pool=pool, seed=seed)
    res = simulate_cluster(trace, lambda: prof.make_policy(policy, **(params or {})), prof, classes, instances=instances,
                           router=router, pd=pd, seed=seed, truth=truth)
    if not res.requests:
        raise NothingCompleted(f"{policy} at rate scale {rate_scale}: no request completed")
    s = summarize(res.requests, classes, policy, gold=res.gold, tpot_metric=tpot_metric)
    row = {"policy": policy, "router": router, "rate_scale": rate_scale, "tdg_ratio": s["tdg_ratio"],
           "slo_attainment": s["slo_attainment"], "per_class": s["per_class"], "inputs": info}
    if info.get("classifier"):
        row["classifier"] = info["classifier"]
    return row


def bench_policies(trace_path: str | Path, policies: Sequence[str], rate_scales: Sequence[float], *,
                   limit: int | None = 4000, seed: int = 0, profile: str | None = None, instances: int = 1,
                   routers: Sequence[str] = ("round_robin",), pd=None,
                   progress: Callable[[int], None] | None = None, **inputs) -> dict:
    """Every policy behind every router at every rate scale; rows ordered by scale, then
    router, then the given policy order. `inputs`: levels, lengths, pool, tpot_metric,
    truth (see run_one)."""
    prof, classes = _setup(profile)
    rows = []
    for sc in rate_scales:
        for router in routers:
            for p in policies:
                rows.append(run_one(trace_path, p, float(sc), limit=limit, seed=seed, prof=prof, classes=classes,
                                    instances=instances, router=router, pd=pd, **inputs))
                if progress:
                    progress(len(rows))
    return {"rows": rows, "tpot_metric": inputs.get("tpot_metric", "mean"),
            "levels": str(inputs.get("levels", "oracle")), "lengths": str(inputs.get("lengths", "oracle"))}


def goodput(trace_path: str | Path, policy: str, target: float = 0.9, *, limit: int | None = 4000, seed: int = 0,
            profile: str | None = None, lo: float = 0.01, hi: float = 2.0, tol: float = 0.01,
            instances: int = 1, router: str = "round_robin", progress: Callable[[int], None] | None = None,
            **inputs) -> dict:
    """Largest rate scale in [lo, hi] with overall SLO attainment ≥ target (to within tol).
    0.0 when even `lo` misses the target; `hi` when `hi` still meets it."""
    prof, classes = _setup(profile)
    calls = 0

    def ok(sc: float) -> bool:
        nonlocal calls
        calls += 1
        row = run_one(trace_path, policy, sc, limit=limit, seed=seed, prof=prof, classes=classes,
                      instances=instances, router=router, **inputs)
        if progress:
            progress(calls)
        return (row["slo_attainment"] or 0.0) >= target

    tag = {"tpot_metric": inputs.get("tpot_metric", "mean"), "levels": str(inputs.get("levels", "oracle")),
           "lengths": str(inputs.get("lengths", "oracle"))}
    if not ok(lo):
        return {"policy": policy, "goodput_scale": 0.0, **tag}
    if ok(hi):
        return {"policy": policy, "goodput_scale": hi, **tag}
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return {"policy": policy, "goodput_scale": round(lo, 6), **tag}


def plot_policies(rows: list[dict], path: str | Path) -> Path:
    """PNG: TDG ratio (left) and ESI-1 SLO attainment (right) against rate scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from triage.sim.figure import save_figure

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = ["-", "--", "-.", ":"]
    several_routers = len({r.get("router") for r in rows}) > 1

    def label(r: dict) -> str:
        return f"{r['policy']}+{r['router']}" if several_routers else r["policy"]

    for k, p in enumerate(dict.fromkeys(label(r) for r in rows)):
        pts = sorted((r["rate_scale"], r["tdg_ratio"], (r["per_class"].get("1") or {}).get("slo_attainment"))
                     for r in rows if label(r) == p)
        xs = [x for x, _, _ in pts]
        # 13 policies outnumber the colour cycle: vary the line style too; the product is bold
        style = dict(marker="o", label=p, linestyle=styles[k // 10 % len(styles)] if p != "triage" else "-",
                     linewidth=3 if p == "triage" else 1.5, color="black" if p == "triage" else None)
        ax1.plot(xs, [y for _, y, _ in pts], **style)
        ax2.plot(xs, [z if z is not None else float("nan") for _, _, z in pts], **style)
    ax1.set(xlabel="rate scale (load)", ylabel="TDG ratio", title="Token-level deadline-aware gain")
    ax2.set(xlabel="rate scale (load)", ylabel="SLO attainment", title="ESI-1 SLO attainment")
    for ax in (ax1, ax2):
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    ax2.legend(fontsize=8, loc="lower left")
    return save_figure(fig, path)
