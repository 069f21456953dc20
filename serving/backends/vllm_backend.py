"""The vLLM backend: `serving.engine.TriageEngine` (vLLM's AsyncLLM in process, our
scheduler class inside it). The front-end hands it admitted requests with their level,
SLOs and predicted length; relabels and class edits go through the engine's control
channel and apply at its next step. Token counts use the served model's tokenizer.
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

from serving.backends.base import GenRequest, TokenEvent
from serving.tasks import cancel_and_wait
from triage.classes import PriorityClasses

log = logging.getLogger(__name__)

ENGINE_PROFILE = "vllm-cpu-smollm2"
POLLED_COUNTERS = ("steps", "tokens", "preemptions")   # the scheduler's counters fed to /metrics


def engine_profile(name: str | None) -> str:
    """The latency profile the engine's scheduler uses: the one named, else the engine's
    own (`vllm-cpu-smollm2`) when it is shipped, else the core default, said in the log."""
    from triage.profiles import DEFAULT_PROFILE, profile_path

    if name:
        return name
    if profile_path(ENGINE_PROFILE).exists():
        return ENGINE_PROFILE
    log.warning("profile %s is not shipped yet; the engine's scheduler uses %s", ENGINE_PROFILE, DEFAULT_PROFILE)
    return DEFAULT_PROFILE


class VLLMBackend:
    name = "vllm"

    def __init__(self, settings, classes: PriorityClasses, metrics=None, engine=None) -> None:
        self.settings = settings
        self.classes = classes
        self.metrics = metrics
        self.engine = engine              # tests may share one started engine
        self._own_engine = engine is None
        self.instance = "vllm-0"
        self._poll: asyncio.Task | None = None
        self._last = dict.fromkeys(POLLED_COUNTERS, 0)   # the engine's counters at the last poll

    def _config(self):
        import psutil

        from serving.engine import EngineConfig, cpu_only, kv_offload_gib, standby_enabled

        s = self.settings
        kw = dict(max_model_len=s.max_model_len, max_num_seqs=s.max_num_seqs,
                  max_num_batched_tokens=s.max_num_batched_tokens, kv_cache_gib=s.kv_cache_gib, policy=s.policy,
                  classes=self.classes.to_dict(), step_log=str(s.step_log) if s.step_log else None,
                  policy_params=dict(s.policy_params), engine_nice=s.engine_nice, learn_shape=s.learn_step_shape,
                  enable_prefix_caching=s.prefix_caching, gc_freeze=s.gc_freeze,
                  enforce_eager=s.engine_enforce_eager)
        if s.model:
            kw["model"] = s.model
        kw["profile"] = engine_profile(s.profile)
        host_gib = psutil.virtual_memory().available / 2**30
        kw["kv_offload_gib"] = kv_offload_gib(s.kv_offload_gib, cpu=cpu_only(), host_available_gib=host_gib)
        kw["standby"] = standby_enabled(s.engine_standby, cpu=cpu_only(), host_available_gib=host_gib)
        if kw["kv_offload_gib"]:
            log.info("vLLM KV offloading: %.0f GiB of host memory", kw["kv_offload_gib"])
        return EngineConfig(**kw)

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.engine is not None and bool(self.engine.ready)

    @property
    def max_model_len(self) -> int:
        return int(self.engine.max_model_len) if self.engine is not None else int(self.settings.max_model_len)

    @property
    def sampling_defaults(self) -> dict:
        """The served model's generation_config.json defaults (read by the engine at start)."""
        return self.engine.generation_defaults if self.engine is not None else {}

    @property
    def vocab_size(self) -> int | None:
        return self.engine.vocab_size if self.engine is not None else None

    @property
    def standby_state(self) -> str:
        """The standby engine: off | building | ready | failed (serving.engine)."""
        return self.engine.standby_state if self.engine is not None else "off"

    @property
    def dead(self) -> bool:
        """The engine died on its own (core process killed, out of memory, EngineDeadError):
        the supervisor (serving/supervisor.py) restarts it."""
        return self.engine is not None and bool(self.engine.dead)

    @staticmethod
    def is_engine_failure(exc: BaseException) -> bool:
        """A request failed because the engine died, not because of the request: vLLM's
        EngineDeadError (told by name: the front end does not import vLLM) or ours while the
        engine is down."""
        return any(c.__name__ in ("EngineDeadError", "EngineNotReady") for c in type(exc).__mro__)

    async def restart(self) -> None:
        """Shut the dead engine down and start a new one with the same configuration; the
        class table in force (operators may have edited it) is handed to the new engine."""
        before = self.engine.standby_takeovers
        await self.engine.restart()
        if self.metrics is not None and self.engine.standby_takeovers > before:
            self.metrics.standby_takeovers.inc()
        await self.engine.set_classes(self.classes)

    async def start(self) -> None:
        if self.engine is None:
            from serving.engine import TriageEngine

            self.engine = TriageEngine(self._config())
        await self.engine.start()
        if not self._own_engine:
            await self.engine.set_classes(self.classes)   # a shared engine follows this service's table
        self._poll = asyncio.create_task(self._poll_stats(), name="vllm-stats")

    async def stop(self) -> None:
        await cancel_and_wait(self._poll)
        if self._own_engine and self.engine is not None:
            await self.engine.stop()

    # --- text ------------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self.engine.tokenizer.encode(text, add_special_tokens=False))

    def render_chat(self, messages: list[dict]) -> str:
        return self.engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    # --- requests --------------------------------------------------------------------------
    async def generate(self, req: GenRequest) -> AsyncIterator[TokenEvent]:
        # the request's sampling keywords over the model's defaults (the API has already
        # merged them; a GenRequest built elsewhere still gets the model's decoding)
        sampling = {**self.sampling_defaults, **req.sampling}
        if req.stream_interval is not None:
            sampling["stream_interval"] = req.stream_interval
        async for ev in self.engine.generate(
                req.request_id, req.prompt, max_tokens=req.max_tokens, level=req.level, ttft_slo=req.ttft_slo,
                tpot_slo=req.tpot_slo, predicted_output_len=req.predicted_output_len, arrival=req.arrival,
                **sampling):
            yield ev

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    async def relabel(self, request_id: str, level: int) -> None:
        await self.engine.relabel(request_id, level)

    async def reset_prefix_cache(self) -> bool:
        return await self.engine.reset_prefix_cache()

    async def set_classes(self, classes: PriorityClasses) -> None:
        self.classes = classes
        await self.engine.set_classes(classes)

    def step_stats(self) -> dict:
        return self.engine.step_stats() if self.engine is not None else {}

    async def _poll_stats(self) -> None:
        """Feed the engine's step counters into Prometheus every 0.5 s (`feed_stats`)."""
        while True:
            await asyncio.sleep(0.5)
            if self.metrics is None:
                continue
            self.metrics.standby_ready.set(1 if self.standby_state == "ready" else 0)
            self.feed_stats(self.step_stats())

    def feed_stats(self, st: dict) -> None:
        """One poll of the scheduler's counters into the Prometheus counters (steps, tokens
        computed, preemptions: ours and any vLLM made itself), each by its growth since the
        last poll, and a sample of the last step's time and the estimator's mean error when
        steps ran. A new engine (restart, standby takeover) counts from 0 again."""
        now = {"steps": int(st.get("steps") or 0), "tokens": int(st.get("tokens") or 0),
               "preemptions": int(st.get("preemptions") or 0) + int(st.get("vllm_preemptions") or 0)}
        if now["steps"] < self._last["steps"]:
            self._last = dict.fromkeys(POLLED_COUNTERS, 0)
        for key, counter in zip(POLLED_COUNTERS, (self.metrics.engine_steps, self.metrics.engine_tokens,
                                                  self.metrics.engine_preemptions)):
            if now[key] > self._last[key]:
                counter.inc(now[key] - self._last[key])
        ran = now["steps"] > self._last["steps"]
        self._last = now
        if ran:
            if st.get("last_step_s") is not None:
                self.metrics.step_time.observe(float(st["last_step_s"]))
            if st.get("estimator_ape_mean") is not None:
                self.metrics.estimator_error.observe(float(st["estimator_ape_mean"]))
