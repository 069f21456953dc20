"""Request bodies. Unknown fields are refused (400), so typos never pass silently.

The generation bodies take OpenAI's fields plus vLLM 0.32's sampling extensions with the
names, defaults and ranges of vLLM's own server (`vllm.entrypoints.openai.*.protocol`), so
vLLM's clients (`vllm bench serve`, scripts written against `vllm serve`) work unchanged.
What the service cannot honour is refused with a 400 naming the field: `logprobs`,
`top_logprobs` > 0, `prompt_logprobs`, `use_beam_search: true`, and `vllm_xargs` (the
service sets the engine's per-request `extra_args` itself; a client may not).
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def bad_text(v: Any, path: str = "", depth: int = 0) -> str | None:
    """The first string in a JSON value that no database or tokenizer takes safely: a NUL
    character (PostgreSQL text refuses it) or an unpaired UTF-16 surrogate (not Unicode:
    it cannot be encoded as UTF-8). None when all strings are clean."""
    if isinstance(v, str):
        if "\x00" in v:
            return f"{path or 'body'}: contains a NUL character"
        if any("\ud800" <= ch <= "\udfff" for ch in v):
            return f"{path or 'body'}: contains an unpaired surrogate (not valid Unicode)"
        return None
    if depth > 32:
        return None   # deeper values are refused by the models' own types
    if isinstance(v, dict):
        items = v.items()
    elif isinstance(v, list):
        items = enumerate(v)
    else:
        return None
    for k, x in items:
        sub = f"{path}.{k}" if path else str(k)
        why = bad_text(k, sub, depth + 1) if isinstance(k, str) else None
        why = why or bad_text(x, sub, depth + 1)
        if why:
            return why
    return None


class Strict(BaseModel):
    # strict: JSON types as the schema says them (no true for an integer, no 1 for a
    # boolean, no "0.5" for a number); unknown fields refused
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _clean_text(cls, v):
        why = bad_text(v)
        if why:
            raise ValueError(why)
        return v


class SLO(Strict):
    ttft_ms: float | None = Field(None, gt=0, le=3_600_000)
    tpot_ms: float | None = Field(None, gt=0, le=600_000)


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(Strict):
    # as vLLM's server: null means false; continuous_usage_stats (with include_usage) puts the
    # usage so far in every chunk
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


# vLLM's neutral values of the sampling fields a model's generation_config.json may
# default (vLLM 0.32 `ChatCompletionRequest._DEFAULT_SAMPLING_PARAMS`). A request's own
# value wins, then the served model's default, then these.
NEUTRAL_SAMPLING = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
INT64 = (-(2 ** 63), 2 ** 63 - 1)
LOGIT_BIAS_MAX = 100.0     # vLLM clamps each bias to [-100, 100]
TokenId = Annotated[int, Field(ge=0)]


def _finite(v: float | None) -> float | None:
    if v is not None and not math.isfinite(v):
        raise ValueError("must be a finite number")
    return v


class _Generation(Strict):
    model: str | None = None
    max_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0, le=2, description="default: the served model's (0.2)")
    top_p: float | None = Field(None, gt=0, le=1, description="default: the served model's (0.9)")
    n: int = Field(1, ge=1, le=1, description="only n=1 is served")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=INT64[0], le=INT64[1])
    user: str | None = Field(None, max_length=256)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(None, description="token id -> bias, clamped to [-100, 100]")
    top_logprobs: Literal[0] | None = Field(None, description="only 0: log probabilities are not returned")
    # vLLM's sampling extensions (same names, defaults and ranges as vLLM 0.32's server)
    top_k: int | None = Field(None, ge=-1, description="0 or -1: off")
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    length_penalty: float = Field(1.0, description="beam search only (not served): accepted, no effect")
    use_beam_search: Literal[False] = Field(False, description="only false: beam search is not served")
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    prompt_logprobs: None = Field(None, description="not supported")
    vllm_xargs: None = Field(None, description="refused: the service sets the engine's extra_args itself")
    # Triage's extra fields
    priority: int | None = Field(None, description="ESI level; honoured for operator keys only")
    slo: SLO | None = None
    client_request_id: str | None = Field(None, min_length=1, max_length=128)

    @field_validator("repetition_penalty", "length_penalty")
    @classmethod
    def _is_finite(cls, v):
        return _finite(v)

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, v):
        if v is not None and any(not s for s in ([v] if isinstance(v, str) else v)):
            raise ValueError("stop cannot contain an empty string")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys(cls, v):
        for k, b in (v or {}).items():
            try:
                int(k)
            except ValueError:
                raise ValueError(f"key {k!r} is not a token id") from None
            _finite(b)
        return v

    @field_validator("top_logprobs", mode="before")
    @classmethod
    def _no_top_logprobs(cls, v):
        if isinstance(v, bool):
            raise ValueError("must be an integer")
        if v:
            raise ValueError("log probabilities are not supported by this service")
        return v

    @field_validator("prompt_logprobs", mode="before")
    @classmethod
    def _no_prompt_logprobs(cls, v):
        if v is not None:
            raise ValueError("prompt log probabilities are not supported by this service")
        return v

    @field_validator("use_beam_search", mode="before")
    @classmethod
    def _no_beam_search(cls, v):
        if v:
            raise ValueError("beam search is not supported by this service")
        return v

    @field_validator("vllm_xargs", mode="before")
    @classmethod
    def _no_xargs(cls, v):
        if v is not None:
            raise ValueError("not accepted from clients: the service sets the engine's per-request extra_args "
                             "(level, SLOs, predicted length) from its own classification")
        return v

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def token_ids(self) -> dict[str, list[int]]:
        """The token ids the body names, by field (checked against the vocabulary)."""
        return {"stop_token_ids": list(self.stop_token_ids or []),
                "logit_bias": sorted(int(k) for k in (self.logit_bias or {}))}

    def sampling(self, defaults: Mapping[str, Any]) -> dict[str, Any]:
        """vLLM `SamplingParams` keywords for this request (max_tokens apart). For the
        fields of `NEUTRAL_SAMPLING`: the request's value, else the served model's default
        (`defaults`, from its generation_config.json), else vLLM's neutral value."""
        out: dict[str, Any] = {}
        for k, neutral in NEUTRAL_SAMPLING.items():
            v = getattr(self, k)
            out[k] = v if v is not None else defaults.get(k, neutral)
        out.update(stop=self.stops(), stop_token_ids=list(self.stop_token_ids or []), ignore_eos=self.ignore_eos,
                   min_tokens=self.min_tokens, include_stop_str_in_output=self.include_stop_str_in_output,
                   skip_special_tokens=self.skip_special_tokens,
                   spaces_between_special_tokens=self.spaces_between_special_tokens)
        if self.logit_bias:
            out["logit_bias"] = {int(k): max(-LOGIT_BIAS_MAX, min(LOGIT_BIAS_MAX, b))
                                 for k, b in self.logit_bias.items()}
        if self.seed is not None:
            out["seed"] = self.seed
        return out


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, gt=0)
    logprobs: Literal[False] | None = Field(None, description="only false: log probabilities are not returned")

    @field_validator("logprobs", mode="before")
    @classmethod
    def _no_logprobs(cls, v):
        if v is not None and not isinstance(v, bool):
            raise ValueError("must be a boolean")
        if v:
            raise ValueError("log probabilities are not supported by this service")
        return v

    @field_validator("messages")
    @classmethod
    def _non_empty(cls, v: list[ChatMessage]) -> list[ChatMessage]:
        for i, m in enumerate(v):
            if not m.text().strip():
                raise ValueError(f"message {i} has empty content")
        if not any(m.role == "user" for m in v):
            raise ValueError("at least one user message is required")
        return v


