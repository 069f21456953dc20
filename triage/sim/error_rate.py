"""The classifier error-rate study (seed 004 §4.1, Fig. 2a), in the simulator.

    for E in rates:                      # noisy:E levels (triage.sim.inputs: adjacent-level
        for policy in policies:          #   confusion, common draws across E)
            replay the same trace, the scheduler told noisy levels, the engine producing
            the true lengths → ESI-1 (gold) normalized waiting time, ESI-1 SLO
            attainment, TDG ratio, all judged by gold level
    optionally once more with `--levels predicted` (our classifier on a labelled pool):
            its row's `rate` is the classifier's measured error rate on the texts used
            (1 − accuracy), so it sits on the same axis as the noisy curve.

Simulation results, not measurements of a live engine.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from triage.sim.bench import _setup, run_one
from triage.sim.inputs import TextPool

STUDY_POLICIES = ("triage", "semantic", "fcfs", "sarathi-priority")


def _row(r: dict, policy: str, rate: float, levels: str) -> dict:
    one = r["per_class"].get("1") or {}
    out = {"policy": policy, "rate": round(rate, 4), "levels": levels,
           "esi1_norm_wait": one.get("norm_wait_mean"), "esi1_slo_attainment": one.get("slo_attainment"),
           "esi1_ttft_p99": one.get("ttft_p99"), "esi1_n": one.get("requests"),
           "tdg_ratio": r["tdg_ratio"], "slo_attainment": r["slo_attainment"]}
    if "classifier" in r:
        out["classifier"] = r["classifier"]
    return out


def error_rate_study(trace_path: str | Path, rates: Sequence[float], *, policies: Sequence[str] = STUDY_POLICIES,
                     rate_scale: float = 0.1, limit: int | None = 4000, seed: int = 0, profile: str | None = None,
                     predicted_pool: TextPool | None = None, lengths: str = "oracle", tpot_metric: str = "mean",
                     truth: str = "auto", params: dict[str, dict] | None = None,
                     progress: Callable[[int], None] | None = None) -> dict:
    """`params`: policy name -> parameters that override the profile's (e.g. triage's
    protected_pace); recorded in the output."""
    bad = [e for e in rates if not 0.0 <= float(e) <= 1.0]
    if bad or not rates:
        raise ValueError(f"error rates must lie in [0, 1], got {list(rates)}")
    prof, classes = _setup(profile)
    params = params or {}
    rows: list[dict] = []
    common = dict(limit=limit, seed=seed, prof=prof, classes=classes, lengths=lengths, tpot_metric=tpot_metric,
                  truth=truth)
    for e in rates:
        for p in policies:
            r = run_one(trace_path, p, rate_scale, levels=f"noisy:{float(e)}", params=params.get(p), **common)
            rows.append(_row(r, p, float(e), f"noisy:{float(e):g}"))
            if progress:
                progress(len(rows))
    if predicted_pool is not None:
        for p in policies:
            r = run_one(trace_path, p, rate_scale, levels="predicted", pool=predicted_pool, params=params.get(p), **common)
            acc = (r.get("classifier") or {}).get("accuracy")
            rows.append(_row(r, p, 1.0 - acc if acc is not None else float("nan"), "predicted"))
            rows[-1]["texts"] = predicted_pool.name
            if progress:
                progress(len(rows))
    return {"trace": str(trace_path), "profile": prof.name, "rate_scale": rate_scale, "limit": limit, "seed": seed,
            "tpot_metric": tpot_metric, "lengths": lengths, "params": params, "rows": rows}


def plot_error_rate(out: dict, path: str | Path) -> Path:
    """PNG: ESI-1 normalized waiting time (left) and ESI-1 SLO attainment (right) against
    the error rate, one line per policy; the predicted-levels runs as stars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from triage.sim.figure import save_figure

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    noisy = [r for r in out["rows"] if r["levels"] != "predicted"]
    pred = [r for r in out["rows"] if r["levels"] == "predicted"]
    colors = {}
    for p in dict.fromkeys(r["policy"] for r in out["rows"]):
        pts = sorted((r["rate"], r["esi1_norm_wait"], r["esi1_slo_attainment"]) for r in noisy if r["policy"] == p)
        style = dict(marker="o", label=p, linewidth=3 if p == "triage" else 1.5)
        if p == "triage":
            style["color"] = "black"
        (line,) = ax1.plot([x for x, _, _ in pts], [y if y is not None else float("nan") for _, y, _ in pts], **style)
        ax2.plot([x for x, _, _ in pts], [z if z is not None else float("nan") for _, _, z in pts], **style)
        colors[p] = line.get_color()
    for r in pred:
        kw = dict(marker="*", s=220, color=colors.get(r["policy"]), edgecolor="white", zorder=5)
        ax1.scatter([r["rate"]], [r["esi1_norm_wait"]], **kw)
        ax2.scatter([r["rate"]], [r["esi1_slo_attainment"]], **kw)
    if pred:
        ax1.scatter([], [], marker="*", s=120, color="grey", label=f"predicted levels ({pred[0].get('texts')})")
    ax1.set(xlabel="level error rate E", ylabel="s per output token", title="ESI-1 normalized waiting time (gold)")
    ax2.set(xlabel="level error rate E", ylabel="SLO attainment", title="ESI-1 SLO attainment (gold)")
    ax2.set_ylim(0, 1.02)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle(f"simulation: {Path(out['trace']).name}, {out['limit']} requests, rate scale {out['rate_scale']}, "
                 f"profile {out['profile']}", fontsize=9)
    return save_figure(fig, path)
