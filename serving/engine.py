"""An async engine over vLLM's `AsyncLLM` with our scheduler inside.

    engine = TriageEngine(EngineConfig())
    await engine.start()
    async for ev in engine.generate("r1", prompt, max_tokens=64, level=1, ttft_slo=1.0,
                                    tpot_slo=0.1, predicted_output_len=40):
        ...                                   # TokenEvent: text delta, token ids, time
    await engine.relabel("r2", 1)            # takes effect at the next engine step
    await engine.stop()

Per-request level, SLOs and predicted length travel in `priority` (= level) and
`SamplingParams.extra_args["triage"]`. Relabels, class edits and statistics cross into
the EngineCore process (where the scheduler lives) through EngineCore's utility calls
(`serving.vllm_scheduler.triage_control`), answered between two engine steps.
Prompts are never logged.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from serving.gc_heap import freeze_heap
from serving.model_prep import default_model_dir, generation_defaults
from serving.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SCHEDULER_CLS = "serving.vllm_scheduler.TriageScheduler"
# SamplingParams keywords `TriageEngine.generate` passes through (beside max_tokens,
# temperature, top_p, stop). Never extra_args: the engine sets those from the level,
# SLOs and prediction, so no caller can speak for the scheduler.
SAMPLING_KEYS = frozenset({"top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                           "stop_token_ids", "ignore_eos", "min_tokens", "include_stop_str_in_output",
                           "skip_special_tokens", "spaces_between_special_tokens", "logit_bias", "seed",
                           "stream_interval"})


def cpu_only() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return True


def vllm_env(base: dict | None = None, kv_cache_gib: float = 1.0, cpus: str | None = None,
             threads: int | None = None) -> dict:
    """The environment vLLM needs here, as a copy of `base` (default: this process's) with
    only what the operator has not set added. On CPU: KV cache GiB, and the cores its OpenMP
    threads bind to (`cpus`, e.g. "0" or "0-1"; "nobind": threads float, `threads` of them;
    on a machine shared with other pinned work a pinned low-priority engine can starve).

    `VLLM_USE_AOT_COMPILE=0` on CPU: vLLM 0.32 saves its ahead-of-time compiled model but
    cannot load it back on CPU ("'function' object has no attribute 'finalize_loading'"),
    so every engine start compiled the model again (~40 s of a 60-80 s start, and of every
    restart after an engine death). The older compile cache loads (a start takes ~30 s on
    a quiet 2-core VM); decode speed is the same (measured in docs/service.md)."""
    env = dict(os.environ if base is None else base)
    if threads:
        env["OMP_NUM_THREADS"] = str(int(threads))
    env.setdefault("HF_HUB_OFFLINE", "1")
    if cpu_only():
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(kv_cache_gib)))))
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        if cpus:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
        else:
            ncpu = os.cpu_count() or 1
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{max(0, min(ncpu, 2) - 1)}")
    return env


# vLLM 0.32's native KV offloading (`--kv-offloading-size`: OffloadingConnector with
# CPUOffloadingSpec) refuses a CPU engine at start ("CPU Offloading is currently only supported
# on CUDA-alike and XPU GPUs", seen with vllm-cpu 0.32.0); on CPU the KV cache is in host
# memory already, so there is nothing to offload it to.
CPU_OFFLOAD_REFUSED = ("KV offloading needs a GPU engine: vLLM 0.32 refuses its offloading connector on CPU "
                       "(\"CPU Offloading is currently only supported on CUDA-alike and XPU GPUs\"), and on CPU "
                       "the KV cache is in host memory already; leave kv_offload_gib unset or 0")
AUTO_OFFLOAD_SHARE = 0.25     # auto: this share of the host memory available at start ...
AUTO_OFFLOAD_MAX_GIB = 16     # ... at most this much, in whole GiB


def kv_offload_gib(requested: float | None, *, cpu: bool, host_available_gib: float) -> float:
    """The host memory (GiB) vLLM's native KV offloading gets; seed 004's cache branch
    offloads a preempted request's KV there instead of recomputing it (docs/vllm.md).
    `requested` None is auto: on a GPU engine a quarter of the host memory available, at
    most 16 GiB, in whole GiB (0 below 1 GiB); on CPU 0. An explicit size on CPU is
    refused (`CPU_OFFLOAD_REFUSED`)."""
    if requested is None:
        if cpu:
            return 0.0
        return float(min(AUTO_OFFLOAD_MAX_GIB, int(max(0.0, host_available_gib) * AUTO_OFFLOAD_SHARE)))
    if requested < 0:
        raise ValueError(f"kv_offload_gib must be >= 0, got {requested}")
    if requested > 0 and cpu:
        raise ValueError(CPU_OFFLOAD_REFUSED)
    return float(requested)


STANDBY_MIN_HOST_GIB = 6.0   # auto standby: the host memory free at start it needs (a CPU engine: ~2-3 GiB)


def standby_enabled(requested: bool | None, *, cpu: bool, host_available_gib: float) -> bool:
    """Whether to keep a standby engine. `requested` None is auto: on a CPU engine when the
    host has `STANDBY_MIN_HOST_GIB` available, never on a GPU (a second copy of the model
    and its KV cache in GPU memory is an operator's explicit choice)."""
    if requested is not None:
        return bool(requested)
    return cpu and host_available_gib >= STANDBY_MIN_HOST_GIB


def engine_env(kv_cache_gib: float = 1.0) -> None:
    """The in-process engine's environment (`vllm_env`), set only where the operator has not set it."""
    os.environ.update(vllm_env(kv_cache_gib=kv_cache_gib))


def lower_engine_priority(niceness: int, root: int | None = None, skip: set[int] = frozenset()) -> list[int]:
    """Raise the nice value of the children of this process (or of process `root`: a
    co-located `triage instance`) - vLLM's EngineCore and workers - by `niceness`, except
    the pids in `skip` (an engine's processes niced already). On a CPU shared by engine
    and service, the service's short bursts of work (tokenising, classifying, streaming)
    then run first; the engine takes what is left, which is nearly everything. Returns the
    pids changed."""
    import psutil

    done = []
    for p in psutil.Process(root).children(recursive=True):
        if p.pid in skip:
            continue
        try:
            value = min(19, p.nice() + niceness)
            for t in p.threads():   # Linux nice is per thread: the worker's OpenMP threads exist already
                os.setpriority(os.PRIO_PROCESS, t.id, value)
            done.append(p.pid)
        except (psutil.Error, OSError) as e:   # not ours to change: say so, keep going
            log.warning("could not lower the priority of engine process %d: %s", p.pid, e)
    log.info("engine processes %s run at nice +%d below the service", done, niceness)
    return done


def _shutdown_late_engine(fut) -> None:
    if not fut.cancelled() and fut.exception() is None:
        log.warning("an engine start that was given up finished late: shutting it down")
        fut.result().shutdown()


@dataclass
class EngineConfig:
    model: str = field(default_factory=lambda: str(default_model_dir()))
    max_model_len: int = 2048
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    kv_cache_gib: float = 1.0
    policy: str = "triage"
    profile: str = "vllm-cpu-smollm2"
    enable_prefix_caching: bool = True   # vLLM's default; the scheduler plans with the hits
    kv_offload_gib: float = 0         # GiB of host memory for vLLM's native KV offloading (GPU only)
    block_size: int | None = 32       # vLLM-CPU prefers multiples of 32
    dtype: str | None = None          # None: float32 on CPU (vLLM-CPU's bf16 path garbles SmolLM2), bf16 on GPU
    seed: int = 0
    classes: dict | None = None       # PriorityClasses.to_dict(); default: data file x profile slo_scale
    policy_params: dict = field(default_factory=dict)
    record_steps: int = 0             # the scheduler keeps the last N (plan, scheduled) pairs
    step_log: str | None = None       # JSONL file: per step what ran, what was preempted and why
    learn_shape: bool = True          # the scheduler learns the prefill/decode cost ratio online (ρ)
    # CPU only: the engine's processes run at this much lower priority than the service, so
    # classifying and streaming a new call never waits behind the engine's compute (0: off, the
    # default: see Settings.engine_nice)
    engine_nice: int = 0
    # a second engine kept started and idle: when the serving one dies it takes over at once
    # (no cold start, ~30-70 s on a 2-core CPU), and a new standby is built in the background.
    # Costs the engine's memory twice (model + KV cache) and, while building, CPU
    standby: bool = False
    enforce_eager: bool = False       # no torch.compile (vLLM's --enforce-eager): a much shorter start on CPU
    gc_freeze: bool = True            # each engine built: its client objects frozen out of GC scans
    scheduler_cls: str | None = SCHEDULER_CLS   # None: vLLM's own scheduler
    scheduling_policy: str = "priority"
    stats_interval_s: float = 0.5
    extra_engine_args: dict = field(default_factory=dict)

    def engine_args(self):
        if self.kv_offload_gib:   # refused on CPU before vLLM fails in its worker at start
            kv_offload_gib(self.kv_offload_gib, cpu=cpu_only(), host_available_gib=0)
        from vllm.engine.arg_utils import AsyncEngineArgs

        kw: dict[str, Any] = dict(
            model=self.model, max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens, enable_prefix_caching=self.enable_prefix_caching,
            dtype=self.dtype or ("float32" if cpu_only() else "bfloat16"), seed=self.seed, scheduling_policy=self.scheduling_policy,
            long_prefill_token_threshold=0, enable_chunked_prefill=True, enforce_eager=self.enforce_eager,
        )
        if self.block_size:
            kw["block_size"] = self.block_size
        if self.scheduler_cls:
            kw["scheduler_cls"] = self.scheduler_cls
            triage = {"policy": self.policy, "profile": self.profile, "policy_params": self.policy_params,
                      "record_steps": self.record_steps, "learn_shape": self.learn_shape}
            if self.step_log:
                triage["step_log"] = str(self.step_log)
            if self.classes:
                triage["classes"] = self.classes
            kw["additional_config"] = {"triage": triage}
        if self.kv_offload_gib and self.kv_offload_gib > 0:
            kw["kv_offloading_size"] = float(self.kv_offload_gib)
            kw["kv_offloading_backend"] = "native"
        if not cpu_only():
            kw["kv_cache_memory_bytes"] = int(self.kv_cache_gib * (1 << 30))
        kw.update(self.extra_engine_args)
        return AsyncEngineArgs(**kw)


@dataclass
class TokenEvent:
    request_id: str
    text: str
    token_ids: list[int]
    time: float
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    output_tokens: int


class EngineNotReady(RuntimeError):
    pass


class TriageEngine:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        self._llm = None
        self._tokenizer = None
        self._stats: dict = {}
        self._stats_task: asyncio.Task | None = None
        self._generation_defaults: dict = {}
        self._seed_warned = False
        self._restart_lock = asyncio.Lock()
        self._standby = None                       # a second engine, started and idle (config.standby)
        self._standby_task: asyncio.Task | None = None
        self._standby_error: str | None = None
        self._reaping: set[asyncio.Task] = set()   # dead engines being shut down
        self._closing = False
        self._niced: set[int] = set()              # engine processes lowered in priority already
        self.standby_takeovers = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._llm is not None:
            return
        engine_env(self.config.kv_cache_gib)
        t0 = time.time()
        self._install(await self._build())
        log.info("engine ready in %.1f s (model %s, scheduler %s)", time.time() - t0, self.config.model,
                 self.config.scheduler_cls or "vllm")
        if self.config.scheduler_cls == SCHEDULER_CLS:
            await self.refresh_stats()
        self._keep_standby()

    async def _build(self):
        """A new AsyncLLM with this configuration, started and ready (its core process niced)."""
        from vllm.v1.engine.async_llm import AsyncLLM

        args = self.config.engine_args()
        # built in a worker thread: the event loop keeps answering (health checks, new
        # calls into the queue, streams) while the engine loads, e.g. during a restart
        fut = asyncio.get_running_loop().run_in_executor(None, AsyncLLM.from_engine_args, args)
        try:
            llm = await asyncio.shield(fut)
        except asyncio.CancelledError:   # timed out or shut down: an engine built later is shut down, not leaked
            fut.add_done_callback(_shutdown_late_engine)
            raise
        if hasattr(llm, "_run_output_handler"):   # vLLM starts it itself only when built on the loop
            llm._run_output_handler()
        if cpu_only() and self.config.engine_nice > 0:   # each engine's processes once (a standby's too)
            self._niced.update(lower_engine_priority(self.config.engine_nice, skip=self._niced))
        if self.config.gc_freeze:   # its client objects out of later collections (serving/gc_heap.py)
            freeze_heap("engine built")
        return llm

    def _install(self, llm) -> None:
        """Serve with `llm` from now on."""
        self._llm = llm
        # The request defaults vLLM's own server applies (--generation-config, default
        # "auto": the model directory's generation_config.json), read once. vLLM reads that
        # file through transformers' GenerationConfig, which drops the keys transformers
        # lacks (frequency_penalty, presence_penalty): those are read from the file itself.
        self._generation_defaults = dict(llm.model_config.get_diff_sampling_param())
        self._generation_defaults.pop("max_tokens", None)
        self._generation_defaults.update(generation_defaults(self.config.model))   # {} for a hub name
        if self.config.scheduler_cls == SCHEDULER_CLS and self.config.stats_interval_s > 0:
            self._stats_task = asyncio.create_task(self._poll_stats())

    # ------------------------------------------------------------------ standby
    def _keep_standby(self) -> None:
        """Start building the standby engine in the background, if configured and none is
        built or building."""
        if self.config.standby and self._standby is None and (self._standby_task is None or self._standby_task.done()):
            self._standby_task = asyncio.create_task(self._build_standby(), name="engine-standby")

    async def _build_standby(self) -> None:
        t0 = time.time()
        self._standby_error = None
        # the build (loading, compiling) takes the CPU from the serving engine for tens of
        # seconds, and its scheduler would learn that slowness as this machine's speed, then
        # carry it into the next burst (steps planned 3x too long; docs/measurements/single-engine.md): what it
        # learnt before the build is put back after it
        learnt = await self._learnt()
        try:
            llm = await self._build()
        except asyncio.CancelledError:
            raise
        except Exception as e:   # the serving engine is unaffected; a death is then a cold restart
            self._standby_error = f"{type(e).__name__}: {e}"
            log.warning("standby engine failed to start: %s", self._standby_error)
            return
        finally:
            await self._set_learnt(learnt)
        if self._closing:
            await asyncio.to_thread(llm.shutdown)
            return
        self._standby = llm
        log.info("standby engine ready in %.1f s: a dead engine is replaced at once", time.time() - t0)

    @property
    def standby_state(self) -> str:
        """"off" | "building" | "ready" | "failed": whether a death is survived without a
        cold start (failed: the last standby did not start; the next death restarts cold)."""
        if not self.config.standby:
            return "off"
        if self._standby is not None and not self._standby.errored:
            return "ready"
        if self._standby_error is not None and (self._standby_task is None or self._standby_task.done()):
            return "failed"
        return "building"

    async def stop(self) -> None:
        self._closing = True
        # a standby still building is cancelled first: its build hands what the serving
        # engine learnt back to that engine, which must still be up
        task, self._standby_task = self._standby_task, None
        if task is not None and not task.done():
            await cancel_and_wait(task)
        standby, self._standby = self._standby, None
        # then both engines at once: each shutdown waits seconds for its own processes
        stops = [self._stop_serving()]
        if standby is not None:
            stops.append(asyncio.to_thread(standby.shutdown))
        await asyncio.gather(*stops)
        if self._reaping:
            await asyncio.gather(*self._reaping, return_exceptions=True)
        self._closing = False

    async def _stop_stats(self) -> None:
        await cancel_and_wait(self._stats_task)
        self._stats_task = None

    async def _stop_serving(self) -> None:
        await self._stop_stats()
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)   # joins the engine's processes: off the loop

    async def restart(self) -> bool:
        """Replace a dead engine with a new one (same configuration). Returns False when
        there was nothing to do: the engine is alive (another caller restarted it)."""
        async with self._restart_lock:
            if self._llm is not None and not self._llm.errored:
                return False
            spare, self._standby = self._standby, None
            if spare is not None and not spare.errored:
                dead = self._llm
                await self._stop_stats()
                self._install(spare)   # already started and idle: serving again at once
                self.standby_takeovers += 1
                log.warning("engine replaced by its standby; building a new standby")
                if dead is not None:   # joined in the background: the standby serves meanwhile
                    task = asyncio.create_task(asyncio.to_thread(dead.shutdown), name="engine-reap")
                    self._reaping.add(task)
                    task.add_done_callback(self._reaping.discard)
                self._keep_standby()
                return True
            await self._stop_serving()
            if spare is not None:      # it died too: start afresh
                await asyncio.to_thread(spare.shutdown)
            await self.start()
            return True

    @property
    def ready(self) -> bool:
        return self._llm is not None and not self._llm.errored

    @property
    def dead(self) -> bool:
        """The engine stopped on its own: its core process died (killed, out of memory) or
        it raised (`EngineDeadError` for every request)."""
        return self._llm is not None and bool(self._llm.errored)

    @property
    def max_model_len(self) -> int:
        if self._llm is not None:
            return int(self._llm.model_config.max_model_len)
        return self.config.max_model_len

    @property
    def generation_defaults(self) -> dict:
        """The served model's sampling defaults (generation_config.json: temperature,
        top_p, top_k, min_p, penalties), as vLLM's server reads them; {} before start."""
        return dict(self._generation_defaults)

    @property
    def vocab_size(self) -> int | None:
        return int(self._llm.model_config.get_vocab_size()) if self._llm is not None else None

    @property
    def per_request_seed(self) -> bool:
        """vLLM-CPU 0.32 cannot seed one request (its sampler needs a generator offset:
        "CPU Generator does not use offset"); the engine's global seed applies there."""
        return not cpu_only()

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            tok = self._llm.tokenizer if self._llm is not None else None
            if tok is None:
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(self.config.model)
            self._tokenizer = tok
        return self._tokenizer

    def _require(self):
        if self._llm is None:
            raise EngineNotReady("engine not started")
        return self._llm

    # ------------------------------------------------------------------ requests
    async def generate(self, request_id: str, prompt: str | list[int], *, max_tokens: int, temperature: float = 0.0,
                       top_p: float = 1.0, stop: list[str] | None = None, level: int, ttft_slo: float,
                       tpot_slo: float, predicted_output_len: int, arrival: float | None = None,
                       **sampling: Any) -> AsyncIterator[TokenEvent]:
        """`sampling`: further SamplingParams keywords (`SAMPLING_KEYS`). A `seed` is
        dropped where `per_request_seed` is false (said once in the log)."""
        llm = self._require()
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        unknown = set(sampling) - SAMPLING_KEYS
        if unknown:
            raise TypeError(f"generate() got sampling keywords it does not pass to vLLM: {sorted(unknown)}")
        if sampling.get("seed") is not None and not self.per_request_seed:
            sampling.pop("seed")
            if not self._seed_warned:
                self._seed_warned = True
                log.warning("per-request seed ignored: vLLM-CPU cannot seed one request (\"CPU Generator does "
                            "not use offset\"); the engine's global seed %s applies", self.config.seed)
        xa = {"id": request_id, "level": int(level), "ttft_slo": float(ttft_slo), "tpot_slo": float(tpot_slo),
              "predicted_output_len": int(predicted_output_len)}
        if arrival is not None:
            xa["arrival"] = float(arrival)
        sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop or None,
                            output_kind=RequestOutputKind.DELTA, extra_args={"triage": xa}, **sampling)
        p: Any = {"prompt_token_ids": list(prompt)} if not isinstance(prompt, str) else prompt
        n_out = 0
        async for out in llm.generate(p, sp, request_id, priority=int(level)):
            now = time.time()
            c = out.outputs[0] if out.outputs else None
            ids = list(c.token_ids) if c is not None else []
            n_out += len(ids)
            yield TokenEvent(
                request_id=request_id, text=c.text if c is not None else "", token_ids=ids, time=now,
                finished=bool(out.finished), finish_reason=(c.finish_reason if c is not None else None),
                prompt_tokens=len(out.prompt_token_ids or ()), output_tokens=n_out,
            )

    async def abort(self, request_id: str) -> None:
        await self._require().abort(request_id)

    async def reset_prefix_cache(self) -> bool:
        """Empty vLLM's prefix cache (False, nothing changed, while requests hold blocks)."""
        return bool(await self._require().reset_prefix_cache())

    # ------------------------------------------------------------------ control channel
    async def _control(self, op: str, payload: Any = None) -> Any:
        llm = self._require()
        if not self.config.scheduler_cls:
            raise RuntimeError("relabels, class edits and statistics need our scheduler class")
        return await llm.engine_core.call_utility_async("triage_control", op, payload)

    async def _learnt(self) -> dict | None:
        """The serving scheduler's online step-time corrections (None without our class)."""
        if self.config.scheduler_cls != SCHEDULER_CLS or self._llm is None:
            return None
        try:
            return await self._control("learnt")
        except Exception:   # a dead engine: nothing to keep
            return None

    async def _set_learnt(self, learnt: dict | None) -> None:
        if learnt is None or self._llm is None:
            return
        try:
            await self._control("set_learnt", learnt)
        except Exception as e:   # the engine died meanwhile: its successor starts afresh
            log.info("step-time corrections not put back after the standby build: %s", e)

    async def relabel(self, request_id: str, level: int) -> None:
        """Re-key `request_id` at `level`; the scheduler applies it at its next step."""
        await self._control("relabel", {"id": request_id, "level": int(level)})

    async def set_classes(self, classes) -> None:
        d = classes.to_dict() if hasattr(classes, "to_dict") else dict(classes)
        await self._control("set_classes", d)

    async def refresh_stats(self) -> dict:
        self._stats = dict(await self._control("stats"))
        self._stats["fetched_at"] = time.time()
        return self._stats

    async def recorded_steps(self) -> list[dict]:
        """The scheduler's last `record_steps` (plan, scheduled) pairs."""
        return list(await self._control("steps"))

    async def _poll_stats(self) -> None:
        while True:
            await asyncio.sleep(self.config.stats_interval_s)
            try:
                await self.refresh_stats()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the engine died or is shutting down
                log.warning("engine stats poll failed: %s", e)
                return

    def step_stats(self) -> dict:
        """The scheduler's counters as of the last poll (every `stats_interval_s`):
        steps, last step time, plan mismatches and repairs, preemptions, estimator error;
        `unfinished`: requests vLLM's front end still holds (now; 0 when idle: nothing leaks)."""
        out = dict(self._stats)
        if self._llm is not None:
            out["unfinished"] = int(self._llm.get_num_unfinished_requests())
        return out
