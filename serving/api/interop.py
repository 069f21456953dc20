"""The priority and objectives the way the serving ecosystem speaks them, on the way in.

    X-Vllm-Priority: 2          vLLM 0.32's own header (`GenerateBaseServing._get_priority`):
                                the same as the body's `priority` (an ESI level here), and
                                like it honoured for operator keys only
    x-llm-d-slo-ttft-ms: 500    llm-d's objective headers: the same as the body's
    x-llm-d-slo-tpot-ms: 80     `slo.ttft_ms` / `slo.tpot_ms`

The body wins where both are given. A header that is not a number is a 400 naming it.
On the way out (to the engine instances) the remote backend sends the same three
headers with the call's effective level and SLOs (serving/backends/remote.py), and
every response carries `X-Triage-Level` and `X-Triage-Request-Id`.
"""
from __future__ import annotations

import math
from typing import Mapping

from serving.api.errors import APIError

PRIORITY = "x-vllm-priority"
SLO_TTFT = "x-llm-d-slo-ttft-ms"
SLO_TPOT = "x-llm-d-slo-tpot-ms"


def _number(headers: Mapping[str, str], name: str, cast, lo: float, hi: float):
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        v = cast(raw.strip())
    except ValueError:
        raise APIError(400, f"header {name} must be a number, got {raw[:40]!r}", param=name) from None
    if not (math.isfinite(v) and lo <= v <= hi):
        raise APIError(400, f"header {name} must be in [{lo:g}, {hi:g}], got {raw[:40]!r}", param=name)
    return v


def with_interop_headers(headers: Mapping[str, str], body):
    """`body` with `priority` and `slo` filled from the headers where it has none."""
    from serving.api.schemas import SLO

    update: dict = {}
    prio = _number(headers, PRIORITY, int, -(2 ** 31), 2 ** 31 - 1)
    if prio is not None and getattr(body, "priority", None) is None:
        update["priority"] = prio
    ttft = _number(headers, SLO_TTFT, float, 1e-3, 3_600_000)
    tpot = _number(headers, SLO_TPOT, float, 1e-3, 600_000)
    if (ttft is not None or tpot is not None) and hasattr(body, "slo"):
        cur = body.slo
        update["slo"] = SLO(ttft_ms=cur.ttft_ms if cur and cur.ttft_ms is not None else ttft,
                            tpot_ms=cur.tpot_ms if cur and cur.tpot_ms is not None else tpot)
    return body.model_copy(update=update) if update else body
