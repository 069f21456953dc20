"""`slidebatching`: ProServe's SlideBatching (seed 000 §4.2, Alg. 1).

    for r in Q:  r.exec    ← T~pd(r)                           (Eq. 4-6, whole remaining need)
                 r.remain  ← deadline(r, r.output_len+1) − now
                 r.density ← w_r(r.output_len+1) / r.exec
    t_budget ← max(min_r r.remain, η)
    r is URGENT  iff  r.remain < γ·φ(r, Q)
        φa(Q)    = t_budget/(t_budget − t_c) · Σ_{Q} exec                (Eq. 8, aggressive)
        φc(r, Q) = t_budget/(t_budget − t_c) · Σ_{i ≤ index(r)} exec     (Eq. 9, conservative,
                                                                            Q sorted by remain)
        φp(Q)    = Σ_{Q} exec + |Q|·t_c                                  (PD-disaggregated prefill)
    order: URGENT by density (desc), then NORMAL by remain (asc)
    while Q and t_batch < t_budget and memory is enough:
        r ← Q.pop();  t_batch += GETMAXCHUNK(r, t_budget − t_batch)

Ablations of §5.4 (Fig. 15): `partition="deadline"` (w/ only deadline: every request
NORMAL, ascending remain), `partition="density"` (w/ only density: every request URGENT,
descending density), `latency_aware=False` (w/o latency-aware: no time budget, the batch
is bounded by the instance's token budget only; φ still uses max(t_min, η)).

`decodes="always"`: every running decode joins the batch before the ordered queue is
walked, whatever its URGENT/NORMAL state and the time budget (it still needs its KV
block). Alg. 1 as printed sorts all of Q, running decodes included, so a decode ahead of
its deadline (NORMAL) waits behind every URGENT prefill (`decodes="queue"`, the default).
§4.3 (GoRouting, PD co-located) "assume[s] that decode requests are always included in
the batch (since their execution time is short and TPOT is typically small)", and §4.2
argues t_budget stays within [η, max TPOT_SLO] because a running request's remain is
below its TPOT SLO: both read as an engine that keeps decodes in every step. Measured
(docs/reproduction.md, seed 000, simulated): at high load the queue rule lets NORMAL
decodes burn their slack behind URGENT prefills until they miss; "always" moved TDG
0.8862 -> 0.8991 there (+2.6 and -0.2 points on two other seeds).

Q is every running and waiting request; the waiting side is read from the state's numpy
columns, so one plan at 1,000 waiting + 256 running is a few vector operations.
"""
from __future__ import annotations

import numpy as np

from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import BatchBuilder
from triage.request import Request


