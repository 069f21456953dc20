"""The estimator contract.

A batch is a list of `Work` items, one per scheduled request: `lq` tokens computed this
step on top of `lkv` tokens already in the KV cache (`lq == 1` and `lkv > 0` is a decode).
`batch_time(works)` is the predicted step time in seconds, already multiplied by the
online correction factor β (seed 000 §4.1):

    β ← θ·β + (1-θ)·median(T_real / T_pred)   over a sliding window of recent steps.

The seed takes the window's mean; we take its median. Live, the first steps of a burst ran
1.1-2.2x their prediction while the front end classified the arriving calls on the engine's
cores: the mean carried those few steps into β for the whole window after them, and every
one of those ~30 steps was planned ~20 % shorter than the machine needed (seats filled
later, ESI-1 prompts waited; docs/measurements/single-engine.md, 35th day). The median
leaves such a spike out and still follows a lasting change within half a window.

A single β corrects the machine's speed, not the shape of the model: a profile measured on
one CPU and run on another (whose matrix units make prompts relatively cheaper than decodes,
or dearer) mispredicts prompt-heavy steps by 2-3x while β, fed mostly by decode steps, sits
near 1. With `learn_shape` (the live engine sets it) the estimator also learns ρ, the
prefill part's cost relative to the rest, from the same measured steps: a least-squares fit
of T_real ≈ b₁·(t_c + decodes) + b₂·prefills over the last `SHAPE_WINDOW` steps, used only
when the window's steps differ enough in their prefill share to tell the two apart (ρ =
b₂/b₁, clipped, with momentum). ρ multiplies every prefill share (`_request_time`), so
every policy that asks the estimator sees it; β keeps correcting the whole.

`request_time(lq, lkv)` is one request's share without the per-step constant `t_c`, and
`max_chunk(lkv, budget)` inverts it: the largest chunk whose share fits `budget`
(SlideBatching's GETMAXCHUNK, SlidingServe's TimeToBudget).
"""
from __future__ import annotations

import statistics
from abc import ABC, abstractmethod
from collections import deque
from typing import NamedTuple, Sequence


class Work(NamedTuple):
    lq: int
    lkv: int


SHAPE_WINDOW = 64          # steps the prefill-cost ratio ρ is fitted on
SHAPE_MIN_SPREAD = 0.10    # ... only when their prefill shares have at least this standard deviation
RHO_RANGE = (0.1, 10.0)


