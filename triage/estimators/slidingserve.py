"""SlidingServe 7-feature per-scenario batch latency predictor (seed 001 §4.1, Eqs. 4-6).

Scenario s(B): pure decode (no prefill), pure prefill (no decode), mixed. Features:
    x1 = Σ_P c(u+c)   x2 = Σ_P c²   x3 = Σ u   x4 = |D|   x5 = Σ_D u   x6 = Σ_P c   x7 = max_P c
with c the tokens scheduled and u the cached context. T = b(m) + Σ_j w_j(m)·x_j per
scenario m, falling back to a global model when a scenario had too few samples.
"""
from __future__ import annotations

from typing import Sequence

from triage.estimators.base import LatencyEstimator, Work, nonneg_lstsq

SCENARIOS = ("decode", "prefill", "mixed")
MIN_SAMPLES = 12


def scenario(works: Sequence[Work]) -> str:
    has_p = any(not (w.lq == 1 and w.lkv > 0) for w in works)
    has_d = any(w.lq == 1 and w.lkv > 0 for w in works)
    return "mixed" if has_p and has_d else ("prefill" if has_p else "decode")


def features(works: Sequence[Work]) -> list[float]:
    x = [0.0] * 7
    for c, u in works:
        x[2] += u
        if c == 1 and u > 0:
            x[3] += 1
            x[4] += u
        else:
            x[0] += c * (u + c)
            x[1] += c * c
            x[5] += c
            x[6] = max(x[6], c)
    return x


class SlidingServeEstimator(LatencyEstimator):
    kind = "slidingserve"

    def __init__(self, models: dict[str, list[float]], **kw) -> None:
        """models: scenario (or "global") -> [b, w1..w7]."""
        super().__init__(**kw)
        self.models = {k: list(map(float, v)) for k, v in models.items()}
        self.t_c = min(v[0] for v in self.models.values())

    def _model(self, name: str) -> list[float]:
        return self.models.get(name) or self.models["global"]

    def _batch_time(self, works: Sequence[Work]) -> float:
        m = self._model(scenario(works))
        x = features(works)
        return m[0] + sum(w * xi for w, xi in zip(m[1:], x))

    def _request_time(self, lq: int, lkv: int) -> float:
        """Marginal share of one request under the mixed model (intercept excluded)."""
        m = self._model("mixed")
        if lq == 1 and lkv > 0:
            return m[3] * lkv + m[4] + m[5] * lkv
        return m[1] * lq * (lkv + lq) + m[2] * lq * lq + m[3] * lkv + m[6] * lq + m[7] * lq

    def fit(self, samples) -> None:
        rows = [([1.0] + features(w), t, scenario(w)) for w, t in samples]
        self.models = {"global": list(map(float, nonneg_lstsq([r[0] for r in rows], [r[1] for r in rows])))}
        for s in SCENARIOS:
            sub = [r for r in rows if r[2] == s]
            if len(sub) >= MIN_SAMPLES:
                self.models[s] = list(map(float, nonneg_lstsq([r[0] for r in sub], [r[1] for r in sub])))
        self.t_c = min(v[0] for v in self.models.values())

    def to_dict(self) -> dict:
        return {"kind": self.kind, "models": self.models}
