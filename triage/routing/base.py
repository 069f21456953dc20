"""The router interface, for simulated and live instances alike.

A router sees each instance through `InstanceLoad` (the few numbers a global scheduler
can know about an engine) and picks where a new request goes:

    route(req, pool, now)            -> index into pool          (co-located: one pool)
    route_pd(req, prefill, decode, now) -> (prefill index, decode index)   (disaggregated)

and hears back about the request's life (`on_dispatch`, `on_first_token`, `on_finish`),
which is how GoRouting keeps its PrefillQueueMap and decode counters without reading the
engines' queues. Routers are deterministic: ties break on the instance index and any
randomness comes from the router's own seeded generator.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Protocol, Sequence

import numpy as np

from triage.estimators import LatencyEstimator
from triage.registry import make_registry
from triage.request import Request
from triage.state import EngineState


class InstanceLoad(Protocol):
    index: int                 # position in the cluster (stable)
    role: str                  # "mixed" (co-located), "prefill" or "decode"
    estimator: LatencyEstimator

    @property
    def n_waiting(self) -> int: ...
    @property
    def n_running(self) -> int: ...
    @property
    def n_decoding(self) -> int: ...
    @property
    def free_blocks(self) -> int: ...
    @property
    def prefill_tokens(self) -> int: ...        # tokens still to prefill (waiting + running prefills)
    def decodes(self, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...  # (slack, context, tpot)
    def prefills(self, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...  # (slack, prompt, tpot)
    # optional: `seats` (int | None), the instance's max_num_seqs where known (gorouting's seat_aware),
    # `waiting_calls(now)` -> [(id, level, slack, waited s, predicted tokens)], its queued calls not
    # started, and `output_tokens_left`, the predicted output tokens of all its calls (rebalance.py)


class StateLoad:
    """`InstanceLoad` read off an `EngineState` (the simulator's, or an engine's mirror)."""

    def __init__(self, index: int, state: EngineState, role: str = "mixed") -> None:
        self.index = index
        self.state = state
        self.role = role

    @property
    def estimator(self) -> LatencyEstimator:
        return self.state.estimator

    @property
    def seats(self) -> int:
        return self.state.limits.max_num_seqs

    @property
    def n_waiting(self) -> int:
        return len(self.state.waiting)

    @property
    def n_running(self) -> int:
        return len(self.state.running)

    @property
    def n_decoding(self) -> int:
        return sum(1 for r in self.state.running if r.need == 1 and r.generated > 0)

    @property
    def free_blocks(self) -> int:
        return self.state.kv.free_blocks

    @property
    def prefill_tokens(self) -> int:
        cols = self.state.columns.view()
        return int(cols["need"].sum()) + sum(r.need for r in self.state.running if r.need > 1)

    def decodes(self, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        d = [(r.next_deadline - now, r.computed, r.tpot_slo) for r in self.state.running if r.need == 1 and r.generated > 0]
        a = np.array(d, dtype=float).reshape(len(d), 3)
        return a[:, 0], a[:, 1], a[:, 2]

    def waiting_calls(self, now: float) -> list[tuple[str, int, float, float, int]]:
        """Queued requests nothing has been computed for: (id, level, first-token slack,
        seconds since they were queued here, predicted output tokens)."""
        return [(r.id, r.level, r.next_deadline - now, now - r.arrival, r.remaining_output) for r in self.state.waiting
                if r.computed == 0 and r.generated == 0]

    @property
    def output_tokens_left(self) -> int:
        """Predicted output tokens still to come over the requests here."""
        return sum(r.remaining_output for r in self.state.requests.values())

    def prefills(self, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unfinished prefills (running chunks, then waiting): first-token slack, prompt
        (the context they will decode at), TPOT SLO."""
        run = [(r.next_deadline - now, r.prompt_len, r.tpot_slo) for r in self.state.running
               if not (r.need == 1 and r.generated > 0)]
        a = np.array(run, dtype=float).reshape(len(run), 3)
        cols = self.state.columns.view()
        return (np.concatenate([a[:, 0], cols["deadline"] - now]),
                np.concatenate([a[:, 1], cols["computed"] + cols["need"]]),
                np.concatenate([a[:, 2], cols["tpot"]]))


class Router(ABC):
    name: ClassVar[str]

    @abstractmethod
    def route(self, req: Request, pool: Sequence[InstanceLoad], now: float) -> int:
        """Index (into `pool`) of the instance that gets `req`, or REJECT (a router with
        admission control turns the request away: it counts as an SLO miss)."""

    def route_pd(self, req: Request, prefill: Sequence[InstanceLoad], decode: Sequence[InstanceLoad],
                 now: float) -> tuple[int, int]:
        return self.route(req, prefill, now), self.pick_decode(req, decode, now)

    def pick_decode(self, req: Request, decode: Sequence[InstanceLoad], now: float) -> int:
        """Seed 000 §4.3: the decode instance with the most free KV blocks."""
        return max(range(len(decode)), key=lambda i: (decode[i].free_blocks, -i))

    def bind_policy(self, policy) -> None:
        """Told the local scheduler the instances run (its `queue_order`) before routing starts."""

    # lifecycle notifications (instance = the instance's `index`)
    def on_dispatch(self, req: Request, instance: int, now: float, load: "InstanceLoad | None" = None) -> None: ...
    def on_first_token(self, req: Request, instance: int, now: float) -> None: ...
    def on_finish(self, req: Request, instance: int, now: float) -> None: ...

    def describe(self) -> dict:
        return {"name": self.name, **{k: v for k, v in vars(self).items() if not k.startswith("_")}}


REJECT = -1     # route(): no instance admits the request (seed 002 FB-PAB admission control)

ROUTERS, register = make_registry("router")
