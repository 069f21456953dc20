"""From calibrated urgency probabilities to an effective ESI level.

1. `predicted_level` = the most probable level.
2. `escalate_below`: if P(level 1) + P(level 2) >= the threshold and the predicted level is
   3-5, the level is raised to the more probable of 1 and 2 (a missed level 1-2 costs far
   more than an over-triage). The threshold is at most the Bayes threshold of the declared
   cost ratio, 1 / (1 + 5); the corpus validation split may lower it, never raise it
   (`choose_escalate_below`).
3. The ESI vital-sign floors of `predictors.vitals` (decision points A, B, D).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictors.vitals import parse_vitals, safety_floor

UNDER_TRIAGE_COST = 5.0  # cost of sending a level 1-2 patient to 3-5, relative to one over-triage


@dataclass(frozen=True)
class UrgencyDecision:
    level: int  # effective level after escalation and safety floors
    predicted_level: int  # the classifier's own argmax
    escalated: bool
    reasons: tuple[str, ...]


def decide(probs: np.ndarray, text: str, escalate_below: float | None, use_vitals: bool = True) -> UrgencyDecision:
    """Combine one row of calibrated probabilities (levels 1..5) with the safety rules."""
    p = np.asarray(probs, dtype=float)
    predicted = int(p.argmax()) + 1
    level = predicted
    reasons: list[str] = []
    escalated = False
    if escalate_below is not None and level > 2 and p[0] + p[1] >= escalate_below:
        level = 1 if p[0] >= p[1] else 2
        escalated = True
        reasons.append(f"escalate_below:P(1-2)={p[0] + p[1]:.2f}>={escalate_below:.2f}")
    if use_vitals:
        floor = safety_floor(parse_vitals(text), level)
        if floor.level < level:
            level = floor.level
            reasons.extend(floor.reasons)
    return UrgencyDecision(level, predicted, escalated, tuple(reasons))


def decide_many(probs: np.ndarray, texts: list[str], escalate_below: float | None, use_vitals: bool = True) -> list[UrgencyDecision]:
    return [decide(p, t, escalate_below, use_vitals) for p, t in zip(probs, texts)]


def bayes_threshold(cost_ratio: float = UNDER_TRIAGE_COST) -> float:
    """Escalate when P(1-2) * cost_under > (1 - P(1-2)) * cost_over."""
    return 1.0 / (1.0 + cost_ratio)


def choose_escalate_below(probs: np.ndarray, texts: list[str], gold: list[int], cost_ratio: float = UNDER_TRIAGE_COST,
                          grid: np.ndarray | None = None) -> tuple[float, dict]:
    """Pick the threshold on validation data that minimises
    cost_ratio * (#gold 1-2 sent to 3-5) + (#gold 3-5 raised to 1-2) among thresholds at or
    below the Bayes threshold 1 / (1 + cost_ratio); ties go to the one nearest it. The table
    covers the whole grid.

    Why never above: with calibrated probabilities a threshold above the Bayes one leaves
    patients at 3-5 whose own P(1-2) says escalating is the cheaper error. Validation may
    show that the probabilities understate P(1-2) (then a lower threshold), but a confident
    model is rarely wrong on the corpus it imitates, so a free search there drifts up to
    where the rule stops acting (0.50 for the 8-epoch model: escalation only where argmax
    would already say 1-2), which is no safety margin for real requests unlike the corpus."""
    grid = np.round(np.arange(0.02, 0.62, 0.02), 2) if grid is None else grid
    gold_a = np.asarray(gold)
    target = bayes_threshold(cost_ratio)
    table = {}
    best = None
    for t in grid:
        lv = np.array([d.level for d in decide_many(probs, texts, float(t))])
        under = int(((gold_a <= 2) & (lv >= 3)).sum())
        over = int(((gold_a >= 3) & (lv <= 2)).sum())
        cost = cost_ratio * under + over
        table[float(t)] = {"under": under, "over": over, "cost": cost, "accuracy": float((lv == gold_a).mean())}
        key = (cost, abs(float(t) - target))
        if t <= target + 1e-9 and (best is None or key < best[0]):
            best = (key, float(t))
    return best[1], table
