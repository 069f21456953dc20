"""`gorouting`: ProServe's GoRouting (seed 000 §4.3, Algorithm 2), PD disaggregated and
PD co-located.

    for p in P:                                               (Alg. 2 lines 2-7)
        Q ← PrefillQueueMap[p]
        Δp ← ESTIMATEGAIN(Q ∪ {req}) − ESTIMATEGAIN(Q)
    C ← {p : Δp ≥ α·Δmax}                                     (line 8, candidates)
    if Δmax > 0:
        L ← {p ∈ C : EXEC(p) < μ·TTFT_slo};  H ← {p ∈ C : EXEC(p, req) > λ·TTFT_slo}
        L ≠ ∅      → argmin_L EXEC(p)     (light: the most idle)
        C \\ H ≠ ∅  → argmax_{C\\H} EXEC(p) (the heaviest that is not heavy: keep idle
                                            capacity for later long, urgent requests)
        else       → argmin_C EXEC(p)     (all heavy: the least loaded)
    else:          argmin_P EXEC(p)      (fallback; the seed prints RANDOMSELECT(P):
                                            `fallback="random"`, seeded; see below)
    decode instance ← the most free KV blocks                 (line 20)

PrefillQueueMap[p] is the router's own list of requests dispatched to p whose first
token has not come back, each with its predicted prefill time on p (`on_dispatch` adds,
`on_first_token` removes), stamped with the time ts_p of its last update. EXEC(p) is the
queue's predicted prefill time minus the elapsed time now − ts_p (timestamp lag
compensation: the head of the queue has been running since the last update).

ESTIMATEGAIN(Q) is the first-token gain Σ_{r∈Q} w_first·w_p(r)·1[now + φ(Q) < deadline_1(r)]
under a conservative load judgment: every request of Q is assumed done only when all of
Q is (§4.2's conservative view).
  - PD disaggregated (prefill instances): φp(Q) = EXEC(p) + |Q|·t_c.
  - PD co-located: φa(Q) = t_budget/(t_budget − t_c) · EXEC(p), t_budget = max(min(min
    remaining time of Q's prefills, TPOT_slo), η) — §4.3 sets the budget to the smaller of
    the two, and Alg. 1 line 7's floor η keeps it from collapsing once a queued request is
    overdue (without it φ is infinite, Δ = 0 on every such instance, and routing turns
    random exactly under overload). η defaults to SlideBatching's. Here ESTIMATEEXEC adds the decode time
    n_d·b_d ("when estimating the execution time for prefill on the instance, we add the
    estimated decode time n_d·b_d"), so the light/heavy thresholds see it too. n_d counts
    the instance's requests from first token to finish; b_d, "the average decode time",
    is taken at the mean context of those requests, which the router knows from what it
    dispatched (a fixed context would price a 12k-token Mooncake decode like a 1k one).

Thresholds: the seed gives no values for α, μ, λ. λ must be at least 6/7 for the seed's
own Fig. 8 toy example (instances with 400 ms and 200 ms queued, R1 = 200 ms, then R2 =
400 ms, TTFT SLO 700 ms: R1 belongs on the 400 ms instance, where it ends at 600 ms =
6/7 of the SLO; with λ < 6/7 that instance is "heavy" and R1 goes to the idler one,
leaving R2 nowhere to meet its SLO). Default λ = 0.9 (tests/core/test_routing.py
reproduces the example).

Which queued requests a new one waits behind (`view`): the seed's local scheduler serves
an instance's queue in arrival order, so Q is everything queued. Behind a class-aware
local scheduler (the policy's `queue_order` is "level": triage, slidebatching,
sarathi-priority) a request waits mainly behind requests at least as urgent, so with
view "level" Q and EXEC(p) count only those. `view="auto"` (default) takes the local
policy's order (`bind_policy`). Measured on the Mooncake conversation trace (4
instances, triage local policy, rate scale 0.4, seeds 0/1/2): the arrival view fell
0.2-0.8 % below min_load's TDG, the level view is above it at every seed
(docs/policies.md).

Seats (not in the seed; `seat_aware=False` is the rule as printed). The lag compensation
assumes the queue is being prefilled. An instance whose seats (vLLM's max_num_seqs) are all
held by decodes prefills nothing: the requests queued there wait for a seat. Subtracting the
elapsed time from their prefill makes them vanish from EXEC within a fraction of a second.
Routing between two full instances is then decided by n_d·b_d alone, that is by a few
percent of online β or mean context, and not by how many requests wait on each. Measured
live (2026-11-28, the 196-call burst on two one-core CPU instances of 32 seats): 106-107
calls went to one instance and 89-90 to the other, 16 % more output tokens, and the busier
one finished 4.6 s after the other (docs/measurements/cluster.md). With `seat_aware` (the default), where
the instance reports its seats (`InstanceLoad.seats`: a live instance's `/triage/load`, a
simulated engine's limits), only the first max(0, seats − decodes holding seats) queued
prefills have the elapsed time taken off; the others count in full. Under the level view
only decodes at least as urgent hold a seat against a request (a less urgent one is evicted
for it).

The wait for a seat (`seat_wait`, with `seat_aware`; not in the seed). EXEC counts an
instance's queued prefills and one decode step of its running calls, never the tokens its
calls have still to generate, yet on a seat-bound instance that is what a new request waits
for: its seat frees when a call ahead of it finishes. A request that finds no free seat
(k = ahead − free + 1 releases needed, of the `ahead` calls holding or queued for a seat
before it) waits about k/ahead of the time the instance needs to generate the tokens those
calls still have to produce (predicted: the length head's estimate less what each has
generated), at one token per seat per step of β·t_c + seats·b_d. That time is added to
EXEC(p). Without it a burst's level-5 calls split by their prompts' prefill time: live, 50 / 43
level-5 calls left one of two instances 18 % more output tokens (docs/measurements/cluster.md).

Line 13 among instances it cannot tell apart (not in the seed): light instances whose EXECs
are within one step's fixed cost (β·t_c) of the least count as equally idle, and the one
with the fewest requests at least as urgent in flight (queued or decoding) gets the request.
Under the level view an ESI-1 call waits behind ESI-1 prefills only, so between two instances
with none queued the seed's argmin fell to n_d·b_d and the lowest index: live, 21-22 of a
burst's 35 ESI-1 calls went to one of two instances (docs/measurements/cluster.md).

Fallback when no instance gains (Δmax ≤ 0: the request's first token misses everywhere):
the seed's line 19 picks at random. Its co-located gain counts first tokens only and
assumes decodes always meet their deadlines, but TDG also pays for decode tokens, and a
late first token's decodes can still catch their envelope deadlines, most often on the
least loaded instance; a random pick also lands such requests (long prompts, overload)
on busy instances, where they delay others. Default `fallback="least_loaded"`: argmin_P
EXEC(p), line 17's load balancing over the whole pool; `fallback="random"` is the
printed rule (seeded). Measured on Mooncake (4 instances, first 1,000 requests, rate
scale 0.4, seed 0): 44 % of fcfs's and 11 % of triage's dispatches take the fallback;
random gives TDG 0.8274 (fcfs) / 0.9704 (triage) against min_load's 0.8344 / 0.9706
(docs/reproduction.md has the rest).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from triage.estimators import LatencyEstimator
from triage.request import Request
from triage.routing.base import InstanceLoad, Router, register


def seat_wait_s(est: LatencyEstimator, seats: int, ahead: int, k: int, tokens: float, ctx: int) -> float:
    """How long a call waits for a seat on a full instance (not in the seed): it needs the
    k-th of the `ahead` seat releases in front of it (k ≤ 0: a seat is free), taken as evenly
    spread over the time the instance needs to generate the `tokens` (predicted) those calls
    still have to produce: each of its seats adds one token per step of β·t_c + seats·b_d
    (b_d at context `ctx`)."""
    if k <= 0 or ahead <= 0:
        return 0.0
    return min(k, ahead) / ahead * tokens * (est.beta * est.t_c / seats + est.decode_time(ctx))


class _Queue:
    """PrefillQueueMap[p] and the requests decoding on p. The queued requests are also kept
    as numpy columns, rebuilt only when the queue changes: a route reads every instance's
    queue twice, and a wave of n dispatches in one event-loop turn must cost O(n) numpy work
    per route, not O(n) Python calls (measured: 400 queued requests, 2 instances, ~2 s of
    Python per wave on a loaded 2-core VM, which stalled the front end's event loop;
    docs/measurements/cluster.md). Decodes are at most an instance's seats."""

    __slots__ = ("reqs", "ts", "dec", "_cols")

    def __init__(self) -> None:
        self.reqs: dict[str, tuple[Request, float]] = {}   # id -> (request, predicted prefill s)
        self.ts = 0.0
        self.dec: dict[str, tuple[Request, int]] = {}      # decoding: id -> (request, level at first token)
        self._cols: tuple[np.ndarray, ...] | None = None

    @property
    def n_d(self) -> int:
        """Requests in their decode phase."""
        return len(self.dec)

    @property
    def ctx_d(self) -> int:
        """Σ the contexts at first token (prompt lengths) of the requests decoding."""
        return sum(r.prompt_len for r, _ in self.dec.values())

    def decoding_upto(self, level: float) -> tuple[int, int]:
        """(how many requests decode here at `level` or more urgent, their predicted
        output tokens still to come)."""
        n = rest = 0
        for r, lv in self.dec.values():
            if lv <= level:
                n += 1
                rest += r.remaining_output
        return n, rest

    def add(self, req: Request, t: float) -> None:
        self.reqs[req.id] = (req, t)
        self._cols = None

    def pop(self, rid: str) -> bool:
        if self.reqs.pop(rid, None) is None:
            return False
        self._cols = None
        return True

    def cols(self) -> tuple[np.ndarray, ...]:
        """(level, predicted prefill s, first-token deadline, weight, TPOT SLO, predicted
        output tokens) per request, as they were when queued (a level relabelled meanwhile
        counts from the next change)."""
        if self._cols is None:
            items = list(self.reqs.values())
            n = len(items)
            self._cols = (np.fromiter((r.level for r, _ in items), float, n),
                          np.fromiter((t for _, t in items), float, n),
                          np.fromiter((r.deadline(1) for r, _ in items), float, n),
                          np.fromiter((r.weight for r, _ in items), float, n),
                          np.fromiter((r.tpot_slo for r, _ in items), float, n),
                          np.fromiter((r.remaining_output for r, _ in items), float, n))
        return self._cols


