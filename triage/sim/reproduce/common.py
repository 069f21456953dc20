"""What every seed reproduction shares: one simulated run, the row format, class tables.

A reproduction replays the paper's experiment in the simulator (`triage.sim`: the live
policy and router objects against a latency profile) as closely as our traces and
profiles allow. Every figure it prints is a simulation result.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from triage.classes import PriorityClass, PriorityClasses
from triage.paths import shared_datasets_dir
from triage.profiles import Profile, load_profile
from triage.sim.cluster import simulate_cluster
from triage.sim.metrics import summarize
from triage.sim.simulator import with_limits
from triage.sim.traces import TraceRequest

DATASETS = shared_datasets_dir()
AZURE_CONV = DATASETS / "azure_llm_2023_conv.csv.gz"


def row(metric: str, paper, ours, setup: str) -> dict:
    """One line of the paper-vs-ours table."""
    return {"metric": metric, "paper": paper, "ours": ours, "setup": setup}


def uniform_classes(ttft: float, tpot: float, weights: Sequence[float] = (1.0,) * 5, *,
                    w_first: float = 4.0, w_decode: float = 1.0) -> PriorityClasses:
    """Levels 1..len(weights), every one with the same SLOs (a paper without priorities,
    or with priorities that only weigh the gain)."""
    return PriorityClasses({lv: PriorityClass(lv, f"p{lv}", float(w), ttft, tpot) for lv, w in enumerate(weights, 1)},
                           w_first=w_first, w_decode=w_decode)


@dataclass
class System:
    """A policy (with parameters) behind a router, on a profile with given limits."""
    label: str
    policy: str
    params: dict = field(default_factory=dict)
    router: str = "round_robin"
    router_params: dict = field(default_factory=dict)
    max_num_batched_tokens: int | None = None


def profile_for(name: str, system: System) -> Profile:
    prof = load_profile(name)
    return with_limits(prof, max_num_batched_tokens=system.max_num_batched_tokens)


def run(trace: list[TraceRequest], system: System, profile: str, classes: PriorityClasses, *, instances: int = 1,
        seed: int = 0, tpot_metric: str = "mean") -> dict:
    """One simulated run → summary (per gold level) plus the rejected count and span."""
    prof = profile_for(profile, system)
    res = simulate_cluster(trace, lambda: prof.make_policy(system.policy, **system.params), prof, classes, instances=instances,
                           router=system.router, router_params=system.router_params or None, seed=seed)
    s = summarize(res.requests, classes, system.label, gold=res.gold, tpot_metric=tpot_metric)
    n_all = len(res.requests) + len(res.rejected)
    met = (s["slo_attainment"] or 0.0) * len(res.requests)
    span = max(t.arrival for t in trace) - min(t.arrival for t in trace) if len(trace) > 1 else 1.0
    s.update(rejected=len(res.rejected), offered=n_all, span_s=span,
             slo_attainment_all=met / n_all if n_all else None,       # rejected requests count as misses
             rps=n_all / span if span > 0 else None)
    s["effective_rps"] = s["rps"] * s["slo_attainment_all"] if s["rps"] else None
    s["requests_done"] = res.requests
    return s


def envelope_met(r, ttft: float, tpot: float) -> bool:
    """Every token j inside arrival + TTFT_slo + (j − 1)·TPOT_slo (the token-deadline
    envelope of seeds 000, 001 and 002)."""
    tt = r.token_times
    return bool(tt) and all(t <= r.arrival + ttft + j * tpot + 1e-9 for j, t in enumerate(tt))


def envelope_attainment(summary: dict, classes: PriorityClasses) -> float | None:
    """Share of the offered requests with every token inside its (gold) class's envelope
    (a rejected request counts as a miss)."""
    reqs = summary["requests_done"]
    n = len(reqs) + summary.get("rejected", 0)
    if not n:
        return None
    return sum(envelope_met(r, classes.get(r.level).ttft, classes.get(r.level).tpot) for r in reqs) / n


def strip(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "requests_done"}


Progress = Callable[[int], None] | None


def mixed_lengths_trace(parts: Sequence[tuple[str, int, int]], *, rate: float, seed: int = 0,
                        max_len: int | None = None) -> list[TraceRequest]:
    """Rows of several length tables (name, rows, level), shuffled together and replayed
    with Poisson arrivals at `rate` req/s (seed 001's mixed-v1 = ShareGPT:arXiv 3:1)."""
    import numpy as np

    from triage.sim.traces import lengths_trace

    rows: list[TraceRequest] = []
    for name, n, level in parts:
        rows += [TraceRequest(0.0, t.prompt_len, t.output_len, level)
                 for t in lengths_trace(name, rate=1.0, limit=n, seed=seed, max_len=max_len, datasets=DATASETS)]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(rows))
    t = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, size=len(rows) - 1))])
    return [TraceRequest(float(t[i]), rows[j].prompt_len, rows[j].output_len, rows[j].level)
            for i, j in enumerate(order.tolist())]


def ttft_attainment(summary: dict, classes: PriorityClasses) -> float | None:
    """Share of requests whose first token beat their (gold) class's TTFT SLO (seed 003's
    metric: FlowPrefill schedules prefills, so TTFT alone)."""
    reqs = summary["requests_done"]
    if not reqs:
        return None
    ok = sum(1 for r in reqs if r.ttft is not None and r.ttft < classes.get(r.level).ttft)
    return ok / (len(reqs) + summary.get("rejected", 0))


def largest_passing(points: list[tuple[float, float]], target: float) -> float:
    """Goodput from a sweep: the largest rate whose attainment is ≥ target, linearly
    interpolated towards the first failing rate above it (0.0 if the lowest fails)."""
    pts = sorted(points)
    best = 0.0
    for (x0, y0), (x1, y1) in zip(pts, pts[1:] + [(None, None)]):
        if y0 < target:
            break
        best = x0
        if x1 is not None and y1 < target:
            best = x0 + (x1 - x0) * (y0 - target) / (y0 - y1)
            break
    return best
