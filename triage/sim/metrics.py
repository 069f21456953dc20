"""Per-class latency report of a finished run: SLO attainment, TDG ratio, TTFT, TPOT.

`norm_wait_mean` is seed 004's normalized waiting time: end-to-end latency divided by
the number of output tokens (seconds per token), averaged over the class.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import numpy as np

from triage.classes import PriorityClasses
from triage.gain import request_gain
from triage.request import Request


def _pct(a: list[float], q: float) -> float | None:
    return float(np.percentile(a, q)) if a else None


def summarize(requests: Iterable[Request], classes: PriorityClasses, policy: str = "") -> dict:
    by: dict[int, list] = defaultdict(list)
    tot_gain = tot_ideal = 0.0
    met = n = 0
    for r in requests:
        g = request_gain(r, classes)
        by[r.level].append((r, g))
        tot_gain += g.gain
        tot_ideal += g.ideal
        met += g.slo_met
        n += 1
    per_class = {}
    for level in sorted(by):
        rows = by[level]
        ttft = [r.ttft for r, _ in rows if r.ttft is not None]
        max_tpot = [max(r.tpots) for r, _ in rows if len(r.token_times) > 1]
        waits = [(r.token_times[-1] - r.arrival) / len(r.token_times) for r, _ in rows if r.token_times]
        ideal = sum(g.ideal for _, g in rows)
        per_class[str(level)] = {
            "requests": len(rows),
            "slo_attainment": sum(g.slo_met for _, g in rows) / len(rows),
            "tdg_ratio": sum(g.gain for _, g in rows) / ideal if ideal else None,
            "ttft_p50": _pct(ttft, 50),
            "ttft_p99": _pct(ttft, 99),
            "tpot_p99": _pct(max_tpot, 99),
            "norm_wait_mean": float(np.mean(waits)) if waits else None,
            "preemptions": sum(r.preemptions for r, _ in rows),
        }
    return {
        "policy": policy,
        "requests": n,
        "tdg_ratio": tot_gain / tot_ideal if tot_ideal else None,
        "slo_attainment": met / n if n else None,
        "per_class": per_class,
    }
