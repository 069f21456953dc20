"""`fairbatching`: FairBatching's batch formation (seed 002 §3.1-3.3, Algorithm 1).

    slack_i          = token_ddl_{i, next_output_idx} − now       (§3.1 envelope deadline)
    init_time_budget = max(min_i slack_i, min_i tpot_slo_i)        (§3.2 adaptive budget)
    group_ud = decodes with slack < init_time_budget + min_tpot_slo (urgent decode)
    group_p  = prefills (running chunks and waiting requests)
    group_nd = the other decodes                                   (Alg. 1 lines 21-33)
    each group sorted by slack (ties: arrival)
    time_budget ← init_time_budget − a;  token_budget ← MAX_TOKEN_BUDGET
    for r in [group_ud, group_p, group_nd]:                        (Alg. 1 lines 36-48)
        cost ← b·new_tokens + c·context
        if cost ≤ time_budget and new_tokens ≤ token_budget: add all of r
        elif token_budget > 0 and c·context ≤ time_budget:
            cp ← min(token_budget, (time_budget − c·context) / b); add r.chunk(cp)
        time_budget −= cost of what was added

Budget variants (§5.4.1, the ablation of Fig. 7), `budget=`:
  - "time" (FB-vanilla, default): the adaptive time budget above, costed with the
    context term c·context.
  - "tokens" (FB-TB): a dynamic *token* budget, (init_time_budget − a)/b tokens, each
    new token costing b whatever its context (the paper: it "fails to estimate step time
    accurately when the average context length exceeds expectations").
  - "fixed" (FB-FB): no adaptive budget; the step holds the instance's fixed token budget
    (`max_num_batched_tokens`, as vLLM-sarathi), only the three-group order of §3.3 is
    FairBatching's.
FB-PAB (admission control) is the `pab` router with `reject=True` in front of this policy.

The step model is the paper's linear `batch_time = a + b·new_tokens + c·context` (§3.2),
fitted by least squares to the instance's estimator over the (tokens, context) range it
serves and scaled by the estimator's online correction β, so it tracks drift as the
estimator does. Token, seat and KV budgets are the BatchBuilder's; a request it cannot
place (memory, seats) is skipped, as Alg. 1 skips what does not fit. A decode short of KV
blocks preempts running requests from the end of the Alg. 1 order (non-urgent decodes
with the most slack first, recompute). When Alg. 1 would add nothing at all (every
request's context alone costs more than the budget) the first request in its order still
gets one token or the chunk the budget allows, so the engine never stalls (an addition:
with the published A100 coefficients the linear fit prices context so high that a
4-instance run stalled).
"""
from __future__ import annotations

import numpy as np

from triage.estimators import LatencyEstimator
from triage.estimators.base import nonneg_lstsq
from triage.plan import BatchPlan
from triage.policies.base import Policy, SchedulerView, register
from triage.policies.builder import BatchBuilder

URGENT_DECODE, PREFILL, NONURGENT_DECODE = 0, 1, 2


def linear_step_model(est: LatencyEstimator) -> tuple[float, float, float]:
    """(a, b, c) of `a + b·new_tokens + c·context`, uncorrected (multiply by β), fitted to
    the estimator's per-request times over decodes (1 token, context 16-8k) and prefill
    chunks (16-2k tokens, context 0-8k)."""
    rows, y = [], []
    for ctx in (16, 128, 512, 1024, 2048, 4096, 8192):
        rows.append((1.0, ctx))
        y.append(est._request_time(1, ctx))
    for lq in (16, 64, 256, 512, 1024, 2048):
        for ctx in (0, 512, 2048, 8192):
            rows.append((lq, ctx))
            y.append(est._request_time(lq, ctx))
    x = np.asarray(rows)
    b, c = nonneg_lstsq(x, np.asarray(y))  # absolute error: the chunks that fill a budget dominate
    return float(est.t_c), float(max(b, 1e-9)), float(c)


