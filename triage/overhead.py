"""Time one `plan()` call at a constructed queue state (`triage bench overhead`).

State: `running` requests mid-decode (prompts 200-500 tokens, 1-100 tokens generated,
KV allocated) and `waiting` fresh arrivals of mixed levels (prompts 300-700 tokens), on a profile large enough to
hold them (A100 / Qwen1.5-7B by default: 120k tokens of KV).
"""
from __future__ import annotations

import time

import numpy as np

from triage.classes import load_classes
from triage.kv import CacheCosts, KVCache
from triage.policies import make_policy
from triage.profiles import load_profile
from triage.request import KVResidency, Request, Stage
from triage.state import EngineState

OVERHEAD_PROFILE = "a100-qwen1.5-7b"


def build_state(waiting: int, running: int, *, profile: str | None = None, seed: int = 0) -> tuple[EngineState, float]:
    prof = load_profile(profile or OVERHEAD_PROFILE)
    classes = load_classes().scaled(prof.slo_scale)
    est = prof.estimator()
    state = EngineState(KVCache(prof.num_blocks, prof.block_size), est, classes, prof.limits,
                        CacheCosts.from_estimator(est, prof.kv_load_per_token))
    rng = np.random.default_rng(seed)
    now = 100.0
    levels = rng.choice([1, 2, 3, 4, 5], size=waiting + running, p=[0.02, 0.17, 0.38, 0.36, 0.07])
    for i in range(running):
        c = classes.get(int(levels[i]))
        gen = int(rng.integers(1, 100))
        r = Request(id=f"run{i}", arrival=now - gen * 0.05 - 1, prompt_len=int(rng.integers(200, 500)),
                    predicted_level=int(levels[i]), ttft_slo=c.ttft, tpot_slo=c.tpot,
                    predicted_output_len=gen + int(rng.integers(1, 300)), seq=i)
        state.add(r)
        state.admit(r, now - gen * 0.05)
        r.generated = gen
        r.computed = r.known - 1
        r.token_times = list(np.linspace(r.arrival + 0.5, now - 0.01, gen))
        r.stage, r.kv = Stage.DECODING, KVResidency.DEVICE
        state.allocate(r, 1)
        state.touch(r)
    for j in range(waiting):
        i = running + j
        c = classes.get(int(levels[i]))
        state.add(Request(id=f"wait{j}", arrival=now - float(rng.uniform(0, 5)), prompt_len=int(rng.integers(300, 700)),
                          predicted_level=int(levels[i]), ttft_slo=c.ttft, tpot_slo=c.tpot,
                          predicted_output_len=int(rng.integers(16, 512)), seq=i))
    return state, now


def time_plan(policy: str, *, waiting: int = 1000, running: int = 256, repeats: int = 300,
              profile: str | None = None, seed: int = 0, **params) -> dict:
    state, now = build_state(waiting, running, profile=profile, seed=seed)
    pol = make_policy(policy, **params)
    for _ in range(10):
        pol.plan(state, now)
    wall, cpu = np.empty(repeats), np.empty(repeats)
    for k in range(repeats):
        t0, c0 = time.perf_counter(), time.thread_time()
        pol.plan(state, now)
        wall[k], cpu[k] = time.perf_counter() - t0, time.thread_time() - c0
    w, c = wall * 1e6, cpu * 1e6
    # wall clock is what the engine waits; thread CPU time is what the plan costs when
    # other processes share the cores (the two agree on an idle machine)
    return {"name": policy, "waiting": waiting, "running": running, "repeats": repeats,
            "p50_us": float(np.percentile(w, 50)), "p99_us": float(np.percentile(w, 99)),
            "cpu_p50_us": float(np.percentile(c, 50)), "cpu_p99_us": float(np.percentile(c, 99))}