class QueueMetrics:
    """Alg. 1 lines 1-13 over Q = running ∪ waiting, as arrays aligned with `reqs`."""

    def __init__(self, view: SchedulerView, now: float, smooth: bool = False) -> None:
        est = view.estimator
        cat = view.joined()
        self.n_run = cat.n_run
        self.reqs: list[Request] = cat.reqs

        self.exec = est.beta * cat["exec_u"]
        deadline = cat["deadline"]
        if smooth:  # also keep every gap under TPOT: min(envelope, last token + TPOT_slo)
            deadline = np.fmin(deadline, cat["last_token"] + cat["tpot"])
        self.level = cat["level"]
        self.tpot = cat["tpot"]
        self.seq = cat["seq"]
        self.need = cat["need"]
        self.remain = deadline - now
        self.density = cat["wnext"] / np.maximum(self.exec, 1e-9)
        self.t_c = est.beta * est.t_c
        self._cat = cat

    def remaining_times(self, est) -> np.ndarray:
        """Seed 004's f_t for the running rows: rest of the need, then the decodes left."""
        rem_out = self._cat.running("rem_out")
        dec = est.request_times(np.ones_like(rem_out), self._cat.running("known") + rem_out // 2)
        return self.exec[: self.n_run] + np.maximum(rem_out - 1, 0) * dec

    def __len__(self) -> int:
        return len(self.reqs)

    def budget(self, eta: float) -> float:
        return max(float(self.remain.min()), eta)

    def phi(self, kind: str, t_budget: float) -> np.ndarray | float:
        scale = t_budget / (t_budget - self.t_c) if t_budget > self.t_c else np.inf
        if kind == "a":
            return scale * float(self.exec.sum())
        if kind == "c":
            order = np.lexsort((self.seq, self.remain))
            out = np.empty(len(self.reqs))
            out[order] = scale * np.cumsum(self.exec[order])
            return out
        if kind == "p":
            return float(self.exec.sum()) + len(self.reqs) * self.t_c
        raise ValueError(f"unknown load-judgment function phi_{kind} (a, c, p)")

    def order(self, urgent: np.ndarray) -> np.ndarray:
        """URGENT first by density (desc), then NORMAL by remain (asc); ties by arrival."""
        within = np.where(urgent, -self.density, self.remain)
        return np.lexsort((self.seq, within, ~urgent))


@register("slidebatching")
class SlideBatching(Policy):
    queue_order = "level"  # class-weighted gain: a request mostly waits behind more urgent ones

    PARTITIONS = ("adaptive", "deadline", "density")

    DECODES = ("queue", "always")

    def __init__(self, phi: str = "a", gamma: float = 1.0, eta: float = 0.1, partition: str = "adaptive",
                 latency_aware: bool = True, decodes: str = "queue") -> None:
        if phi not in ("a", "c", "p"):
            raise ValueError("phi must be 'a', 'c' or 'p'")
        if partition not in self.PARTITIONS:
            raise ValueError(f"partition must be one of {', '.join(self.PARTITIONS)}, got {partition!r}")
        if decodes not in self.DECODES:
            raise ValueError(f"decodes must be one of {', '.join(self.DECODES)}, got {decodes!r}")
        self.phi = phi
        self.decodes = decodes              # running decodes: in Q's order (Alg. 1) or always in the batch (§4.3)
        self.gamma = gamma
        self.eta = eta
        self.partition = partition          # §5.4 ablation: adaptive (Alg. 1 lines 8-13) or one strategy only
        self.latency_aware = latency_aware  # §5.4 ablation: the time budget of lines 7 and 15

    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        q = QueueMetrics(view, now)
        if not len(q):
            return BatchPlan()
        t_budget = q.budget(self.eta)
        if self.partition == "adaptive":
            urgent = q.remain < self.gamma * q.phi(self.phi, t_budget)
        else:
            urgent = np.full(len(q), self.partition == "density")
        order = q.order(urgent)
        b = BatchBuilder(view, time_budget=t_budget if self.latency_aware else None)
        victims = list(view.running)  # the engine underneath (vLLM) preempts the newest first
        if self.decodes == "always":
            # §4.3: decodes are always in the batch, ahead of the ordered queue (their KV still counts)
            dec = np.flatnonzero(q.need[: q.n_run] == 1)
            for i in dec[np.argsort(order.argsort()[dec], kind="stable")].tolist():
                r = q.reqs[i]
                if not b.is_preempted(r):
                    b.add_or_evict(r, victims, use_time=False)
        admit_open = True
        running_left = q.n_run
        for i in order.tolist():
            if b.full or (not admit_open and running_left == 0):
                break
            r = q.reqs[i]
            if i < q.n_run:
                running_left -= 1
                if not b.is_preempted(r):
                    b.add_or_evict(r, victims)
            elif admit_open:
                if b.blocks_short(r) > 0 or b.seats_left <= 0:
                    # "while ... memory is enough": admissions end here, but the running
                    # requests later in the order still get their tokens (they hold KV)
                    admit_open = False
                else:
                    b.add(r)
        ensure_progress(b, q, order, t_budget)
        return b.build()


def ensure_progress(b: BatchBuilder, q: QueueMetrics, order: np.ndarray, t_budget: float) -> None:
    """A budget smaller than one step's fixed cost would stall the engine: give the first
    request that can run the chunk that fits the budget (at least one token)."""
    if b.tokens:
        return
    for i in order:
        r = q.reqs[i]
        chunk = max(1, b.est.max_chunk(r.computed, t_budget - q.t_c, r.need))
        if b.add(r, chunk, use_time=False):
            return
