"""Latency profiles: a fitted estimator plus the hardware facts a simulation needs
(KV blocks, batch limits, SLO scale). Files live in `data/profiles/NAME.json`."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from triage.estimators import LatencyEstimator, ProServeEstimator, SlidingServeEstimator
from triage.paths import data_dir

DEFAULT_PROFILE = "a5000-qwen1.5-7b"


@dataclass(frozen=True)
class Limits:
    """Engine batch limits (vLLM's names)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 32768


@dataclass(frozen=True)
class Profile:
    name: str
    raw: dict

    @property
    def limits(self) -> Limits:
        return Limits(**self.raw.get("limits", {}))

    @property
    def block_size(self) -> int:
        return int(self.raw["kv"]["block_size"])

    @property
    def num_blocks(self) -> int:
        return int(self.raw["kv"]["num_blocks"])

    @property
    def max_request_tokens(self) -> int:
        """The longest request (prompt + output) one instance can hold: max_model_len,
        or the whole KV cache when that is smaller."""
        return min(self.limits.max_model_len, self.num_blocks * self.block_size)

    @property
    def kv_load_per_token(self) -> float:
        return float(self.raw["kv"].get("load_per_token", 0.0))

    @property
    def slo_scale(self) -> float:
        return float(self.raw.get("slo_scale", 1.0))

    @property
    def noise_cv(self) -> float:
        return float(self.raw.get("noise_cv", 0.0))

    def policy_params(self, policy: str) -> dict:
        """Policy parameters this hardware needs (e.g. SlideBatching's η must exceed one
        step's fixed cost): `policy_params.<name>` in the profile file."""
        return dict(self.raw.get("policy_params", {}).get(policy, {}))

    def make_policy(self, policy: str, **overrides):
        """`policy` as it runs on this hardware: the profile's `policy_params` for it, with
        `overrides` (an operator's or a benchmark's options) over them."""
        from triage.policies import make_policy

        return make_policy(policy, **{**self.policy_params(policy), **overrides})

    def estimator(self, kind: str = "proserve") -> LatencyEstimator:
        """A fresh estimator (each instance keeps its own online correction β)."""
        if kind == "proserve":
            e = dict(self.raw["estimator"])
            e.pop("kind", None)
            return ProServeEstimator(**e)
        if kind == "slidingserve":
            models = self.raw.get("slidingserve")
            if models is None:
                models = {"global": _slidingserve_from_proserve(self.raw["estimator"])}
            return SlidingServeEstimator(models)
        raise ValueError(f"unknown estimator kind {kind!r} (proserve, slidingserve)")


def _slidingserve_from_proserve(e: dict) -> list[float]:
    """Express a ProServe model exactly in the 7 features (an uncalibrated starting point)."""
    # x1 = Σc(u+c) = Σcu + Σc², x2 = Σc²: a_p·c² + b_p·c·u = b_p·x1 + (a_p - b_p)·x2
    b_p, a_p = e["b_p"], e["a_p"]
    w1, w2 = b_p, a_p - b_p
    return [e["t_c"], w1, w2, 0.0, e["b_d"], e["a_d"], e["c_p"], 0.0]


def profile_path(name: str) -> Path:
    return data_dir() / "profiles" / f"{name}.json"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in (data_dir() / "profiles").glob("*.json"))


def load_profile(name: str = DEFAULT_PROFILE) -> Profile:
    p = Path(name) if name.endswith(".json") else profile_path(name)
    if not p.exists():
        raise FileNotFoundError(f"no profile {name!r}; available: {', '.join(available_profiles())}")
    raw = json.loads(p.read_text())
    return Profile(raw.get("name", p.stem), raw)
