"""Our policy inside vLLM 0.32.0: a subclass of vLLM's V1 `Scheduler` that executes
the policy's `BatchPlan` exactly.

Load it with `scheduler_cls="serving.vllm_scheduler.TriageScheduler"` (EngineArgs or
`--scheduler-cls`); settings travel in `additional_config={"triage": {...}}`
(see `TriageSettings`). vLLM resolves the class inside the EngineCore process.

How a step runs (ENVIRONMENT.md's verified recipe: steer vLLM's own `schedule()`
through its hooks, never rebuild it):

    1. apply pending relabels / class edits (control channel, see `triage_control`);
    2. plan = policy.plan(mirror, now)            # the same object the simulator runs
    3. repair: replay the plan's allocations in vLLM's order (running first, then
       admissions) against vLLM's real free-block count; an admission that vLLM's
       full-sequence gate would refuse is dropped (counted in `plan_repairs`);
    4. our victims: pop from `running`, `_preempt_request` (frees blocks, recompute);
    5. `waiting` is swapped for a queue holding only the planned admissions in plan
       order (`kv_holding_waiting` for an empty one) and `_reserve_prefill_lookahead`
       caps every request at its planned tokens (0 = skip), then `super().schedule()`;
    6. compare the plan with `SchedulerOutput.num_scheduled_tokens` and the
       preempted ids; any difference is counted in `plan_mismatches`.

The mirror (`EngineState`) is kept in step with vLLM's requests in `add_request`,
`finish_requests` and `update_from_output`, and mirrors vLLM's block rules (blocks
of `ceil(computed / block_size)`, the full-prompt admission gate, the null block).

Private vLLM members this relies on (pinned to vLLM 0.32.0; checked by
`check_vllm_members()` and tests/engine/test_scheduler_plugin.py):
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request as VllmRequest
from vllm.v1.request import RequestStatus

from serving.engine_cpu import EngineCPU
from serving.instance.fields import request_fields
from serving.instance.load import load_snapshot
from triage.classes import ClassError, PriorityClasses, load_classes
from triage.estimators import Work
from triage.kv import CacheCosts, KVCache
from triage.plan import BatchPlan, Preemption
from triage.profiles import Limits, load_profile
from triage.request import Request, Stage
from triage.state import EngineState

log = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0"

# Every vLLM member that is not public API and that this module reads or calls.
PRIVATE_MEMBERS: dict[str, tuple[str, ...]] = {
    "Scheduler": (
        "_reserve_prefill_lookahead", "_preempt_request", "running", "waiting",
        "kv_holding_waiting", "requests", "max_num_scheduled_tokens", "max_num_active_reqs",
        "max_model_len", "block_size", "scheduler_reserve_full_isl", "kv_cache_manager",
        "connector",
    ),
    "KVCacheManager": ("block_pool", "get_computed_blocks"),
    "BlockPool": ("get_num_free_blocks",),
    "Request": ("request_id", "num_computed_tokens", "num_tokens", "num_prompt_tokens",
                "num_output_tokens", "status", "priority", "arrival_time", "max_tokens",
                "sampling_params", "skip_reading_prefix_cache"),
    "EngineCore": ("scheduler", "<utility dispatch by method name: triage_control>"),
}
__doc__ += "\n".join(f"    {k}: {', '.join(v)}" for k, v in PRIVATE_MEMBERS.items()) + "\n"

WAITING = (Stage.WAITING, Stage.PREEMPTED)
XARG = "triage"  # SamplingParams.extra_args["triage"] = {"level", "ttft_slo", "tpot_slo", ...}


def check_vllm_members(scheduler: Scheduler | None = None) -> list[str]:
    """Names of pinned members that this vLLM lacks (empty when all are present)."""
    import vllm

    missing = []
    if not vllm.__version__.startswith(VLLM_VERSION):
        missing.append(f"vllm version {vllm.__version__} != {VLLM_VERSION}")
    for name in ("_reserve_prefill_lookahead", "_preempt_request", "schedule", "update_from_output",
                 "add_request", "finish_requests"):
        if not hasattr(Scheduler, name):
            missing.append(f"Scheduler.{name}")
    if scheduler is not None:
        for name in PRIVATE_MEMBERS["Scheduler"]:
            if not hasattr(scheduler, name):
                missing.append(f"Scheduler.{name}")
        for name in PRIVATE_MEMBERS["KVCacheManager"]:
            if not hasattr(scheduler.kv_cache_manager, name):
                missing.append(f"KVCacheManager.{name}")
    return missing


@dataclass
class TriageSettings:
    """`additional_config["triage"]`; every field has a default."""

    policy: str = "triage"
    policy_params: dict = field(default_factory=dict)
    profile: str = "vllm-cpu-smollm2"
    estimator: str = "proserve"
    classes: dict | None = None        # PriorityClasses.to_dict(); default: data file x slo_scale
    kv_offload: bool | None = None     # False: recompute even when a KV offloading connector is configured
    record_steps: int = 0              # keep the last N steps' (plan, scheduled) for tests
    learn: bool = True                 # online estimator correction from measured step times
    # ... and of the prefill cost relative to the rest (ρ, triage/estimators/base.py): the
    # profile was measured on another machine, whose prompt/decode cost ratio may differ
    learn_shape: bool = True
    step_log: str | None = None        # JSONL file: per step, what ran and what was preempted, and why

    @classmethod
    def from_vllm_config(cls, vllm_config) -> "TriageSettings":
        extra = getattr(vllm_config, "additional_config", None) or {}
        raw = dict(extra.get("triage", {})) if isinstance(extra, dict) else {}
        env = os.environ.get("TRIAGE_SCHEDULER_POLICY")
        if env and "policy" not in raw:
            raw["policy"] = env
        params_env = os.environ.get("TRIAGE_POLICY_PARAMS")   # JSON, as the service's setting
        if params_env and "policy_params" not in raw:
            try:
                raw["policy_params"] = json.loads(params_env)
            except json.JSONDecodeError as e:
                raise ValueError(f"TRIAGE_POLICY_PARAMS is not JSON ({e}): e.g. '{{\"max_preemptions\": 1}}'") from None
            if not isinstance(raw["policy_params"], dict):
                raise ValueError("TRIAGE_POLICY_PARAMS must be a JSON object of policy options")
        log_env = os.environ.get("TRIAGE_STEP_LOG")
        if log_env and "step_log" not in raw:
            raw["step_log"] = log_env
        if raw.get("step_log"):   # e.g. /tmp/steps-{pid}.jsonl: one file per engine process
            raw["step_log"] = str(raw["step_log"]).replace("{pid}", str(os.getpid()))
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        unknown = set(raw) - set(known)
        if unknown:
            raise ValueError(f"unknown triage scheduler settings: {sorted(unknown)}")
        return cls(**known)


@dataclass
class StepRecord:
    step: int
    t: float              # when the step was scheduled (the scheduler's clock)
    plan: dict[str, int]
    scheduled: dict[str, int]
    victims: list[str]
    preempted: list[str]
    repaired: bool


@dataclass
class TriageStats:
    steps: int = 0
    empty_steps: int = 0
    tokens: int = 0                    # tokens computed: prompt chunks, decodes, recomputed prompts
    plan_mismatches: int = 0
    plan_repairs: int = 0
    kv_mismatches: int = 0
    preemptions: int = 0
    offloads: int = 0
    recomputes: int = 0
    vllm_preemptions: int = 0          # victims vLLM chose itself (a mismatch)
    relabels: int = 0
    class_edits: int = 0
    control_refused: int = 0           # relabels and class edits refused (a bad level or table)
    last_step_s: float | None = None
    last_plan_s: float | None = None
    plan_overhead_s_max: float = 0.0
    estimator_ape_mean: float | None = None  # mean |pred - real| / real over measured steps
    estimator_beta: float = 1.0
    estimator_rho: float = 1.0               # prefill cost relative to the profile's, learnt online
    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0                   # of the requests added so far ...
    prefix_hit_tokens: int = 0               # ... and how many of them the prefix cache held at arrival


class TriageScheduler(Scheduler):
    """vLLM's scheduler, steered step by step by our policy."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.triage_settings = s = TriageSettings.from_vllm_config(self.vllm_config)
        profile = load_profile(s.profile)
        # A profile may carry hardware-scaled policy parameters (e.g. SlideBatching's
        # minimum time budget eta, in seconds): {"policy_params": {"triage": {"eta": 1.8}}}
        self.triage_policy = profile.make_policy(s.policy, **s.policy_params)
        classes = PriorityClasses.from_dict(s.classes) if s.classes else load_classes().scaled(profile.slo_scale)
        est = profile.estimator(s.estimator)
        est.learn_shape = s.learn and s.learn_shape
        # Offloading needs vLLM's KV offloading connector; without one every victim recomputes.
        offload = self.connector is not None and s.kv_offload is not False
        costs = None
        if offload and hasattr(est, "a_p"):
            costs = CacheCosts.from_estimator(est, profile.kv_load_per_token)
        self.kv_offload = offload
        # The block pool keeps one null block out of circulation: count only the usable ones.
        num_blocks = self.kv_cache_manager.block_pool.get_num_free_blocks()
        limits = Limits(max_num_seqs=self.max_num_active_reqs,
                        max_num_batched_tokens=self.max_num_scheduled_tokens,
                        max_model_len=self.max_model_len)
        self.tstate = EngineState(KVCache(num_blocks, self.block_size), est, classes, limits, costs)
        self.tstats = TriageStats()
        self.step_log: deque[StepRecord] = deque(maxlen=max(0, s.record_steps))
        self._control: deque[tuple[str, Any]] = deque()
        self._plan_tokens: dict[str, int] | None = None
        self._external: dict[str, str] = {}     # client's request id -> vLLM's internal id
        self._client_id: dict[str, str] = {}    # and back (the step log speaks the client's ids)
        self._step_log = open(s.step_log, "a", buffering=1, encoding="utf-8") if s.step_log else None
        self._seq = 0
        self._pending_works: list[Work] | None = None
        self._t_sched_end = 0.0
        self._step_rec: dict | None = None     # this step's step-log line, written once its output is in
        self._t_exec0 = 0.0
        self._engine_cpu = EngineCPU() if s.step_log else None
        self._cpu_exec0 = (0.0, 0.0)
        self._ape_sum = 0.0
        self._ape_n = 0
        self._recompute_only: set[str] = set()
        # scheduled requests whose policy columns are not yet re-read: their output re-reads
        # them (`_sync`), or the next plan does if no output came (async scheduling)
        self._stale: dict[str, Request] = {}
        # (step, request id, level, keep_tokens planned, mode executed) of recent preemptions
        self.preemption_log: deque[tuple[int, str, int, int, str]] = deque(maxlen=256)
        self.clock = time.time  # the peers harness swaps in a virtual clock
        missing = check_vllm_members(self)
        if missing:
            log.warning("TriageScheduler: vLLM differs from the pinned %s: %s", VLLM_VERSION, missing)
        log.info("TriageScheduler: policy=%s profile=%s blocks=%d block_size=%d offload=%s",
                 s.policy, s.profile, num_blocks, self.block_size, offload)

    # ------------------------------------------------------------------ requests in/out
    def add_request(self, request: VllmRequest) -> None:
        existing = request.request_id in self.requests
        super().add_request(request)
        if existing:
            return  # a streaming-input update of a known request
        sp = request.sampling_params
        xa = request_fields(sp.extra_args, request.arrival_time) if sp is not None else {}  # nested or flat wire keys
        classes = self.tstate.classes
        level = xa.get("level")
        if level not in classes.classes:   # absent, or a level this table lacks (any client may send one)
            level = request.priority if request.priority in classes.classes else classes.least_urgent
        level = int(level)
        c = classes.get(level)
        max_tokens = int(request.max_tokens or 1)
        r = Request(
            id=request.request_id,
            arrival=float(xa.get("arrival", request.arrival_time)),
            prompt_len=request.num_prompt_tokens,
            predicted_level=level,
            ttft_slo=float(xa.get("ttft_slo", c.ttft)),
            tpot_slo=float(xa.get("tpot_slo", c.tpot)),
            predicted_output_len=max(1, min(int(xa.get("predicted_output_len", max_tokens)), max_tokens)),
            output_len=max_tokens,
            seq=self._seq,
        )
        self._seq += 1
        # with prefix caching, the prompt's leading blocks already in the cache (a shared
        # system turn of a whole block or more, a repeated prompt) are not computed again:
        # the plan charges the step only for the rest, as vLLM will run it
        r.computed = self._prefix_hit(request)
        self.tstats.prompt_tokens += r.prompt_len
        self.tstats.prefix_hit_tokens += r.computed
        self.tstate.add(r)
        # add() refreshed weight/SLOs from the class table; per-request SLOs win
        if "ttft_slo" in xa:
            r.ttft_slo = float(xa["ttft_slo"])
        if "tpot_slo" in xa:
            r.tpot_slo = float(xa["tpot_slo"])
        ext = xa.get("id")
        if ext:
            self._external[str(ext)] = request.request_id
            self._client_id[request.request_id] = str(ext)

    def _prefix_hit(self, request: VllmRequest) -> int:
        """Prompt tokens of `request` whose KV the prefix cache holds now (0 without
        prefix caching). Read at arrival: while any request holding the shared prefix runs,
        its blocks stay cached; a hit lost by admission time only means vLLM computes more
        than planned that step, and the mirror takes vLLM's count after it."""
        if not self.cache_config.enable_prefix_caching:
            return 0
        return int(self.kv_cache_manager.get_computed_blocks(request)[1])

    def finish_requests(self, request_ids, finished_status: RequestStatus):
        done = super().finish_requests(request_ids, finished_status)
        for req in done:
            self._forget(req.request_id)
        return done

    def _forget(self, rid: str) -> None:
        if rid in self.tstate.requests:
            self.tstate.remove(rid)
        self._recompute_only.discard(rid)
        self._stale.pop(rid, None)
        ext = self._client_id.pop(rid, None)
        if ext is not None:
            self._external.pop(ext, None)

    # ------------------------------------------------------------------ control channel
    def triage_control(self, op: str, payload: Any = None) -> Any:
        """Relabels and class edits queue up and take effect at the next step; `stats`
        and `steps` answer at once. Reached from the client through EngineCore's
        utility dispatch (`call_utility_async("triage_control", op, payload)`)."""
        if op in ("relabel", "set_classes", "set_learnt"):
            why = self._refuse_control(op, payload)
            if why is not None:   # checked here, at the door: applied inside a step, it would end the engine
                self.tstats.control_refused += 1
                return {"refused": why}
            self._control.append((op, payload))
            return True
        if op == "stats":
            return self.triage_stats()
        if op == "steps":
            return [asdict(r) for r in self.step_log]
        if op == "load":   # GET /triage/load on a `triage instance` (serving.instance)
            return load_snapshot(self)
        if op == "preemptions":
            return [list(x) for x in self.preemption_log]
        if op == "learnt":   # the step-time corrections learnt online (TriageEngine's standby build)
            return self.tstate.estimator.learnt()
        raise ValueError(f"unknown triage control op {op!r}")

    def _next_classes(self) -> PriorityClasses:
        """The class table from the next step on: the last queued edit's, else the one in force
        (an idle engine takes a queued edit at its next request's first step)."""
        for op, p in reversed(self._control):
            if op == "set_classes":
                return p if isinstance(p, PriorityClasses) else PriorityClasses.from_dict(p)
        return self.tstate.classes

    def next_classes_version(self) -> int:
        return self._next_classes().version

    def _refuse_control(self, op: str, p: Any) -> str | None:
        """Why a relabel or class edit cannot be applied (None: it can): a malformed table, an
        unknown level, or a table without a level that live requests hold."""
        try:
            if op == "set_classes":
                table = p if isinstance(p, PriorityClasses) else PriorityClasses.from_dict(p)
                held = {r.level for r in self.tstate.requests.values()} - set(table.levels)
                return f"levels {sorted(held)} are held by live requests" if held else None
            if op == "relabel":
                level = p.get("level")
                if level is not None:
                    self._next_classes().get(int(level))
        except (ClassError, KeyError, TypeError, ValueError, AttributeError) as e:
            return str(e) or type(e).__name__
        return None

    def _apply_control(self) -> None:
        while self._control:
            op, p = self._control.popleft()
            try:
                self._apply_one(op, p)
            except (ClassError, KeyError, TypeError, ValueError) as e:   # never the step's end
                self.tstats.control_refused += 1
                log.warning("triage control %s not applied: %s", op, e)

    def _apply_one(self, op: str, p: Any) -> None:
        st = self.tstate
        if op == "relabel":
            rid = self._external.get(str(p["id"]), str(p["id"]))
            level = p.get("level")
            if rid in st.requests:
                st.relabel(rid, None if level is None else int(level))
                req = self.requests.get(rid)
                if req is not None and level is not None:
                    req.priority = int(level)  # vLLM's own fallback orders agree
                self.tstats.relabels += 1
        elif op == "set_learnt":
            self.tstate.estimator.set_learnt(p)
        elif op == "set_classes":
            st.set_classes(p if isinstance(p, PriorityClasses) else PriorityClasses.from_dict(p))
            self.tstats.class_edits += 1

    def triage_stats(self) -> dict:
        s = self.tstats
        s.running, s.waiting = len(self.running), len(self.waiting) + len(self.kv_holding_waiting)
        s.estimator_beta = float(self.tstate.estimator.beta)
        s.estimator_rho = float(self.tstate.estimator.rho)
        s.estimator_ape_mean = self._ape_sum / self._ape_n if self._ape_n else None
        out = {**asdict(s), "policy": self.triage_settings.policy, "profile": self.triage_settings.profile,
               "kv_blocks": self.tstate.kv.num_blocks, "block_size": self.block_size,
               "classes_version": self.tstate.classes.version}
        # plain Python numbers only: a numpy scalar in a utility call's answer fails vLLM's
        # serialiser in the engine's output thread, which takes the engine down
        return {k: v.item() if hasattr(v, "item") else v for k, v in out.items()}

    # ------------------------------------------------------------------ the step
    def _reserve_prefill_lookahead(self, request: VllmRequest, num_computed_tokens: int, num_new_tokens: int) -> int:
        n = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        if self._plan_tokens is None:
            return n
        return min(n, self._plan_tokens.get(request.request_id, 0))

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        now = self.clock()
        t0 = time.perf_counter()
        self._apply_control()
        self._reconcile()
        st = self.tstate
        for r in self._stale.values():
            st.touch(r)
        self._stale.clear()
        plan = self.triage_policy.plan(st, now)
        plan, repaired = self._repair(plan)
        victims = [p.request_id for p in plan.preemptions]
        for p in plan.preemptions:
            self._preempt_ours(p, now)
        admit = FCFSRequestQueue()
        for rid in plan.tokens:
            req = self.requests[rid]
            if req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                admit.append(req)
        planned_admissions = list(admit)
        waiting, holding = self.waiting, self.kv_holding_waiting
        self.waiting, self.kv_holding_waiting = admit, FCFSRequestQueue()
        self._plan_tokens = plan.tokens
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self._plan_tokens = None
            left = self.waiting
            self.waiting, self.kv_holding_waiting = waiting, holding
            admitted = [r for r in planned_admissions if r.status == RequestStatus.RUNNING]
            if admitted:
                waiting.remove_requests(admitted)
            present = set(map(id, waiting))
            for r in left:  # vLLM preempted one itself (a mismatch): it went to the swapped queue
                if id(r) not in present and not r.is_finished():
                    waiting.prepend_request(r)
        self._after_schedule(out, plan, victims, repaired, now)
        dt = time.perf_counter() - t0
        if self._step_log is not None:
            self._flush_step()   # a step vLLM never reported back (nothing ran)
            self._step_rec = self._step_record(now, plan, out.num_scheduled_tokens, sorted(out.preempted_req_ids), dt)
            self._t_exec0 = time.perf_counter()
            self._cpu_exec0 = self._engine_cpu.read()
        self.tstats.last_plan_s = dt
        self.tstats.plan_overhead_s_max = max(self.tstats.plan_overhead_s_max, dt)
        self._t_sched_end = self.clock()
        return out

    def _preempt_ours(self, p: Preemption, now: float) -> None:
        req = self.requests[p.request_id]
        self.running.remove(req)
        self._preempt_request(req, time.monotonic())
        keep = p.keep_tokens if self.kv_offload else 0
        self.tstate.preempt(p.request_id, keep)
        self.tstats.preemptions += 1
        self.preemption_log.append((self.tstats.steps + 1, p.request_id, self.tstate.requests[p.request_id].level,
                                    p.keep_tokens, "offload" if keep > 0 else "recompute"))
        if keep > 0:
            self.tstats.offloads += 1
            self._recompute_only.discard(p.request_id)
        else:
            self.tstats.recomputes += 1
            if self.connector is not None:
                # recompute: do not let the offloading connector bring its KV back
                req.skip_reading_prefix_cache = True
                self._recompute_only.add(p.request_id)

    def _after_schedule(self, out: SchedulerOutput, plan: BatchPlan, victims: list[str], repaired: bool,
                        now: float) -> None:
        st = self.tstate
        scheduled = out.num_scheduled_tokens
        works: list[Work] = []
        for rid, k in scheduled.items():
            r = st.requests.get(rid)
            if r is None:
                continue
            req = self.requests[rid]
            if r.stage in WAITING:
                st.admit(r, now)
                if rid in self._recompute_only:
                    req.skip_reading_prefix_cache = req.get_skip_reading_prefix_cache()
                    self._recompute_only.discard(rid)
            # vLLM already advanced num_computed_tokens by k (prefix hits included)
            before = req.num_computed_tokens - k
            works.append(Work(k, before))
            r.computed = before
            st.allocate(r, k)
            r.computed = req.num_computed_tokens
            r.stage = Stage.PREFILLING if r.computed < r.known else Stage.DECODING
            self._stale[rid] = r   # re-read once, when its output is in (`_sync`)
        self._pending_works = works or None
        preempted = sorted(out.preempted_req_ids)
        ours = sorted(victims)
        self.tstats.steps += 1
        self.tstats.tokens += sum(scheduled.values())
        if not scheduled:
            self.tstats.empty_steps += 1
        if repaired:
            self.tstats.plan_repairs += 1
        extra_victims = set(preempted) - set(ours)
        if extra_victims:
            self.tstats.vllm_preemptions += len(extra_victims)
            for rid in extra_victims:  # mirror vLLM's own preemption
                r = st.requests.get(rid)
                if r is not None and r.stage not in WAITING:
                    st.preempt(rid, 0)
        if dict(scheduled) != plan.tokens or preempted != ours:
            self.tstats.plan_mismatches += 1
            log.debug("plan mismatch at step %d: plan=%s scheduled=%s", self.tstats.steps, plan.tokens, scheduled)
        if self.step_log.maxlen:
            self.step_log.append(StepRecord(self.tstats.steps, now, dict(plan.tokens), dict(scheduled), ours,
                                            preempted, repaired))
        if self.kv_cache_manager.block_pool.get_num_free_blocks() != st.kv.free_blocks and \
                not self.cache_config.enable_prefix_caching:
            self.tstats.kv_mismatches += 1

    def _step_record(self, now: float, plan: BatchPlan, scheduled: dict, preempted: list[str], sched_s: float) -> dict:
        """One JSON line per step (setting `step_log`): what ran (client id, level, tokens,
        prefill or decode), what was preempted, why and for whom, and where the step's time
        went: `sched_ms` scheduling it (our plan and vLLM's schedule), `exec_ms` the model
        (the executor, from the end of scheduling until its output came back), `update_ms`
        taking the output in (vLLM's update and our bookkeeping), and beside `exec_ms` the CPU
        the model's processes spent in it, `exec_cpu_ms` (of which `exec_sys_ms` in the kernel;
        10-ms ticks, serving/engine_cpu.py): a step far slower than its prediction with little
        CPU in it waited for a core; `waiting` the requests left waiting, `waiting_levels` the
        same by level. No prompt text. Written when the step's output is in (`_flush_step`)."""
        st, cid = self.tstate, lambda rid: self._client_id.get(rid, rid)  # noqa: E731
        level = lambda rid: st.requests[rid].level if rid in st.requests else None  # noqa: E731
        why = {p.request_id: p for p in plan.preemptions}
        ran = [[cid(rid), level(rid), k, "decode" if k == 1 and st.requests.get(rid) is not None
                and st.requests[rid].generated > 0 else "prefill"] for rid, k in scheduled.items()]
        pre = []
        for rid in preempted:
            p = why.get(rid)
            pre.append({"id": cid(rid), "level": level(rid), "reason": p.reason if p else "vllm",
                        "for": cid(p.for_request) if p and p.for_request else None,
                        "for_level": level(p.for_request) if p and p.for_request else None,
                        "mode": p.mode if p else "recompute"})
        rec = {"step": self.tstats.steps, "t": round(now, 4), "budget_s": plan.budget_s,
               "predicted_s": round(plan.predicted_s, 4), "sched_ms": round(1000 * sched_s, 2), "stop": plan.stop,
               "running": len(self.running),
               "waiting": len(self.waiting), "waiting_levels": self._waiting_levels(level), "ran": ran, "preempted": pre}
        return rec

    def _waiting_levels(self, level) -> dict[str, int]:
        """The requests left waiting after this step's schedule, counted by level ("1": n, …;
        "-" for a request without one): a reader tells a step that left urgent calls waiting
        from one that left only calls that can afford to."""
        return dict(Counter("-" if (lv := level(r.request_id)) is None else str(lv) for r in self.waiting))

    def _flush_step(self, exec_s: float | None = None, update_s: float | None = None,
                    cpu: tuple[float, float] | None = None) -> None:
        rec, self._step_rec = self._step_rec, None
        if rec is None:
            return
        if exec_s is not None:
            rec["exec_ms"], rec["update_ms"] = round(1000 * exec_s, 2), round(1000 * update_s, 2)
        if cpu is not None:
            (u0, s0), (u1, s1) = self._cpu_exec0, cpu
            rec["exec_cpu_ms"], rec["exec_sys_ms"] = round(1000 * (u1 - u0 + s1 - s0)), round(1000 * (s1 - s0))
        self._step_log.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output):
        timed = self._step_rec is not None   # timed only for the step log
        t_in = time.perf_counter() if timed else 0.0
        cpu_in = self._engine_cpu.read() if timed else None
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        now = self.clock()
        st = self.tstate
        for rid in scheduler_output.num_scheduled_tokens:
            r = st.requests.get(rid)
            if r is None:
                continue
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                self._forget(rid)
                continue
            self._sync(r, req, now)
        if self._pending_works:
            real = now - self._t_sched_end  # the step as the scheduler sees it (virtual in bench peers)
            est = st.estimator
            self.tstats.last_step_s = real
            if real > 0 and self.triage_settings.learn:
                predicted = est.observe_batch(self._pending_works, real)
                self._ape_sum += float(abs(predicted - real) / real)
                self._ape_n += 1
            self._pending_works = None
        if self._step_rec is not None:
            self._flush_step(t_in - self._t_exec0, time.perf_counter() - t_in, cpu_in)
        return outputs

    def _sync(self, r: Request, req: VllmRequest, now: float) -> None:
        gen = req.num_output_tokens
        while r.generated < gen:
            r.generated += 1
            r.token_times.append(now)
        r.computed = req.num_computed_tokens
        if req.status == RequestStatus.RUNNING:
            r.stage = Stage.PREFILLING if r.computed < r.known - 1 or r.generated == 0 else Stage.DECODING
        self._stale.pop(r.id, None)
        self.tstate.touch(r)  # the policy reads the numpy columns: re-read need, deadlines, last token

    def _reconcile(self) -> None:
        """Catch up with what vLLM did outside our plan (its own preemptions, stops
        reported for requests not scheduled this step)."""
        st = self.tstate
        for rid in [rid for rid in st.requests if rid not in self.requests or self.requests[rid].is_finished()]:
            self._forget(rid)
        for r in list(st.running):
            req = self.requests[r.id]
            if req.status != RequestStatus.RUNNING:
                st.preempt(r.id, 0)

    # ------------------------------------------------------------------ vLLM's order
    def _repair(self, plan: BatchPlan) -> tuple[BatchPlan, bool]:
        """Replay the plan in vLLM's order against vLLM's real free blocks: running
        requests (in `running` order) first, then admissions in plan order through the
        full-sequence gate. Drops admissions (or trims running chunks) that would fail,
        so vLLM never preempts on its own. Returns the plan that will execute."""
        if not plan.tokens:
            return plan, False
        bs = self.block_size
        st = self.tstate
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        victims = {p.request_id for p in plan.preemptions}
        for rid in victims:
            free += st.kv.blocks_of(rid)
        tokens = dict(plan.tokens)
        changed = False
        for req in self.running:
            rid = req.request_id
            k = tokens.get(rid)
            if not k or rid in victims:
                continue
            held = st.kv.blocks_of(rid)
            c = req.num_computed_tokens
            need = max(0, math.ceil((c + k) / bs) - held)
            if need > free:
                k2 = max(0, (held + free) * bs - c)
                changed = True
                if k2 <= 0:
                    del tokens[rid]
                    continue
                tokens[rid] = k2
                need = max(0, math.ceil((c + k2) / bs) - held)
            free -= need
        for rid, k in list(tokens.items()):
            req = self.requests[rid]
            if req.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                continue
            gate = math.ceil(min(req.num_tokens, self.max_model_len) / bs) if self.scheduler_reserve_full_isl else 0
            need = math.ceil((req.num_computed_tokens + k) / bs)
            if max(gate, need) > free:
                del tokens[rid]
                changed = True
                continue
            free -= need
        if not changed:
            return plan, False
        return BatchPlan(tokens, plan.preemptions, plan.budget_s, plan.predicted_s, plan.stop), True


# -------------------------------------------------------------------------------------
# Control channel: EngineCore dispatches utility calls by method name (getattr on the
# EngineCore object). This module is imported inside the EngineCore process when vLLM
# resolves `scheduler_cls`, so defining the method here makes it callable from the
# client with `engine_core.call_utility_async("triage_control", op, payload)`.
def _install_engine_core_hook() -> None:
    try:
        from vllm.v1.engine.core import EngineCore
    except Exception:  # pragma: no cover - vLLM without EngineCore
        return
    if getattr(EngineCore, "triage_control", None) is not None:
        return

    def triage_control(self, op: str, payload: Any = None) -> Any:
        sched = getattr(self, "scheduler", None)
        if not hasattr(sched, "triage_control"):
            raise RuntimeError("the engine does not run serving.vllm_scheduler.TriageScheduler")
        return sched.triage_control(op, payload)

    EngineCore.triage_control = triage_control


_install_engine_core_hook()
