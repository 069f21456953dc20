"""Small factories for core tests: build states by hand, request by request."""
from __future__ import annotations

import itertools

from triage.classes import PriorityClass, PriorityClasses
from triage.estimators import ProServeEstimator
from triage.kv import CacheCosts, KVCache
from triage.profiles import Limits
from triage.request import KVResidency, Request, Stage
from triage.state import EngineState

# one time unit per prefill token, 10 ms per step, 1 ms per decode: easy to reason about
EST = dict(a_p=0.0, b_p=0.0, c_p=1e-4, a_d=0.0, b_d=1e-3, t_c=0.01)


def classes() -> PriorityClasses:
    rows = {1: (16, 1.0, 0.1), 2: (8, 2.0, 0.15), 3: (4, 4.0, 0.2), 4: (2, 8.0, 0.25), 5: (1, 16.0, 0.3)}
    return PriorityClasses({lv: PriorityClass(lv, f"L{lv}", w, t, tp) for lv, (w, t, tp) in rows.items()})


def make_state(*, blocks: int = 1000, block_size: int = 16, max_seqs: int = 256, max_tokens: int = 2048,
               kv_load: float | None = None) -> EngineState:
    est = ProServeEstimator(**EST)
    costs = CacheCosts.from_estimator(est, kv_load) if kv_load is not None else None
    return EngineState(KVCache(blocks, block_size), est, classes(), Limits(max_seqs, max_tokens, 32768), costs)


_seq = itertools.count()


def make_request(state: EngineState | None = None, *, level: int = 3, prompt: int = 100, output: int = 50,
                 arrival: float = 0.0, rid: str | None = None, seq: int | None = None) -> Request:
    c = classes().get(level)
    s = next(_seq) if seq is None else seq
    r = Request(id=rid or f"q{s}", arrival=arrival, prompt_len=prompt, predicted_level=level, ttft_slo=c.ttft,
                tpot_slo=c.tpot, weight=c.weight, predicted_output_len=output, output_len=output, seq=s)
    if state is not None:
        state.add(r)
    return r


def make_running(state: EngineState, *, level: int = 3, prompt: int = 100, generated: int = 5, output: int = 50,
                 arrival: float = 0.0, now: float = 1.0, rid: str | None = None, seq: int | None = None) -> Request:
    """A request admitted and decoding: its prompt and `generated` tokens are computed."""
    r = make_request(state, level=level, prompt=prompt, output=output, arrival=arrival, rid=rid, seq=seq)
    state.admit(r, arrival)
    state.allocate(r, r.need)
    state.advance(r, r.need, arrival + 0.05)  # prefill done: token 1
    for i in range(1, generated):
        state.allocate(r, 1)
        state.advance(r, 1, arrival + 0.05 + 0.01 * i)
    assert r.stage is Stage.DECODING and r.kv is KVResidency.DEVICE
    return r