class CompletionRequest(_Generation):
    prompt: str | list[str]
    logprobs: None = Field(None, description="not supported: log probabilities are not returned")

    @field_validator("logprobs", mode="before")
    @classmethod
    def _no_logprobs(cls, v):
        if v is not None:
            raise ValueError("log probabilities are not supported by this service")
        return v

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("exactly one prompt per request")
            v = v[0]
        if not v.strip():
            raise ValueError("prompt is empty")
        return v


class TriageRequest(Strict):
    text: str | None = Field(None, min_length=1)
    messages: list[ChatMessage] | None = Field(None, min_length=1)


class RelabelBody(Strict):
    level: int
    reason: str = Field(..., min_length=1, max_length=2000)


class ClassBody(Strict):
    level: int = Field(..., ge=1, le=99)
    name: str = Field(..., min_length=1, max_length=64)
    weight: float = Field(..., gt=0)
    ttft: float = Field(..., gt=0, description="seconds")
    tpot: float = Field(..., gt=0, description="seconds")


class ClassesBody(Strict):
    classes: list[ClassBody] = Field(..., min_length=1)
    w_first: float | None = Field(None, gt=0)
    w_decode: float | None = Field(None, gt=0)
    version: int | None = None   # ignored on input: the server assigns the next version
    escalate_below: float | None = Field(None, gt=0, le=1, description=(
        "the urgency model's escalation threshold: raise a call to level 1 or 2 when P(level 1-2) reaches it "
        "(omitted: unchanged)"))
    reason: str | None = Field(None, max_length=2000, description="why this version (shown in the history)")


class RollbackBody(Strict):
    version: int = Field(..., ge=1)
    reason: str | None = Field(None, max_length=2000)


class KeyCreateBody(Strict):
    role: Literal["client", "operator", "auditor", "admin"]
    name: str | None = Field(None, max_length=128, description="a note for people (not secret)")
