"""What a simulated engine step really takes: the ground truth the scheduler never sees.

The scheduler plans with the profile's fitted estimator (× its online β, seed 000 §4.1);
the simulated engine's step time comes from here, and the two differ as they do in
production:

    model     T(B) = fitted(B) · bias · ε,  ε ~ lognormal(mean 1, cv = profile noise_cv)
              The truth is the published/fitted model itself (a5000-…, a100-… profiles):
              only noise separates it from the estimator, so β has little to correct.
    measured  T(B) = fitted(B) · bias · ρ,  ρ drawn (seeded) from the measured residuals
              ρ_k = T_real,k / fitted(B_k) of the engine steps recorded on the real engine
              (`data/profiles/samples/NAME.json`, written by `triage profile fit`),
              taken from the steps most like B: same scenario (pure decode, pure
              prefill, mixed), same power-of-two bucket of decode count and of prefill
              tokens; a cell with fewer than MIN_CELL steps widens to the scenario.
              The residuals keep what the fit misses (composition-dependent bias, heavy
              tails) instead of a symmetric lognormal.

`bias` multiplies either truth (a known systematic error, e.g. a slower machine than the
one profiled): tests use it to check that the online correction removes it.
`truth_for(profile, "auto")` is `measured` when the profile has recorded samples, else
`model`. A `MeasuredSteps` in place of the name is `measured` from other steps: those of
a live engine's step log (`simulate --truth steplog:FILE`), so a simulated engine runs at
the speed, and with the step shape, of the machine that wrote the log that day.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from triage.estimators import LatencyEstimator, Work
from triage.paths import data_dir

MIN_CELL = 8
TRUTHS = ("auto", "model", "measured")


@dataclass(frozen=True)
class MeasuredSteps:
    """The `measured` truth from these steps (works, seconds) instead of the profile's
    recorded ones; `source` names where they came from (it is reported)."""
    samples: tuple
    source: str

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError(f"{self.source}: no engine step to measure the truth from")
        object.__setattr__(self, "samples", tuple(([Work(int(a), int(b)) for a, b in w], float(t))
                                                  for w, t in self.samples))


def samples_path(profile_name: str) -> Path:
    return data_dir() / "profiles" / "samples" / f"{profile_name}.json"


def _bucket(x: int) -> int:
    return 0 if x <= 0 else int(math.log2(x)) + 1


def cell(works: Sequence[Work]) -> tuple[str, int, int]:
    n_dec = prefill = 0
    for lq, lkv in works:
        if lq == 1 and lkv > 0:
            n_dec += 1
        else:
            prefill += lq
    scen = "decode" if prefill == 0 else ("prefill" if n_dec == 0 else "mixed")
    return scen, _bucket(n_dec), _bucket(prefill)


class StepTruth:
    kind = "model"

    def __init__(self, fitted: LatencyEstimator, rng: np.random.Generator, bias: float = 1.0) -> None:
        if bias <= 0:
            raise ValueError("bias must be > 0")
        self.fitted = fitted
        self.rng = rng
        self.bias = bias

    def factor(self, works: Sequence[Work]) -> float:
        return 1.0

    def time(self, works: Sequence[Work]) -> float:
        return self.fitted._batch_time(works) * self.bias * self.factor(works)

    def describe(self) -> dict:
        return {"kind": self.kind, "bias": self.bias}


class ModelTruth(StepTruth):
    """The estimator × lognormal noise (mean 1, coefficient of variation `noise_cv`)."""

    kind = "model"

    def __init__(self, fitted: LatencyEstimator, rng: np.random.Generator, noise_cv: float = 0.0, bias: float = 1.0) -> None:
        super().__init__(fitted, rng, bias)
        self.noise_cv = noise_cv
        self._s = math.sqrt(math.log1p(noise_cv ** 2)) if noise_cv > 0 else 0.0

    def factor(self, works: Sequence[Work]) -> float:
        if self._s <= 0:
            return 1.0
        s = self._s
        return float(self.rng.lognormal(-s * s / 2, s))

    def describe(self) -> dict:
        return {"kind": self.kind, "noise_cv": self.noise_cv, "bias": self.bias}


class MeasuredTruth(StepTruth):
    """The fitted model × a residual of a measured step of the same shape."""

    kind = "measured"

    def __init__(self, fitted: LatencyEstimator, rng: np.random.Generator,
                 samples: Sequence[tuple[Sequence[Work], float]], bias: float = 1.0, source: str = "") -> None:
        super().__init__(fitted, rng, bias)
        cells: dict[tuple, list[float]] = defaultdict(list)
        scen: dict[str, list[float]] = defaultdict(list)
        every: list[float] = []
        for works, t in samples:
            pred = fitted._batch_time(works)
            if pred <= 0 or t <= 0:
                continue
            rho = t / pred
            c = cell(works)
            cells[c].append(rho)
            scen[c[0]].append(rho)
            every.append(rho)
        if not every:
            raise ValueError("no usable measured steps")
        self._all = np.asarray(every)
        self._scen = {k: np.asarray(v) for k, v in scen.items()}
        self._cells = {k: np.asarray(v) for k, v in cells.items() if len(v) >= MIN_CELL}
        self._memo: dict[tuple, np.ndarray] = {}
        self.source = source
        self.n_samples = len(every)

    def pool(self, works: Sequence[Work]) -> np.ndarray:
        c = cell(works)
        p = self._memo.get(c)
        if p is None:
            p = self._cells.get(c)
            if p is None:
                p = self._scen.get(c[0], self._all)
            self._memo[c] = p
        return p

    def factor(self, works: Sequence[Work]) -> float:
        p = self.pool(works)
        return float(p[self.rng.integers(len(p))])

    def describe(self) -> dict:
        return {"kind": self.kind, "bias": self.bias, "samples": self.n_samples, "source": self.source,
                "residual_mean": round(float(self._all.mean()), 4),
                "residual_mape": round(float(np.mean(np.abs(1.0 / self._all - 1.0))), 4)}


def load_samples(path: str | Path) -> list[tuple[list[Work], float]]:
    raw = json.loads(Path(path).read_text())
    return [([Work(int(a), int(b)) for a, b in w], float(t)) for w, t in raw["samples"] if w and t > 0]


def truth_for(profile, rng: np.random.Generator, kind: str | MeasuredSteps = "auto", bias: float = 1.0,
              samples: Sequence[tuple[Sequence[Work], float]] | None = None) -> StepTruth:
    """The step-time truth of one simulated instance (its own rng stream)."""
    if isinstance(kind, MeasuredSteps):
        return MeasuredTruth(profile.estimator("proserve"), rng, kind.samples, bias, kind.source)
    if kind not in TRUTHS:
        raise ValueError(f"unknown truth {kind!r}; use one of {', '.join(TRUTHS)}")
    fitted = profile.estimator("proserve")
    path = samples_path(profile.name)
    if kind == "measured" or (kind == "auto" and (samples is not None or path.exists())):
        if samples is None:
            if not path.exists():
                raise ValueError(f"profile {profile.name!r} has no measured steps ({path} not found); use --truth model")
            samples = _cached_samples(path)
            source = str(path.relative_to(data_dir().parent)) if path.is_relative_to(data_dir().parent) else str(path)
        else:
            source = "given samples"
        return MeasuredTruth(fitted, rng, samples, bias, source)
    return ModelTruth(fitted, rng, profile.noise_cv, bias)


_SAMPLES: dict[str, list] = {}


def _cached_samples(path: Path) -> list:
    key = f"{path}:{path.stat().st_mtime_ns}"
    if key not in _SAMPLES:
        _SAMPLES[key] = load_samples(path)
    return _SAMPLES[key]
