"""The simulated backend: no model, a latency profile, the live policy, real time.

It drives `triage.sim.simulator.Instance` (the simulator's engine instance, with the very
policy objects the vLLM plugin uses) on a wall clock: each step plans with the policy,
executes the plan against the profile's latency model (with its noise), sleeps the
modelled step time (divided by `sim_speed`), then emits the tokens that step produced.
Generated text is filler words. Token counts are an estimate, not a tokenizer:
max(whitespace words, characters / 4).

How long an answer is: the simulated model "ends its answer" (finish reason `stop`) at the
request's predicted output length (the length head's estimate), raised to `min_tokens`;
`max_tokens` cuts it short (`length`); with `ignore_eos` it runs to `max_tokens` exactly,
as vLLM does (what `vllm bench serve` asks for). The other sampling fields have no text
to act on and are accepted without effect.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import AsyncIterator

import numpy as np

from serving.backends.base import GenRequest, TokenEvent
from serving.model_prep import served_sampling_defaults
from serving.tasks import cancel_and_wait
from triage.classes import PriorityClasses
from triage.profiles import DEFAULT_PROFILE, load_profile
from triage.request import Request
from triage.sim.simulator import Instance

log = logging.getLogger(__name__)

WORDS = ("the patient is stable and the team is on the way please stay on the line "
         "keep the airway clear monitor breathing and report any change").split()


class SimulatedBackend:
    name = "simulated"

    def __init__(self, settings, classes: PriorityClasses, metrics=None) -> None:
        self.settings = settings
        self.profile = load_profile(settings.profile or DEFAULT_PROFILE)
        self.classes = classes
        self.metrics = metrics
        self.speed = float(settings.sim_speed)
        self.instance = f"sim-{self.profile.name}-0"
        self._max_model_len = min(int(settings.max_model_len), self.profile.limits.max_model_len)
        self.inst: Instance | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._max_tokens: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._t0 = 0.0
        self._seq = 0
        self._ready = False
        self.steps = 0
        self.step_times: list[float] = []
        self.est_errors: list[float] = []

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready and self._task is not None and not self._task.done()

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def sampling_defaults(self) -> dict:
        """The default model's generation defaults (no model directory is read)."""
        return served_sampling_defaults()

    @property
    def vocab_size(self) -> int | None:
        return None

    async def start(self) -> None:
        # the profile's options for the policy, then the operator's (as the vLLM plugin does)
        policy = self.profile.make_policy(self.settings.policy, **self.settings.policy_params)
        self.inst = Instance(policy, self.profile, self.classes, np.random.default_rng(self.settings.sim_seed),
                             index=0)
        self._t0 = time.monotonic()
        self._task = asyncio.create_task(self._loop(), name="simulated-backend")
        self._ready = True
        log.info("simulated backend ready: profile %s, policy %s, speed x%g", self.profile.name, policy.name, self.speed)

    async def stop(self) -> None:
        self._ready = False
        await cancel_and_wait(self._task)
        self._task = None
        for q in self._queues.values():
            q.put_nowait(None)

    # --- text ------------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return max(len(text.split()), math.ceil(len(text) / 4), 1)

    def render_chat(self, messages: list[dict]) -> str:
        return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"

    # --- clock -----------------------------------------------------------------------------
    def _sim_now(self) -> float:
        return (time.monotonic() - self._t0) * self.speed

    # --- requests --------------------------------------------------------------------------
    @staticmethod
    def output_len(req: GenRequest) -> int:
        """Tokens the simulated model produces for `req` (see the module docstring)."""
        cap = max(1, req.max_tokens)
        if req.sampling.get("ignore_eos"):
            return cap
        natural = max(1, req.predicted_output_len, int(req.sampling.get("min_tokens") or 0))
        return min(natural, cap)

    async def generate(self, req: GenRequest) -> AsyncIterator[TokenEvent]:
        assert self.inst is not None, "backend not started"
        st = self.inst.state
        c = self.classes.get(req.level)
        self._seq += 1
        r = Request(id=req.request_id, arrival=self._sim_now() - (time.time() - req.arrival) * self.speed,
                    prompt_len=max(1, req.prompt_tokens), predicted_level=req.level, ttft_slo=req.ttft_slo,
                    tpot_slo=req.tpot_slo, weight=c.weight, predicted_output_len=max(1, req.predicted_output_len),
                    output_len=self.output_len(req), seq=self._seq)
        q: asyncio.Queue = asyncio.Queue()
        self._queues[r.id] = q
        self._max_tokens[r.id] = max(1, req.max_tokens)
        st.add(r)
        self._wake.set()
        try:
            while True:
                ev = await q.get()
                if ev is None:
                    return
                yield ev
                if ev.finished:
                    return
        finally:
            self._queues.pop(r.id, None)
            self._max_tokens.pop(r.id, None)
            if r.id in st.requests:
                st.remove(r.id)

    async def abort(self, request_id: str) -> None:
        st = self.inst.state
        if request_id in st.requests:
            st.remove(request_id)
        q = self._queues.get(request_id)
        if q is not None:
            q.put_nowait(TokenEvent(request_id, "", [], time.time(), True, "abort"))

    async def reset_prefix_cache(self) -> bool:
        return True   # the simulated engine models no prefix cache: it is always empty

    async def relabel(self, request_id: str, level: int) -> None:
        st = self.inst.state
        if request_id in st.requests:
            st.relabel(request_id, level)

    async def set_classes(self, classes: PriorityClasses) -> None:
        self.classes = classes
        self.inst.state.set_classes(classes)

    def step_stats(self) -> dict:
        st = self.inst.state if self.inst else None
        return {"steps": self.steps, "waiting": len(st.waiting) if st else 0, "running": len(st.running) if st else 0,
                "mean_step_s": float(np.mean(self.step_times[-200:])) if self.step_times else None}

    # --- the step loop ---------------------------------------------------------------------
    async def _loop(self) -> None:
        inst = self.inst
        st = inst.state
        while True:
            if not st.requests:
                self._wake.clear()
                await self._wake.wait()
                continue
            inst.now = max(inst.now, self._sim_now())
            plan = inst.policy.plan(st, inst.now)
            if not plan.tokens:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass
                continue
            before = {rid: st.requests[rid].generated for rid in plan.tokens}
            reqs = {rid: st.requests[rid] for rid in plan.tokens}
            t_start = inst.now
            inst.step(plan)
            dt = inst.now - t_start
            self.steps += 1
            self.step_times.append(dt)
            if self.metrics is not None:
                self.metrics.step_time.observe(dt)
                if plan.predicted_s and dt > 0:
                    self.metrics.estimator_error.observe(abs(dt - plan.predicted_s) / dt)
            wall_left = (t_start + dt) / self.speed - (time.monotonic() - self._t0)
            if wall_left > 0:
                await asyncio.sleep(wall_left)
            now = time.time()
            for rid, r in reqs.items():
                q = self._queues.get(rid)
                if q is None or r.generated == before[rid]:
                    continue
                n = r.generated
                text = "".join((" " if i else "") + WORDS[(hash(rid) + i) % len(WORDS)] for i in range(before[rid], n))
                done = r.finished
                reason = None
                if done:
                    reason = "length" if n >= self._max_tokens.get(rid, n) else "stop"
                q.put_nowait(TokenEvent(rid, text, list(range(before[rid], n)), now, done,
                                        reason, r.prompt_len, n, r.preemptions))
