"""One engine instance, simulated step by step with the live policy objects.

    while work remains:
        admit arrivals up to now
        plan = policy.plan(state, now)            # the very object the engine uses
        now  = execute(plan, now)                 # the step's true time, emits tokens

The true step time comes from `triage.sim.truth` (the measured engine's residuals when
the profile has recorded steps, else the profile's model × lognormal noise); the policy
sees the fitted estimator, which learns β online from the true times, as the live
engine's does. The estimator's error before and after that correction is kept
(`SimResult.estimator`). The scheduler is told each request's `scheduler_level` and
`scheduler_output` (oracle, predicted or noisy: `triage.sim.inputs`); the engine
produces the true `output_len`. Deterministic for a seed.
"""
from __future__ import annotations

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
from triage.sim.truth import MeasuredSteps, StepTruth, truth_for
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
    origin: dict[str, TraceRequest] = field(default_factory=dict)   # request id -> its trace row (gold level, kind)
    estimator: dict = field(default_factory=dict)                   # MAPE before/after online correction, truth
    rejected: list[Request] = field(default_factory=list)           # turned away by admission control (never served)

    @property
    def gold(self) -> dict[str, int]:
        return {rid: t.level for rid, t in self.origin.items()}


def make_request(i: int, t: TraceRequest, classes: PriorityClasses, predicted_output: int | None = None) -> Request:
    """The request the scheduler gets: the level and length it is told (its SLOs are its
    told level's, as in production), the true output length the engine will produce."""
    level = t.scheduler_level
    c = classes.get(level)
    return Request(
        id=f"r{i}", arrival=t.arrival, prompt_len=t.prompt_len, predicted_level=level,
        ttft_slo=c.ttft, tpot_slo=c.tpot, weight=c.weight,
        predicted_output_len=predicted_output if predicted_output is not None else t.scheduler_output,
        output_len=t.output_len, seq=i,
    )


def with_limits(profile: Profile, *, max_num_seqs: int | None = None,
                max_num_batched_tokens: int | None = None) -> Profile:
    """The profile with other engine sizes (same name: its measured steps still apply)."""
    if max_num_seqs is None and max_num_batched_tokens is None:
        return profile
    lim = dict(profile.raw.get("limits", {}))
    for k, v in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
        if v is not None:
            if v < 1:
                raise ValueError(f"{k} must be >= 1")
            lim[k] = int(v)
    return Profile(profile.name, {**profile.raw, "limits": lim})


class EstimatorError:
    """Absolute percentage error of the scheduler's step predictions against the truth,
    without (fitted model alone) and with the online correction (β, and the prefill share ρ
    where the estimator learns it) it had when it planned the step."""

    __slots__ = ("n", "raw", "corrected", "beta", "rho")

    def __init__(self) -> None:
        self.n = 0
        self.raw = 0.0
        self.corrected = 0.0
        self.beta = 1.0
        self.rho = 1.0

    def add(self, uncorrected: float, corrected: float, real: float) -> None:
        if real > 0:
            self.n += 1
            self.raw += abs(uncorrected - real) / real
            self.corrected += abs(corrected - real) / real

    def merge(self, other: "EstimatorError") -> None:
        self.n += other.n
        self.raw += other.raw
        self.corrected += other.corrected

    def report(self, truth: dict | None = None) -> dict:
        out = {"steps": self.n,
               "mape_uncorrected": round(self.raw / self.n, 4) if self.n else None,
               "mape_corrected": round(self.corrected / self.n, 4) if self.n else None,
               "beta_final": round(self.beta, 4), "rho_final": round(self.rho, 4)}
        if truth is not None:
            out["truth"] = truth
        return out


class Instance:
    """An engine instance: its state, its policy, its clock."""

    def __init__(self, policy: Policy, profile: Profile, classes: PriorityClasses, rng: np.random.Generator,
                 index: int = 0, estimator_kind: str = "proserve", truth: str | MeasuredSteps | StepTruth = "auto",
                 bias: float = 1.0) -> None:
        est = profile.estimator(estimator_kind)
        self.truth = truth if isinstance(truth, StepTruth) else truth_for(profile, rng, truth, bias)
        self.policy = policy
        self.rng = rng
        self.index = index
        fitted = self.truth.fitted
        costs = CacheCosts.from_estimator(fitted, profile.kv_load_per_token) if hasattr(fitted, "a_p") else None
        est.learn_shape = True   # as the live engine's scheduler (serving.vllm_scheduler): β and ρ online
        self.state = EngineState(KVCache(profile.num_blocks, profile.block_size), est, classes, profile.limits, costs)
        self.now = 0.0
        self.steps = 0
        self.done: list[Request] = []
        self.error = EstimatorError()

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
        step = self.truth.time(works)
        real = step + reload
        est = st.estimator
        planned = est.observe_batch(works, step)   # the prediction it planned with (β and ρ before this step)
        self.error.add(sum(est.split(works)), planned, step)
        self.error.beta, self.error.rho = est.beta, est.rho
        self.now += real
        self.steps += 1
        for r, k in scheduled:
            if st.advance(r, k, self.now) and r.generated >= r.output_len:
                st.finish(r, self.now)
                self.done.append(r)


def simulate(trace: Iterable[TraceRequest], policy: Policy, profile: Profile, classes: PriorityClasses, *,
             seed: int = 0, estimator_kind: str = "proserve", predicted_output: Callable[[TraceRequest], int] | None = None,
             progress: Callable[[int], None] | None = None, time_overhead: bool = False,
             truth: str | MeasuredSteps | StepTruth = "auto", bias: float = 1.0) -> SimResult:
    """Replay `trace` through one instance; returns every request with its token times.
    `truth`: "auto" | "model" | "measured", a MeasuredSteps or a StepTruth (see triage.sim.truth)."""
    import time

    inst = Instance(policy, profile, classes, np.random.default_rng(seed), estimator_kind=estimator_kind,
                    truth=truth, bias=bias)
    st = inst.state
    pending = deque(sorted(trace, key=lambda t: t.arrival))
    total = len(pending)
    i = 0
    origin: dict[str, TraceRequest] = {}
    overheads: list[float] = []
    while pending or st.requests:
        while pending and pending[0].arrival <= inst.now:
            t = pending.popleft()
            r = make_request(i, t, classes, predicted_output(t) if predicted_output else None)
            origin[r.id] = t
            st.add(r)
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
    return SimResult(sorted(inst.done, key=lambda r: r.seq), inst.steps, inst.now, overheads, origin,
                     inst.error.report(inst.truth.describe()))
