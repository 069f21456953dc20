"""The policy interface and the registry.

    plan(view, now) -> BatchPlan

`view` is an `EngineState` (read it, never mutate it): waiting requests in arrival
order, running requests in admission order, the KV pool, the latency estimator, the
class table and the batch limits. A plan lists {request id: tokens this step} in the
policy's order plus preemptions; the caller (simulator or vLLM plugin) applies it.
Policies are deterministic: the same view gives the same plan.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from triage.plan import BatchPlan
from triage.registry import make_registry
from triage.state import EngineState

SchedulerView = EngineState


class Policy(ABC):
    name: ClassVar[str]
    # Whom a waiting request waits behind, as far as a router needs to know: "arrival"
    # (everything queued before it) or "level" (mainly requests at least as urgent; the
    # class-weighted and priority policies). GoRouting models an instance's queue this way.
    queue_order: ClassVar[str] = "arrival"

    @abstractmethod
    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        """Decide this step's batch."""


POLICIES, register = make_registry("policy")
