"""Where the live predictor holds a site's adapters: the promoted one (its decisions are the
levels the service uses) and a shadow candidate (it predicts beside the live decision and
only counts agreement). Swaps are single attribute assignments, so the predictor's worker
thread sees either the old or the new adapter for a whole batch, never a mix, and a swap
needs no restart.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from predictors.adapter import SiteAdapter


@dataclass(frozen=True)
class Versioned:
    version: int
    adapter: SiteAdapter


@dataclass
class ShadowStats:
    version: int
    n: int = 0
    agree: int = 0
    shadow_more_urgent: int = 0
    shadow_less_urgent: int = 0
    # rows: the live decision 1-5, columns: the shadow's 1-5
    confusion: list[list[int]] = field(default_factory=lambda: [[0] * 5 for _ in range(5)])

    def add(self, live: np.ndarray, shadow: np.ndarray) -> None:
        for a, b in zip(live, shadow):
            self.confusion[int(a) - 1][int(b) - 1] += 1
        self.n += len(live)
        self.agree += int((live == shadow).sum())
        self.shadow_more_urgent += int((shadow < live).sum())
        self.shadow_less_urgent += int((shadow > live).sum())

    def to_json(self) -> dict:
        return {"version": self.version, "n": self.n, "agreement": (self.agree / self.n) if self.n else None,
                "shadow_more_urgent": self.shadow_more_urgent, "shadow_less_urgent": self.shadow_less_urgent,
                "confusion_live_rows_shadow_cols": [row[:] for row in self.confusion]}


class SiteSlot:
    def __init__(self) -> None:
        self.live: Versioned | None = None
        self.shadow: Versioned | None = None
        self.shadow_stats: ShadowStats | None = None

    def set_live(self, version: int | None, adapter: SiteAdapter | None) -> None:
        self.live = None if adapter is None else Versioned(int(version), adapter)

    def set_shadow(self, version: int | None, adapter: SiteAdapter | None) -> None:
        if adapter is None:
            self.shadow, self.shadow_stats = None, None
            return
        self.shadow_stats = ShadowStats(int(version))
        self.shadow = Versioned(int(version), adapter)

    def apply(self, feats: np.ndarray, general_levels: list[int]) -> tuple[np.ndarray, int | None, np.ndarray | None, int | None]:
        """(levels, live version or None, shadow levels or None, shadow version) for one batch."""
        live, shadow, stats = self.live, self.shadow, self.shadow_stats  # one read each: a swap mid-batch is not seen
        gl = np.asarray(general_levels, dtype=int)
        levels = live.adapter.decide(feats, gl) if live is not None else gl
        if shadow is None:
            return levels, (live.version if live else None), None, None
        sh = shadow.adapter.decide(feats, gl)
        if stats is not None and stats.version == shadow.version:
            stats.add(levels, sh)
        return levels, (live.version if live else None), sh, shadow.version
