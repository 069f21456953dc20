"""`pab`: FairBatching's Prefill Admission Budget load balancer (seed 002 §3.4, App. A).

For the incoming request's TTFT SLO, each instance's PAB is the prefill tokens it can
still take within that window after reserving time for the decode steps of every
request already there, and subtracting prefill work already queued (App. A.7, with
DUP = Decode ∪ Prefill as the appendix sums it: a request still prefilling will decode
inside the window too):

    PAB = 1/(b + c) · [ TTFT − ((TTFT − min_{DUP} slack_i)/TPOT + 1)·a
                        − Σ_{DUP} N_i · (b + context_i·c) ]  − Σ_{Prefill} prompt_i
    N_i = (TTFT − slack_i)/TPOT  if TTFT > slack_i, else 0          (App. A.3)

with a, b, c the linear step model `a + b·tokens + c·context` (seed 002 §3.2; fitted to
the instance's estimator, times β), slack_i the envelope slack of each request's next
token (a prefill's first token), context_i its KV length (a prefill's prompt) and TPOT
the requests' TPOT SLO. The minimum slack is used as printed: an overdue request
(negative slack) reserves more steps, it is not clamped to 0; only the step count has a
floor of one (the step that runs the new prefill), which the printed formula undercuts
when every request is more than one TPOT beyond the window. The request goes to the
instance with the largest PAB; in the simulator the engines' state is current at every
arrival, so the budget the front-end "decrements locally" is recomputed.

`reject=True` is FairBatching-PAB's admission control (§5.1, §5.2): when even the best
instance's PAB is below the request's prompt, the request is turned away (REJECT) and,
as the paper scores it, counts as an SLO violation.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from triage.policies.fairbatching import linear_step_model
from triage.request import Request
from triage.routing.base import REJECT, InstanceLoad, Router, register


def prefill_admission_budget(inst: InstanceLoad, ttft: float, now: float,
                             abc: tuple[float, float, float] | None = None) -> float:
    """App. A's PAB for a request of TTFT SLO `ttft`; `abc` = the uncorrected linear model."""
    est = inst.estimator
    a, b, c = (x * est.beta for x in (abc or linear_step_model(est)))
    d_slack, d_ctx, d_tpot = inst.decodes(now)
    p_slack, p_ctx, p_tpot = inst.prefills(now) if hasattr(inst, "prefills") else (np.empty(0),) * 3
    slack = np.concatenate([d_slack, p_slack])
    context = np.concatenate([d_ctx, p_ctx])
    tpot = np.concatenate([d_tpot, p_tpot])
    if len(slack):
        # A.2 over DUP; at least the one step that runs the new prefill (a formula value
        # below 1 only arises when every request is more than a TPOT beyond the window)
        steps = max((ttft - float(slack.min())) / float(tpot.min()) + 1, 1.0)
        n_i = np.where(ttft > slack, (ttft - slack) / tpot, 0.0)                      # A.3
        reserved = float(np.sum(n_i * (b + context * c)))
    else:
        steps, reserved = 1.0, 0.0
    return (ttft - steps * a - reserved) / (b + c) - inst.prefill_tokens             # A.4-A.6


@register("pab")
class PAB(Router):
    def __init__(self, reject: bool = False) -> None:
        self.reject = reject                 # FB-PAB admission control
        self.rejected = 0
        self._models: dict[int, tuple[float, float, float]] = {}

    def _abc(self, inst: InstanceLoad) -> tuple[float, float, float]:
        key = id(inst.estimator)
        if key not in self._models:
            self._models[key] = linear_step_model(inst.estimator)
        return self._models[key]

    def route(self, req: Request, pool: Sequence[InstanceLoad], now: float) -> int:
        budgets = [prefill_admission_budget(p, req.ttft_slo, now, self._abc(p)) for p in pool]
        best = max(range(len(pool)), key=lambda i: (budgets[i], -i))
        if self.reject and budgets[best] < req.need:
            self.rejected += 1
            return REJECT
        return best
