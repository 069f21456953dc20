"""Request bodies. Unknown fields are refused (400), so typos never pass silently."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    include_usage: bool = False


class _Generation(Strict):
    model: str | None = None
    max_tokens: int | None = Field(None, gt=0)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=1, description="only n=1 is served")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = Field(None, max_length=256)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    # Triage's extra fields
    priority: int | None = Field(None, description="ESI level; honoured for operator keys only")
    slo: SLO | None = None
    client_request_id: str | None = Field(None, min_length=1, max_length=128)

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_Generation):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, gt=0)

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