@register("gorouting")
class GoRouting(Router):
    FALLBACKS = ("least_loaded", "random")

    def __init__(self, alpha: float = 0.9, mu: float = 0.25, lam: float = 0.9, seed: int = 0, view: str = "auto",
                 eta: float = 0.1, fallback: str = "least_loaded", seat_aware: bool = True,
                 seat_wait: bool = True) -> None:
        if view not in ("auto", "arrival", "level"):
            raise ValueError("view must be 'auto', 'arrival' or 'level'")
        if fallback not in self.FALLBACKS:
            raise ValueError(f"fallback must be one of {', '.join(self.FALLBACKS)}, got {fallback!r}")
        self.fallback = fallback            # Δmax ≤ 0 (module docstring)
        self.view = view                    # which queued requests a new one waits behind (module docstring)
        self.by_level = view == "level"
        self.alpha = alpha                  # candidate threshold on Δ
        self.mu = mu                        # light: EXEC(p) < μ·TTFT_slo
        self.lam = lam                      # heavy: EXEC(p, req) > λ·TTFT_slo (≥ 6/7: Fig. 8)
        self.eta = eta                      # Alg. 1 line 7: t_budget ≥ η (co-located φa)
        self.seat_aware = seat_aware        # lag compensation only for prefills that hold a seat (docstring)
        self.seat_wait = seat_wait          # seat_aware: EXEC adds the wait for a seat (docstring)
        self._rng = np.random.default_rng(seed)
        self._map: dict[int, _Queue] = {}   # PrefillQueueMap (plus n_d per instance)

    def _q(self, p: InstanceLoad) -> _Queue:
        q = self._map.get(p.index)
        if q is None:
            q = self._map[p.index] = _Queue()
        return q

    def bind_policy(self, policy) -> None:
        if self.view == "auto":
            self.by_level = getattr(policy, "queue_order", "arrival") == "level"

    def _ahead(self, p: InstanceLoad, req: Request | None) -> tuple:
        """The columns (prefill s, first-token deadline, weight, TPOT SLO) of the queued
        requests `req` waits behind, how many of them can hold a seat now, and how long the
        next request at `req`'s level waits for a seat (s)."""
        q = self._q(p)
        level, t, dl1, w, tpot, out = q.cols()
        if req is not None and self.by_level:
            m = level <= req.level
            t, dl1, w, tpot, out = t[m], dl1[m], w[m], tpot[m], out[m]
            held, rest = q.decoding_upto(req.level)       # less urgent decodes give way
        else:
            held, rest = q.decoding_upto(np.inf)
        seats = getattr(p, "seats", None) if self.seat_aware and p.role != "prefill" else None
        if seats is None:
            return t, dl1, w, tpot, len(t), 0.0
        free = max(0, int(seats) - held)
        wait = self._seat_wait(p, q, int(seats), held + len(t), len(t) + 1 - free, rest + float(out.sum()))
        return t, dl1, w, tpot, min(len(t), free), wait

    def _seat_wait(self, p: InstanceLoad, q: _Queue, seats: int, ahead: int, k: int, tokens: float) -> float:
        """The wait for a seat (`seat_wait_s`) at the mean context of the instance's decodes."""
        if not self.seat_wait:
            return 0.0
        return seat_wait_s(p.estimator, seats, ahead, k, tokens, q.ctx_d // q.n_d if q.n_d else 0)

    # --- ESTIMATEEXEC and ESTIMATEGAIN ---------------------------------------------------------
    def exec_time(self, p: InstanceLoad, now: float, req: Request | None = None) -> float:
        """ESTIMATEEXEC(p): the predicted prefill time of the queue `req` waits behind, less
        the time since the queue's last update; on a co-located instance plus n_d·b_d and
        the wait for a seat."""
        a = self._ahead(p, req)
        return self._exec(p, a[0], now, a[4]) + a[5]

    def _exec(self, p: InstanceLoad, t: np.ndarray, now: float, seated: int | None = None) -> float:
        """`seated`: only the first `seated` prefills of `t` run now; the time since ts_p is
        not taken off the others (they wait for a seat), None: all of them run."""
        q = self._q(p)
        k = len(t) if seated is None else seated
        e = max(0.0, float(t[:k].sum()) - (now - q.ts)) + float(t[k:].sum()) if len(t) else 0.0
        n_d = q.n_d
        if p.role != "prefill" and n_d:
            e += n_d * p.estimator.decode_time(q.ctx_d // n_d)            # + n_d·b_d
        return e

    def _phi(self, p: InstanceLoad, dl1: np.ndarray, tpot: np.ndarray, exec_s: float, now: float) -> float:
        est = p.estimator
        t_c = est.beta * est.t_c
        if p.role == "prefill":                                           # φp
            return exec_s + len(dl1) * t_c
        remain = float(dl1.min()) - now if len(dl1) else np.inf
        t_budget = max(min(remain, float(tpot.min()) if len(tpot) else np.inf), self.eta)  # Alg. 1 l. 7
        if not t_budget > t_c:      # η below one step's fixed cost: no batch can make progress
            return np.inf if exec_s > 0 else 0.0
        return t_budget / (t_budget - t_c) * exec_s                      # φa

    def estimate_gain(self, p: InstanceLoad, dl1: np.ndarray, w: np.ndarray, tpot: np.ndarray, exec_s: float,
                      now: float) -> float:
        done = now + self._phi(p, dl1, tpot, exec_s, now)
        return float(w[done < dl1].sum())  # × w_first: same factor for every r

    # --- Alg. 2 ----------------------------------------------------------------------------------
    def route(self, req: Request, pool: Sequence[InstanceLoad], now: float) -> int:
        n = len(pool)
        deltas, execs, execs_req = [], [], []
        for p in pool:
            t, dl1, w, tpot, seated, wait = self._ahead(p, req)
            e = self._exec(p, t, now, seated) + wait
            e_req = e + p.estimator.prefill_time(req.need, req.computed)
            pre = self.estimate_gain(p, dl1, w, tpot, e, now)                              # line 4
            post = self.estimate_gain(p, np.append(dl1, req.deadline(1)), np.append(w, req.weight),
                                      np.append(tpot, req.tpot_slo), e_req, now)       # line 5
            deltas.append(post - pre)
            execs.append(e)
            execs_req.append(e_req)
        d_max = max(deltas)
        if not d_max > 0:
            if self.fallback == "random":
                return int(self._rng.integers(n))                         # line 19 as printed
            return min(range(n), key=lambda i: (execs[i], i))             # least loaded (docstring)
        cands = [i for i in range(n) if deltas[i] >= self.alpha * d_max]  # line 8
        slo = req.ttft_slo
        light = [i for i in cands if execs[i] < self.mu * slo]            # line 10
        heavy = {i for i in cands if execs_req[i] > self.lam * slo}       # line 11
        if light:                                                         # line 13
            return self._most_idle(req, [pool[i] for i in light], [execs[i] for i in light], light)
        rest = [i for i in cands if i not in heavy]
        if rest:
            return max(rest, key=lambda i: (execs[i], -i))                # line 15
        return min(cands, key=lambda i: (execs[i], i))                    # line 17

    def _most_idle(self, req: Request, loads: Sequence[InstanceLoad], execs: list[float], idx: list[int]) -> int:
        """Line 13's argmin EXEC, where EXECs within one step's fixed cost of the least
        (what the estimate cannot tell apart) count as equal: among those, the instance
        with the fewest requests at least as urgent as `req` in flight (queued or decoding),
        so that a wave of urgent calls spreads instead of queueing on the lowest index."""
        m = min(execs)
        near = [k for k, p in enumerate(loads) if execs[k] <= m + p.estimator.beta * p.estimator.t_c]
        if len(near) == 1:
            return idx[near[0]]

        def urgent(p: InstanceLoad) -> int:
            q = self._q(p)
            return int((q.cols()[0] <= req.level).sum()) + q.decoding_upto(req.level)[0]
        return idx[min(near, key=lambda k: (urgent(loads[k]), execs[k], idx[k]))]

    # --- PrefillQueueMap upkeep --------------------------------------------------------------------
    def on_dispatch(self, req: Request, instance: int, now: float, load: InstanceLoad | None = None) -> None:
        q = self._map.setdefault(instance, _Queue())
        t = load.estimator.prefill_time(req.need, req.computed) if load is not None else 0.0
        q.add(req, t)
        q.ts = now

    def on_first_token(self, req: Request, instance: int, now: float) -> None:
        q = self._map.setdefault(instance, _Queue())
        if q.pop(req.id):
            q.ts = now
        q.dec[req.id] = (req, req.level)

    def on_finish(self, req: Request, instance: int, now: float) -> None:
        q = self._map.setdefault(instance, _Queue())
        if q.pop(req.id):
            q.ts = now
        q.dec.pop(req.id, None)
