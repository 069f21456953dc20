"""Token-level Deadline-aware Gain (TDG, seed 000 Eq. 3) and SLO attainment.

    f(r) = Σ_i w_r(i) · 1[t_i < deadline_i],   deadline_i = arrival + TTFT_slo + (i-1)·TPOT_slo
    TDG ratio = Σ_r f(r) / Σ_r ideal(r),        ideal(r) = Σ_i w_r(i) over the request's tokens

`slo_met` here is the service's audit rule: TTFT < TTFT_slo and the largest gap between
two tokens < TPOT_slo. That is stricter than the papers: seed 000 §5.1 counts a request
when its TTFT and its (mean) TPOT are both strictly below the SLOs, and seed 002 §5.1
reports the largest running TPOT (§2.2). The simulator's reports choose among the three
(`triage.sim.metrics`, `--tpot-metric mean|running|max-gap`, mean by default).
Unfinished or never-started requests count with the tokens they were due (their output
length), so dropping a request never raises the ratio.
"""
from __future__ import annotations

from dataclasses import dataclass

from triage.classes import PriorityClasses
from triage.request import Request


@dataclass(frozen=True, slots=True)
class RequestGain:
    gain: float
    ideal: float
    slo_met: bool


def request_gain(r: Request, classes: PriorityClasses) -> RequestGain:
    n_due = max(r.output_len or 0, len(r.token_times), 1)
    w = classes.get(r.level).weight
    ideal = w * (classes.w_first + classes.w_decode * (n_due - 1))
    gain = 0.0
    base = r.arrival + r.ttft_slo
    for i, t in enumerate(r.token_times):
        if t < base + i * r.tpot_slo:
            gain += w * (classes.w_first if i == 0 else classes.w_decode)
    return RequestGain(gain, ideal, slo_met(r, n_due))


def slo_met(r: Request, n_due: int | None = None) -> bool:
    n_due = n_due or max(r.output_len or 0, 1)
    if len(r.token_times) < n_due or r.ttft is None or r.ttft >= r.ttft_slo:
        return False
    tp = r.tpots
    return not tp or max(tp) < r.tpot_slo
