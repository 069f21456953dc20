"""Seat stealing: a call waiting for a seat moves to an instance with one free (not in any
seed; the router places a call once, on predictions).

A router places each call when it arrives, on predicted answer lengths. When the real
lengths differ, one instance runs out of work while calls still wait for a seat on
another: at the end of a 196-call burst on two instances, the one that finished first
idled 1.4-4.6 s (docs/measurements/cluster.md), a few percent of the burst's throughput. Stock vLLM
behind a round robin has the same tail. Here, while an instance has a free seat and
nothing queued, a call that has waited at least `min_wait_s` on another instance without
starting (nothing computed, no token) moves to it: of those, first the call its instance
would serve last (least urgent, latest deadline), and only while a move lowers the larger
of the two instances' predicted output tokens still to come (the instance a call waits on
frees seats too, as its own calls finish: on 2026-11-28 a free instance took all 28 calls
waiting on its neighbour in one round, and the neighbour then idled 3.7 s while the thief
ran them; docs/measurements/cluster.md). It has cost nothing where it waited, so the move costs one
dispatch (if its instance admits it in the instant of the move, one prefill). A call moves
at most once.

    seat_moves(pool, now) -> [(call id, from instance, to instance), ...]

An instance offers its waiting calls through `waiting_calls(now)` (id, level, slack,
seconds waited there, predicted output tokens), its seats through `seats` and the
predicted output tokens still to come over all its calls through `output_tokens_left`; an
instance that reports no seats takes no part. The live remote backend
(serving/backends/remote.py) and the simulator (triage/sim/cluster.py) both call this
function and carry the moves out (abort and dispatch again; move between engine states).
"""
from __future__ import annotations

from typing import Sequence

from triage.routing.base import InstanceLoad


def free_seats(p: InstanceLoad) -> int | None:
    seats = getattr(p, "seats", None)
    if seats is None or p.role != "mixed":
        return None
    return int(seats) - p.n_running - p.n_waiting


MIN_WAIT_S = 0.5   # a call just sent is admitted at its instance's next step: leave it there


def seat_moves(pool: Sequence[InstanceLoad], now: float, moved: set[str] | frozenset = frozenset(),
               to: int | None = None, min_wait_s: float = MIN_WAIT_S) -> list[tuple[str, int, int]]:
    """The moves to make now. `moved`: ids already moved once (they stay). `to`: only moves
    onto the instance with this index (the simulator steals for the instance it steps)."""
    free = {p.index: f for p in pool if (f := free_seats(p)) is not None and f > 0 and p.n_waiting == 0
            and (to is None or p.index == to)}
    if not free:
        return []
    left = {p.index: int(getattr(p, "output_tokens_left", 0)) for p in pool}
    out: list[tuple[str, int, int]] = []
    for p in pool:
        if p.index in free or getattr(p, "seats", None) is None:
            continue
        calls = [c for c in getattr(p, "waiting_calls", lambda _now: [])(now) if c[0] not in moved and c[3] >= min_wait_s]
        for rid, _level, _slack, _waited, tokens in sorted(calls, key=lambda c: (c[1], c[2]), reverse=True):
            dst = min((i for i, f in free.items() if f > 0), key=lambda i: (left[i], i), default=None)
            if dst is None:
                return out
            if left[dst] + tokens >= left[p.index]:   # the move would not lower the busier one
                break
            out.append((rid, p.index, dst))
            free[dst] -= 1
            left[p.index] -= tokens
            left[dst] += tokens
    return out