@register("fairbatching")
class FairBatching(Policy):
    BUDGETS = ("time", "tokens", "fixed")

    def __init__(self, budget: str = "time") -> None:
        if budget not in self.BUDGETS:
            raise ValueError(f"budget must be one of {', '.join(self.BUDGETS)}, got {budget!r}")
        self.budget = budget
        self._model: tuple[int, tuple[float, float, float]] | None = None

    def _abc(self, est: LatencyEstimator) -> tuple[float, float, float]:
        if self._model is None or self._model[0] != id(est):
            self._model = (id(est), linear_step_model(est))
        a, b, c = self._model[1]
        return a * est.beta, b * est.beta, c * est.beta

    def plan(self, view: SchedulerView, now: float) -> BatchPlan:
        j = view.joined()
        n_run, reqs = j.n_run, j.reqs
        if not reqs:
            return BatchPlan()
        # lines 13-20: slack and the adaptive time budget
        slack = j["deadline"] - now
        need = j["need"]
        context = j["computed"]
        seq = j["seq"]
        min_tpot = float(j["tpot"].min())
        init_time_budget = max(float(slack.min()), min_tpot)
        # lines 21-33: three groups, each by slack
        is_decode = np.concatenate([(j.running("need") == 1) & ~np.isnan(j.running("last_token")), np.zeros(view.columns.n, bool)])
        group = np.where(is_decode, np.where(slack < init_time_budget + min_tpot, URGENT_DECODE, NONURGENT_DECODE), PREFILL)
        order = np.lexsort((seq, slack, group)).tolist()

        # lines 34-48: fill by the linear model
        a, b_tok, c_ctx = self._abc(view.estimator)
        if self.budget == "tokens":         # FB-TB: tokens only, context not costed
            c_ctx = 0.0
        b = BatchBuilder(view)
        time_budget = init_time_budget - a if self.budget != "fixed" else float("inf")   # FB-FB: tokens decide
        victims = [reqs[i] for i in order if i < n_run]  # most slack, least urgent group last
        need_l, ctx_l = need.tolist(), context.tolist()
        admit_open = True  # as vLLM's waiting queue: the first admission that cannot get KV blocks or a seat closes it
        for i in order:
            if b.tokens_left <= 0 or time_budget < b_tok:
                break
            waiting = i >= n_run
            if waiting and (not admit_open or b.seats_left <= 0):
                continue
            r = reqs[i]
            if b.is_preempted(r):
                continue
            new_tokens, ctx_cost = int(need_l[i]), c_ctx * ctx_l[i]
            if b_tok * new_tokens + ctx_cost <= time_budget and new_tokens <= b.tokens_left:
                want = new_tokens                                                   # line 39
            elif ctx_cost <= time_budget:
                room = (time_budget - ctx_cost) / b_tok
                want = min(b.tokens_left, int(room) if room < b.tokens_left else b.tokens_left)  # line 43
                if want <= 0:
                    continue
            else:
                continue
            if not waiting and b.blocks_short(r, want) > 0 and not b.make_room(r, victims):
                continue
            k = b.add(r, want, use_time=False)
            if k:
                time_budget -= b_tok * k + ctx_cost
            elif waiting:
                admit_open = False
        if not b.tokens:
            # every request's context alone exceeds the budget (long contexts on a card
            # whose linear fit prices context high): Alg. 1 would add nothing and the
            # engine would stall. Run the first request in Alg. 1 order that can run,
            # one token if it decodes, else the chunk the budget allows (at least one).
            for i in order:
                r = reqs[i]
                if b.is_preempted(r) or (i >= n_run and (not admit_open or b.seats_left <= 0)):
                    continue
                room = max(time_budget - c_ctx * ctx_l[i], 0.0) / b_tok
                if b.add(r, max(1, min(int(need_l[i]), int(min(room, b.tokens_left)))), use_time=False):
                    break
        plan = b.build()
        plan.budget_s = init_time_budget if self.budget != "fixed" else None   # FB-FB: token budget only
        return plan
