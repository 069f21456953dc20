"""The backend interface the front-end loop drives.

A backend receives requests the front-end admitted (already classified and ordered) and
streams `TokenEvent`s back; which request runs in each engine step is decided inside the
backend by the engine-level policy. Relabels and class edits take effect at its next
step. A backend never decides the admission order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol, runtime_checkable

from triage.classes import PriorityClasses


@dataclass
class TokenEvent:
    """Same fields as `serving.engine.TokenEvent` (the vLLM backend passes those through)."""

    request_id: str
    text: str                       # new text since the previous event
    token_ids: list[int]            # new token ids since the previous event
    time: float
    finished: bool = False
    finish_reason: str | None = None   # stop | length | abort
    prompt_tokens: int = 0
    output_tokens: int = 0          # cumulative
    preemptions: int = 0


@dataclass
class GenRequest:
    request_id: str
    prompt: str
    max_tokens: int
    level: int
    ttft_slo: float
    tpot_slo: float
    predicted_output_len: int
    arrival: float                  # time.time() of arrival at the front-end
    prompt_tokens: int = 0
    # vLLM `SamplingParams` keywords (max_tokens apart), filled by the API from the request
    # and the served model's generation defaults (`_Generation.sampling`): temperature,
    # top_p, top_k, min_p, repetition/presence/frequency_penalty, stop, stop_token_ids,
    # ignore_eos, min_tokens, include_stop_str_in_output, skip_special_tokens,
    # spaces_between_special_tokens, and where set logit_bias and seed.
    sampling: dict = field(default_factory=dict)
    # vLLM's per-request `stream_interval` (tokens a streamed chunk); None: every token.
    # Decided by the front end (`stream_interval` below), passed on by each backend
    stream_interval: int | None = None


def stream_interval(setting: int, level: int, classes: PriorityClasses, tpot_slo: float,
                    token_s: float | None) -> int | None:
    """The chunk size for a call at `level` (setting `stream_interval`): None (every token) at
    the most urgent level or when the setting is 1; else the setting, cut so that a chunk
    takes at most half the call's TPOT SLO at the engine's measured time a token `token_s`
    (None: not measured yet). Fewer chunks cost the engine's output path, the instances'
    HTTP servers and the front end less CPU a token (docs/measurements/cluster.md); the first and the last
    token always go at once (vLLM)."""
    if setting <= 1 or level <= classes.most_urgent:
        return None
    k = setting if not token_s else min(setting, int(tpot_slo / (2 * token_s)))
    return k if k > 1 else None


class BackendRefused(RuntimeError):
    """A backend cannot do what an operator asked in its present setup; the message says
    why (the API answers 409 with it)."""


@runtime_checkable
class Backend(Protocol):
    name: str
    instance: str

    @property
    def ready(self) -> bool: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def sampling_defaults(self) -> dict:
        """The served model's request defaults (generation_config.json), read at start."""
        ...

    @property
    def vocab_size(self) -> int | None:
        """Token ids a request may name are below this; None: no vocabulary (simulated)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def count_tokens(self, text: str) -> int: ...

    def render_chat(self, messages: list[dict]) -> str: ...

    def generate(self, req: GenRequest) -> AsyncIterator[TokenEvent]: ...

    async def abort(self, request_id: str) -> None: ...

    async def relabel(self, request_id: str, level: int) -> None: ...

    async def set_classes(self, classes: PriorityClasses) -> None: ...

    async def reset_prefix_cache(self) -> bool:
        """Empty the engine's prefix cache; False (nothing changed) while requests hold blocks."""
        ...

    def step_stats(self) -> dict: ...
