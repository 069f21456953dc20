"""`round_robin` and `min_load`: the baseline routers."""
from __future__ import annotations

from typing import Sequence

from triage.request import Request
from triage.routing.base import InstanceLoad, Router, register


@register("round_robin")
class RoundRobin(Router):
    """Instances in turn, whatever their load (prefill and decode pools each keep a turn)."""

    def __init__(self) -> None:
        self._next = 0
        self._next_d = 0

    def route(self, req: Request, pool: Sequence[InstanceLoad], now: float) -> int:
        i = self._next % len(pool)
        self._next += 1
        return i

    def pick_decode(self, req: Request, decode: Sequence[InstanceLoad], now: float) -> int:
        i = self._next_d % len(decode)
        self._next_d += 1
        return i


@register("min_load")
class MinLoad(Router):
    """vLLM's data-parallel load balancer: the smallest `waiting_weight · waiting + running`
    request count (vLLM weighs waiting requests 4×), ties to the lowest index."""

    def __init__(self, waiting_weight: float = 4.0) -> None:
        self.waiting_weight = waiting_weight

    def route(self, req: Request, pool: Sequence[InstanceLoad], now: float) -> int:
        w = self.waiting_weight
        return min(range(len(pool)), key=lambda i: (w * pool[i].n_waiting + pool[i].n_running, i))
