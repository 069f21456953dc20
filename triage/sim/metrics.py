"""Per-class latency report of a finished run: SLO attainment, TDG ratio, TTFT, TPOT.

Always grouped by *gold* level (pass `gold`, request id → level; without it the level
the scheduler saw, which is gold under oracle inputs), and judged against the gold
level's SLOs and weight: a request the classifier under-triaged is late by its true
class's clock, whatever the scheduler believed.

TPOT, three definitions (`tpot_metric`):

    mean      (t_n − t_1) / (n − 1): the request's mean time per output token, the
              metric of seed 000 §5.1 (SLO met when TTFT and TPOT are both strictly
              below their SLOs) and of seed 002 §2.2's TPOT; the default.
    running   max_j (t_j − t_1) / (j − 1): seed 002 §5.1 reports the largest running
              TPOT_{i,j} (§2.2's per-token TPOT) "to show its worst-case rate".
    max-gap   max_j (t_j − t_{j−1}): the largest time between tokens (TBT), the
              strictest; for ESI-1/2 it is reported beside the chosen metric
              (`slo_attainment_max_gap`), a stalled answer to an emergency matters.

`norm_wait_mean` is seed 004's normalized waiting time (§4.1, "the average waiting time
per generated token"): end-to-end latency divided by the number of output tokens,
averaged over the class. TDG (seed 000 Eq. 3) uses the envelope deadlines, independent
of the TPOT metric.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Iterable, Mapping

import numpy as np

from triage.classes import PriorityClasses
from triage.gain import request_gain
from triage.request import Request

TPOT_METRICS = ("mean", "running", "max-gap")
MAX_GAP_BESIDE = (1, 2)      # levels whose max-gap attainment is reported beside the chosen metric


def check_tpot_metric(metric: str) -> str:
    if metric not in TPOT_METRICS:
        raise ValueError(f"unknown --tpot-metric {metric!r}; use one of {', '.join(TPOT_METRICS)}")
    return metric


def tpot_value(times: list[float], metric: str = "mean") -> float | None:
    """The request's TPOT under `metric` (None with fewer than two tokens)."""
    n = len(times)
    if n < 2:
        return None
    if metric == "mean":
        return (times[-1] - times[0]) / (n - 1)
    t = np.asarray(times)
    if metric == "max-gap":
        return float(np.max(np.diff(t)))
    if metric == "running":
        return float(np.max((t[1:] - t[0]) / np.arange(1, n)))
    raise ValueError(f"unknown TPOT metric {metric!r}")


def slo_met(r: Request, metric: str = "mean") -> bool:
    """TTFT and TPOT (under `metric`) strictly below the request's SLOs, every due token out."""
    n_due = max(r.output_len or 0, 1)
    if len(r.token_times) < n_due or r.ttft is None or r.ttft >= r.ttft_slo:
        return False
    v = tpot_value(r.token_times, metric)
    return v is None or v < r.tpot_slo


def as_gold(r: Request, level: int, classes: PriorityClasses) -> Request:
    """A copy of r judged as its gold level: that class's SLOs and weight."""
    if r.level == level and r.override_level is None:
        c = classes.get(level)
        if (r.ttft_slo, r.tpot_slo, r.weight) == (c.ttft, c.tpot, c.weight):
            return r
    c = classes.get(level)
    return replace(r, predicted_level=level, override_level=None, ttft_slo=c.ttft, tpot_slo=c.tpot, weight=c.weight)


def _pct(a: list[float], q: float) -> float | None:
    return float(np.percentile(a, q)) if a else None


