"""Priority classes: level -> (name, weight w_p, TTFT SLO, TPOT SLO), versioned."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from triage.paths import data_dir


class ClassError(ValueError):
    """An invalid class table (the service turns it into a 4xx)."""


@dataclass(frozen=True, slots=True)
class PriorityClass:
    level: int
    name: str
    weight: float
    ttft: float   # seconds
    tpot: float   # seconds

    def validate(self) -> None:
        if self.level < 1:
            raise ClassError(f"level must be >= 1, got {self.level}")
        if not self.name:
            raise ClassError(f"level {self.level}: name must not be empty")
        if not self.weight > 0:
            raise ClassError(f"level {self.level}: weight must be > 0, got {self.weight}")
        if not (self.ttft > 0 and self.tpot > 0):
            raise ClassError(f"level {self.level}: SLOs must be > 0 (ttft={self.ttft}, tpot={self.tpot})")


@dataclass(frozen=True, slots=True)
class PriorityClasses:
    """The class table. Immutable: an edit makes a new version."""

    classes: dict[int, PriorityClass]
    version: int = 1
    w_first: float = 4.0
    w_decode: float = 1.0
    _levels: tuple[int, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not self.classes:
            raise ClassError("at least one priority class is required")
        for level, c in self.classes.items():
            c.validate()
            if c.level != level:
                raise ClassError(f"class keyed {level} says level {c.level}")
        if not (self.w_first > 0 and self.w_decode > 0):
            raise ClassError("w_first and w_decode must be > 0")
        object.__setattr__(self, "_levels", tuple(sorted(self.classes)))

    @property
    def levels(self) -> tuple[int, ...]:
        return self._levels

    @property
    def most_urgent(self) -> int:
        return self._levels[0]

    @property
    def least_urgent(self) -> int:
        return self._levels[-1]

    def get(self, level: int) -> PriorityClass:
        try:
            return self.classes[level]
        except KeyError:
            raise ClassError(f"unknown priority level {level}; known: {list(self._levels)}") from None

    def token_weight(self, level: int, i: int) -> float:
        """w_r(i) of seed 000 Eq. 3: w_first·w_p for i = 1, w_decode·w_p after."""
        w = self.get(level).weight
        return (self.w_first if i == 1 else self.w_decode) * w

    def scaled(self, slo_scale: float) -> "PriorityClasses":
        """The same table with every SLO multiplied (profiles for slower hardware)."""
        return replace(
            self,
            classes={k: replace(c, ttft=c.ttft * slo_scale, tpot=c.tpot * slo_scale) for k, c in self.classes.items()},
        )

    def edited(self, classes: dict[int, PriorityClass]) -> "PriorityClasses":
        return replace(self, classes=dict(classes), version=self.version + 1)

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "w_first": self.w_first,
            "w_decode": self.w_decode,
            "classes": [
                {"level": c.level, "name": c.name, "weight": c.weight, "ttft": c.ttft, "tpot": c.tpot}
                for c in (self.classes[k] for k in self._levels)
            ],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "PriorityClasses":
        try:
            rows = d["classes"] if "classes" in d else d["class"]
            classes = {int(r["level"]): PriorityClass(int(r["level"]), str(r["name"]), float(r["weight"]),
                                                       float(r["ttft"]), float(r["tpot"])) for r in rows}
        except (KeyError, TypeError, ValueError) as e:
            raise ClassError(f"malformed class table: {e}") from None
        if len(classes) != len(rows):
            raise ClassError("duplicate level in class table")
        return cls(classes, int(d.get("version", 1)), float(d.get("w_first", 4.0)), float(d.get("w_decode", 1.0)))


def load_classes(path: Path | None = None) -> PriorityClasses:
    """Load `data/priority_classes.toml` (or another TOML file of the same shape)."""
    p = Path(path) if path else data_dir() / "priority_classes.toml"
    with p.open("rb") as f:
        return PriorityClasses.from_dict(tomllib.load(f))
