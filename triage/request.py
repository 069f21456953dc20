"""The request: everything a policy may read about one request.

Token accounting follows vLLM v1 so the engine plugin mirrors it exactly:
`known = prompt_len + generated` tokens exist; `computed` of them have KV in cache.
A step that brings `computed` up to `known` samples one new token (emitted at the end
of that step). After an emission `computed == known - 1`, so a decode step is 1 token.
A preemption that recomputes sets `computed` to 0 (vLLM's recompute preemption).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Stage(IntEnum):
    """Ordered like vLLM's RequestStatus: everything after DECODING is not running."""

    WAITING = 0      # never scheduled
    PREFILLING = 1   # running, prompt (or recomputation) not done
    DECODING = 2     # running, one token per step
    PREEMPTED = 3    # was running, back in the waiting queue
    FINISHED = 4


class KVResidency(IntEnum):
    NONE = 0        # nothing computed yet
    DEVICE = 1      # blocks on the accelerator
    OFFLOADED = 2   # saved to host memory; reload instead of recompute
    DISCARDED = 3   # thrown away; recompute on resume


@dataclass(slots=True, eq=False)
class Request:
    id: str
    arrival: float
    prompt_len: int
    predicted_level: int
    ttft_slo: float
    tpot_slo: float
    weight: float = 1.0                  # class weight w_p(r), refreshed on relabel / class edit
    predicted_output_len: int = 128
    output_len: int | None = None        # the true length (simulator) or max_tokens (engine)
    override_level: int | None = None    # operator relabel
    seq: int = 0                         # arrival order: the final tie-breaker everywhere
    computed: int = 0
    generated: int = 0
    stage: Stage = Stage.WAITING
    kv: KVResidency = KVResidency.NONE
    offloaded_tokens: int = 0            # tokens whose KV sits in host memory
    preemptions: int = 0
    first_scheduled: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    instance: int = 0

    # --- levels -------------------------------------------------------------------------
    @property
    def level(self) -> int:
        """Effective level: the operator's override wins over the prediction."""
        return self.override_level if self.override_level is not None else self.predicted_level

    # --- tokens -------------------------------------------------------------------------
    @property
    def known(self) -> int:
        return self.prompt_len + self.generated

    @property
    def need(self) -> int:
        """Tokens to compute before the next token is sampled."""
        return self.known - self.computed

    @property
    def is_decoding(self) -> bool:
        return self.generated > 0 and self.need == 1

    @property
    def remaining_output(self) -> int:
        """Predicted output tokens still to come (at least 1 until finished)."""
        target = self.output_len_estimate
        return max(1, target - self.generated)

    @property
    def output_len_estimate(self) -> int:
        return max(self.predicted_output_len, self.generated + 1)

    @property
    def finished(self) -> bool:
        return self.stage is Stage.FINISHED

    # --- deadlines (seed 000 Eq. 3, seed 002 envelope) -----------------------------------
    def deadline(self, i: int) -> float:
        """Deadline of output token i (1-based): arrival + TTFT_slo + (i-1)·TPOT_slo."""
        return self.arrival + self.ttft_slo + (i - 1) * self.tpot_slo

    @property
    def next_deadline(self) -> float:
        return self.arrival + self.ttft_slo + self.generated * self.tpot_slo

    # --- measured latency -----------------------------------------------------------------
    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def tpots(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]
