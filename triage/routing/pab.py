"""`pab`: FairBatching's Prefill Admission Budget load balancer (seed 002 §3.4, App. A).

For the incoming request's TTFT SLO, each instance's PAB is the prefill tokens it can
still take within that window after reserving time for its decodes (worst case: each
decode delayed until its slack runs out) and subtracting prefill work already queued:

    PAB = 1/(b + c) · [ TTFT − ((TTFT − min_i slack_i)/TPOT + 1)·a
                        − Σ_i (TTFT − slack_i)/TPOT · (b + context_i·c) ]  − Σ_{prefill} prompt_i

with a, b, c the linear step model `a + b·tokens + c·context` (seed 002 §3.2; fitted to
the instance's estimator, times β) and slack_i, TPOT the decodes' envelope slack and TPOT
SLO ((TTFT − slack_i)/TPOT is clamped at 0 for a decode more than a window ahead). The
request goes to the instance with the largest PAB; in the simulator the engines' state is
current at every arrival, so the budget the front-end "decrements locally" is recomputed.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from triage.policies.fairbatching import linear_step_model
from triage.request import Request
from triage.routing.base import InstanceLoad, Router, register


def prefill_admission_budget(inst: InstanceLoad, ttft: float, now: float,
                             abc: tuple[float, float, float] | None = None) -> float:
    """App. A's PAB for a request of TTFT SLO `ttft`; `abc` = the uncorrected linear model."""
    est = inst.estimator
    a, b, c = (x * est.beta for x in (abc or linear_step_model(est)))
    slack, context, tpot = inst.decodes(now)
    if len(slack):
        steps = (ttft - max(float(slack.min()), 0.0)) / float(tpot.min()) + 1
        need = np.clip(ttft - slack, 0.0, None) / tpot
        reserved = float(np.sum(need * (b + context * c)))
    else:
        steps, reserved = 1.0, 0.0
    return (ttft - max(steps, 1.0) * a - reserved) / (b + c) - inst.prefill_tokens


@register("pab")
class PAB(Router):
    def __init__(self) -> None:
        self._models: dict[int, tuple[float, float, float]] = {}

    def _abc(self, inst: InstanceLoad) -> tuple[float, float, float]:
        key = id(inst.estimator)
        if key not in self._models:
            self._models[key] = linear_step_model(inst.estimator)
        return self._models[key]

    def route(self, req: Request, pool: Sequence[InstanceLoad], now: float) -> int:
        budgets = [prefill_admission_budget(p, req.ttft_slo, now, self._abc(p)) for p in pool]
        return max(range(len(pool)), key=lambda i: (budgets[i], -i))
