"""What a policy returns: a plan is {request id: tokens this step} plus preemptions.

`tokens` keeps the policy's order (dict insertion order). A preemption frees the victim's
device blocks before anything is allocated; `keep_tokens > 0` means offload that many
tokens of KV to host memory (seed 004 cache-or-recompute), 0 means recompute.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Preemption:
    request_id: str
    keep_tokens: int = 0
    reason: str = ""                 # why: "seat" (max_num_seqs) or "kv" (blocks) for ...
    for_request: str | None = None   # ... this request (None: the victim itself ran out)

    @property
    def mode(self) -> str:
        return "offload" if self.keep_tokens > 0 else "recompute"


@dataclass(slots=True)
class BatchPlan:
    tokens: dict[str, int] = field(default_factory=dict)
    preemptions: list[Preemption] = field(default_factory=list)
    budget_s: float | None = None        # the time budget the policy aimed at (None: token budget only)
    predicted_s: float = 0.0             # estimator's step time for this plan
    stop: str = "queue"                  # why adding stopped: queue | tokens | time | memory | seats

    def __bool__(self) -> bool:
        return bool(self.tokens) or bool(self.preemptions)

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens.values())
