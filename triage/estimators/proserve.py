"""ProServe batch latency model (seed 000 §4.1, Eqs. 4-7).

    T~_p(r) = a_p·lq² + b_p·lq·lkv + c_p·lq          (prefill chunk)
    T~_d(r) = a_d·lkv + b_d                           (decode)
    T(B)    = Σ_{r∈Bp} T~_p(r) + Σ_{r∈Bd} T~_d(r) + t_c
"""
from __future__ import annotations

from typing import Sequence

from triage.estimators.base import LatencyEstimator, Work, nonneg_lstsq


class ProServeEstimator(LatencyEstimator):
    kind = "proserve"

    def __init__(self, a_p: float, b_p: float, c_p: float, a_d: float, b_d: float, t_c: float, **kw) -> None:
        super().__init__(**kw)
        self.a_p, self.b_p, self.c_p, self.a_d, self.b_d, self.t_c = a_p, b_p, c_p, a_d, b_d, t_c

    def _request_time(self, lq: int, lkv: int) -> float:
        if lq == 1 and lkv > 0:
            return self.a_d * lkv + self.b_d
        return self.rho * (self.a_p * lq * lq + self.b_p * lq * lkv + self.c_p * lq)

    def decode_time_fn(self):
        a, b = self.beta * self.a_d, self.beta * self.b_d
        return lambda lkv: a * lkv + b

    def request_times(self, lq, lkv):
        import numpy as np

        dec = (lq == 1) & (lkv > 0)
        pre = self.rho * (self.a_p * lq * lq + self.b_p * lq * lkv + self.c_p * lq)
        return self.beta * np.where(dec, self.a_d * lkv + self.b_d, pre)

    def _batch_time(self, works: Sequence[Work]) -> float:
        rt = self._request_time
        return sum(rt(w.lq, w.lkv) for w in works) + self.t_c

    def split(self, works: Sequence[Work]) -> tuple[float, float]:
        rest, pre = self.t_c, 0.0
        for lq, lkv in works:
            if lq == 1 and lkv > 0:
                rest += self.a_d * lkv + self.b_d
            else:
                pre += self.a_p * lq * lq + self.b_p * lq * lkv + self.c_p * lq
        return rest, pre

    @staticmethod
    def features(works: Sequence[Work]) -> list[float]:
        f = [0.0] * 6  # Σlq², Σlq·lkv, Σlq (prefill) | Σlkv, n (decode) | 1
        for lq, lkv in works:
            if lq == 1 and lkv > 0:
                f[3] += lkv
                f[4] += 1
            else:
                f[0] += lq * lq
                f[1] += lq * lkv
                f[2] += lq
        f[5] = 1.0
        return f

    def fit(self, samples) -> None:
        coef = nonneg_lstsq([self.features(w) for w, _ in samples], [t for _, t in samples])
        self.a_p, self.b_p, self.c_p, self.a_d, self.b_d, self.t_c = (float(c) for c in coef)
        self.rho = 1.0

    def to_dict(self) -> dict:
        return {"kind": self.kind, "a_p": self.a_p, "b_p": self.b_p, "c_p": self.c_p,
                "a_d": self.a_d, "b_d": self.b_d, "t_c": self.t_c}
