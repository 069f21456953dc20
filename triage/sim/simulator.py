"""One engine instance, simulated step by step with the live policy objects.

    while work remains:
        admit arrivals up to now
        plan = policy.plan(state, now)            # the very object the engine uses
        now  = execute(plan, now)                 # latency model × noise, emits tokens

The true step time comes from the profile's latency model with multiplicative lognormal
noise (seeded); the policy sees a separate estimator that learns β online from it, as
the live engine's does. Deterministic for a seed.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from triage.classes import PriorityClasses
from triage.estimators import Work
from triage.kv import CacheCosts, KVCache
from triage.policies.base import Policy
from triage.profiles import Profile
from triage.request import Request, Stage
from triage.sim.traces import TraceRequest
from triage.state import EngineState


WAITING_STAGES = (Stage.WAITING, Stage.PREEMPTED)


class StalledError(RuntimeError):
    """The policy returned an empty plan while requests were waiting and nothing could arrive."""


@dataclass
class SimResult:
    requests: list[Request]
    steps: int
    sim_time: float
    step_overheads_s: list[float] = field(default_factory=list)


def make_request(i: int, t: TraceRequest, classes: PriorityClasses, predicted_output: int | None = None) -> Request:
    c = classes.get(t.level)
    return Request(
        id=f"r{i}", arrival=t.arrival, prompt_len=t.prompt_len, predicted_level=t.level,
        ttft_slo=c.ttft, tpot_slo=c.tpot, weight=c.weight,
        predicted_output_len=predicted_output if predicted_output is not None else t.output_len,
        output_len=t.output_len, seq=i,
    )


class Instance:
    """An engine instance: its state, its policy, its clock."""

    def __init__(self, policy: Policy, profile: Profile, classes: PriorityClasses, rng: np.random.Generator,
                 index: int = 0, estimator_kind: str = "proserve") -> None:
        est = profile.estimator(estimator_kind)
        truth = profile.estimator("proserve")
        self.policy = policy
        self.truth = truth
        self.noise_cv = profile.noise_cv
        self.rng = rng
        self.index = index
        costs = CacheCosts.from_estimator(truth, profile.kv_load_per_token) if hasattr(truth, "a_p") else None
        self.state = EngineState(KVCache(profile.num_blocks, profile.block_size), est, classes, profile.limits, costs)
        self.now = 0.0
        self.steps = 0
        self.done: list[Request] = []

    def _noise(self) -> float:
        if self.noise_cv <= 0:
            return 1.0
        s = math.sqrt(math.log1p(self.noise_cv ** 2))
        return float(self.rng.lognormal(-s * s / 2, s))

    def step(self, plan) -> None:
        """Execute one plan: preemptions, admissions, allocation, then the step's tokens."""
        st = self.state
        for p in plan.preemptions:
            st.preempt(p.request_id, p.keep_tokens)
        reload = 0.0
        works: list[Work] = []
        scheduled: list[tuple[Request, int]] = []
        for rid, k in plan.tokens.items():
            r = st.requests[rid]
            if r.stage in WAITING_STAGES:
                reload += st.admit(r, self.now)
            st.allocate(r, k)
            works.append(Work(k, r.computed))
            scheduled.append((r, k))
        base = self.truth._batch_time(works)
        real = base * self._noise() + reload
        st.estimator.observe(st.estimator.uncorrected_batch_time(works), real - reload)
        self.now += real
        self.steps += 1
        for r, k in scheduled:
            if st.advance(r, k, self.now) and r.generated >= r.output_len:
                st.finish(r, self.now)
                self.done.append(r)


def simulate(trace: Iterable[TraceRequest], policy: Policy, profile: Profile, classes: PriorityClasses, *,
             seed: int = 0, estimator_kind: str = "proserve", predicted_output: Callable[[TraceRequest], int] | None = None,
             progress: Callable[[int], None] | None = None, time_overhead: bool = False) -> SimResult:
    """Replay `trace` through one instance; returns every request with its token times."""
    import time

    inst = Instance(policy, profile, classes, np.random.default_rng(seed), estimator_kind=estimator_kind)
    st = inst.state
    pending = deque(sorted(trace, key=lambda t: t.arrival))
    total = len(pending)
    i = 0
    overheads: list[float] = []
    while pending or st.requests:
        while pending and pending[0].arrival <= inst.now:
            t = pending.popleft()
            st.add(make_request(i, t, classes, predicted_output(t) if predicted_output else None))
            i += 1
        if time_overhead:
            t0 = time.perf_counter()
            plan = policy.plan(st, inst.now)
            overheads.append(time.perf_counter() - t0)
        else:
            plan = policy.plan(st, inst.now)
        if not plan.tokens:
            if pending:
                inst.now = max(inst.now, pending[0].arrival)
                continue
            raise StalledError(f"{policy.name}: empty plan with {len(st.requests)} requests left at t={inst.now:.3f}")
        inst.step(plan)
        if progress and inst.done and len(inst.done) % 200 == 0:
            progress(len(inst.done))
    if progress:
        progress(total)
    return SimResult(sorted(inst.done, key=lambda r: r.seq), inst.steps, inst.now, overheads)