class LatencyEstimator(ABC):
    t_c: float

    def __init__(self, theta: float = 0.9, window: int = 32) -> None:
        self.beta = 1.0
        self.theta = theta
        self._ratios: deque[float] = deque(maxlen=window)
        self.rho = 1.0              # the prefill part's cost relative to the profile's (learn_shape)
        self.learn_shape = False
        self._shape: deque[tuple[float, float, float]] = deque(maxlen=SHAPE_WINDOW)

    # --- the model (uncorrected) -------------------------------------------------------
    @abstractmethod
    def _batch_time(self, works: Sequence[Work]) -> float:
        """Uncorrected step time of a batch, including the per-step constant."""

    @abstractmethod
    def _request_time(self, lq: int, lkv: int) -> float:
        """Uncorrected share of one request, without the per-step constant."""

    @abstractmethod
    def fit(self, samples: Sequence[tuple[Sequence[Work], float]]) -> None:
        """Least-squares fit from profiled (batch, seconds) samples."""

    @abstractmethod
    def to_dict(self) -> dict: ...

    # --- corrected public interface ----------------------------------------------------
    def batch_time(self, works: Sequence[Work]) -> float:
        return self.beta * self._batch_time(works)

    def request_time(self, lq: int, lkv: int) -> float:
        return self.beta * self._request_time(lq, lkv)

    def request_times(self, lq, lkv):
        """Vectorised request_time over numpy arrays (corrected by β)."""
        import numpy as np

        return self.beta * np.array([self._request_time(int(a), int(b)) for a, b in zip(lq, lkv)], dtype=float)

    def prefill_time(self, n: int, lkv: int = 0) -> float:
        return self.request_time(n, lkv) if n > 0 else 0.0

    def decode_time(self, lkv: int) -> float:
        return self.request_time(1, lkv)

    def decode_time_fn(self):
        """decode_time as a closure with β bound now (hot loops call it per request)."""
        return self.decode_time

    def max_chunk(self, lkv: int, budget: float, cap: int) -> int:
        """Largest lq in [0, cap] with request_time(lq, lkv) <= budget (binary search)."""
        if cap <= 0 or budget <= 0 or self.request_time(1, lkv) > budget:
            return 0
        if self.request_time(cap, lkv) <= budget:
            return cap
        lo, hi = 1, cap  # request_time(lo) <= budget < request_time(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.request_time(mid, lkv) <= budget:
                lo = mid
            else:
                hi = mid
        return lo

    def time_to_budget(self, budget: float, lkv: int = 0, cap: int = 1 << 20) -> int:
        """Tokens of one fresh chunk that fit a step of `budget` seconds (t_c included)."""
        return self.max_chunk(lkv, budget - self.beta * self.t_c, cap)

    def observe(self, predicted_uncorrected: float, real: float) -> None:
        """Online momentum correction from one executed step."""
        if predicted_uncorrected > 0 and real > 0:
            self._ratios.append(real / predicted_uncorrected)
            self.beta = self.theta * self.beta + (1 - self.theta) * statistics.median(self._ratios)

    def learnt(self) -> dict:
        """What the online corrections have learnt (plain numbers): with `set_learnt`, a
        caller can set aside what was learnt while the machine was briefly not itself."""
        return {"beta": self.beta, "rho": self.rho, "ratios": list(self._ratios),
                "shape": [list(x) for x in self._shape]}

    def set_learnt(self, state: dict) -> None:
        self.beta, self.rho = float(state["beta"]), float(state["rho"])
        self._ratios.clear()
        self._ratios.extend(float(x) for x in state["ratios"])
        self._shape.clear()
        self._shape.extend(tuple(float(v) for v in x) for x in state["shape"])

    def split(self, works: Sequence[Work]) -> tuple[float, float]:
        """A batch's uncorrected time as (t_c + decodes, prefills at the profile's cost, ρ
        not applied). A model that cannot tell the parts apart returns (whole, 0): no shape
        is learnt for it."""
        return self._batch_time(works), 0.0

    def observe_batch(self, works: Sequence[Work], real: float) -> float:
        """Online correction from one executed step: β always, ρ too with `learn_shape`.
        Returns the step's prediction as it stood before this correction."""
        rest, pre = self.split(works)
        uncorrected = rest + self.rho * pre
        predicted = self.beta * uncorrected
        if real <= 0:
            return predicted
        self.observe(uncorrected, real)
        if self.learn_shape and rest + pre > 0:
            self._shape.append((rest, pre, real))
            self._fit_rho()
        return predicted

    def _fit_rho(self) -> None:
        """Relative least squares (weights 1/T_real, as the profile's fit) of
        T_real ~ b1*rest + b2*prefills over the window, by its 2x2 normal equations: this
        runs after every live step, where numpy's general solver cost ~0.5 ms a call."""
        n = len(self._shape)
        if n < SHAPE_WINDOW // 4:
            return
        s1 = s2 = suu = suv = svv = su = sv = 0.0
        for rest, pre, real in self._shape:
            share = pre / (rest + pre)
            s1 += share
            s2 += share * share
            u, v = rest / real, pre / real   # each row divided by T_real: the target is 1
            suu += u * u
            suv += u * v
            svv += v * v
            su += u
            sv += v
        var = s2 / n - (s1 / n) ** 2
        if var < SHAPE_MIN_SPREAD ** 2:      # every step alike: the parts cannot be told apart
            return
        det = suu * svv - suv * suv
        if det <= 0:
            return
        b1 = (su * svv - sv * suv) / det
        b2 = (sv * suu - su * suv) / det
        if b1 <= 0 or b2 <= 0:
            return
        obs = min(RHO_RANGE[1], max(RHO_RANGE[0], b2 / b1))
        self.rho = float(self.theta * self.rho + (1 - self.theta) * obs)

    def uncorrected_batch_time(self, works: Sequence[Work]) -> float:
        return self._batch_time(works)


def nonneg_lstsq(x, y):
    """Least squares with coefficients >= 0 (drop the most negative and refit)."""
    import numpy as np

    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            return coef
        active.pop(int(np.argmin(sol)))
    return coef


def remaining_time(est: LatencyEstimator, need: int, computed: int, remaining_output: int) -> float:
    """Predicted compute time left for a request running alone: the rest of its
    prefill (or recomputation), then its remaining decode steps (seed 004's f_t)."""
    t = est.request_time(need, computed) if need > 1 else est.decode_time(computed)
    if remaining_output > 1:
        t += (remaining_output - 1) * est.decode_time(computed + need + remaining_output // 2)
    return t