def summarize(requests: Iterable[Request], classes: PriorityClasses, policy: str = "", *,
              gold: Mapping[str, int] | None = None, tpot_metric: str = "mean") -> dict:
    check_tpot_metric(tpot_metric)
    by: dict[int, list] = defaultdict(list)
    tot_gain = tot_ideal = 0.0
    met = n = 0
    for r in requests:
        lv = gold.get(r.id, r.level) if gold is not None else r.level
        q = as_gold(r, lv, classes)
        g = request_gain(q, classes)
        ok = slo_met(q, tpot_metric)
        by[lv].append((q, g, ok, r.level))
        tot_gain += g.gain
        tot_ideal += g.ideal
        met += ok
        n += 1
    per_class = {}
    for level in sorted(by):
        rows = by[level]
        ttft = [r.ttft for r, *_ in rows if r.ttft is not None]
        tpot = [v for v in (tpot_value(r.token_times, tpot_metric) for r, *_ in rows) if v is not None]
        gaps = [v for v in (tpot_value(r.token_times, "max-gap") for r, *_ in rows) if v is not None]
        waits = [(r.token_times[-1] - r.arrival) / len(r.token_times) for r, *_ in rows if r.token_times]
        ideal = sum(g.ideal for _, g, *_ in rows)
        c = {
            "requests": len(rows),
            "slo_attainment": sum(ok for _, _, ok, _ in rows) / len(rows),
            "tdg_ratio": sum(g.gain for _, g, _, _ in rows) / ideal if ideal else None,
            "ttft_p50": _pct(ttft, 50),
            "ttft_p99": _pct(ttft, 99),
            "tpot_p99": _pct(tpot, 99),
            "max_gap_p99": _pct(gaps, 99),
            "norm_wait_mean": float(np.mean(waits)) if waits else None,
            "preemptions": sum(r.preemptions for r, *_ in rows),
            "seen_other_level": sum(seen != level for *_, seen in rows),
        }
        if level in MAX_GAP_BESIDE and tpot_metric != "max-gap":
            c["slo_attainment_max_gap"] = sum(slo_met(r, "max-gap") for r, *_ in rows) / len(rows)
        per_class[str(level)] = c
    return {
        "policy": policy,
        "requests": n,
        "tpot_metric": tpot_metric,
        "tdg_ratio": tot_gain / tot_ideal if tot_ideal else None,
        "slo_attainment": met / n if n else None,
        "per_class": per_class,
    }


def _ms(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else round(1000.0 * x, 1)


def serve_report(requests: list[Request], classes: PriorityClasses, origin: Mapping, wall_s: float,
                 tpot_metric: str = "mean") -> dict:
    """A simulated run in the JSON shape of `triage bench serve` (per system): per gold
    level n, completed, SLO attainment, first-token p50/p99/max, mean TPOT, max-gap p99
    (milliseconds), tokens/s over the run's wall time, TDG ratio, ESI-1 caught by the
    classifier (gold 1 seen at 1). Arrival = the call's send time."""
    check_tpot_metric(tpot_metric)

    def group(rows: list[tuple[Request, bool]]) -> dict:
        ttft = [r.ttft for r, _ in rows if r.ttft is not None]
        tp = [v for v in (tpot_value(r.token_times, "mean") for r, _ in rows) if v is not None]
        gaps = [v for v in (tpot_value(r.token_times, "max-gap") for r, _ in rows) if v is not None]
        return {"n": len(rows), "completed": sum(r.finished for r, _ in rows),
                "slo_attainment": round(sum(ok for _, ok in rows) / len(rows), 4) if rows else None,
                "ttft_p50_ms": _ms(_pct(ttft, 50)), "ttft_p99_ms": _ms(_pct(ttft, 99)),
                "ttft_max_ms": _ms(max(ttft, default=None)),
                "tpot_mean_ms": _ms(float(np.mean(tp)) if tp else None), "max_gap_p99_ms": _ms(_pct(gaps, 99))}

    judged = []
    gain = ideal = 0.0
    for r in requests:
        t = origin[r.id]
        q = as_gold(r, t.level, classes)
        g = request_gain(q, classes)
        gain, ideal = gain + g.gain, ideal + g.ideal
        judged.append((q, slo_met(q, tpot_metric), t, r.level))
    levels = sorted({t.level for _, _, t, _ in judged})
    caught = [(q, ok) for q, ok, t, seen in judged if t.level == 1 and seen == 1]
    cg = group(caught)
    done = [q for q, _, _, _ in judged if q.finished]
    return {
        "completed": len(done), "errors": 0, "wall_s": round(wall_s, 2), "reps": 1,
        "tokens_per_s": round(sum(q.generated for q in done) / wall_s, 1) if wall_s > 0 else None,
        "goodput_rps": round(sum(ok for _, ok, _, _ in judged) / wall_s, 3) if wall_s > 0 else None,
        "tdg_ratio": round(gain / ideal, 4) if ideal else 0.0,
        "per_level": {str(lv): group([(q, ok) for q, ok, t, _ in judged if t.level == lv]) for lv in levels},
        "chat": group([(q, ok) for q, ok, t, _ in judged if t.kind == "chat"]),
        "esi1_caught": {"n": cg["n"], "ttft_p50_ms": cg["ttft_p50_ms"], "ttft_p99_ms": cg["ttft_p99_ms"],
                        "ttft_max_ms": cg["ttft_max_ms"]},
        "tpot_metric": tpot_metric,
    }
