"""Per-request fields on the wire between the front end and a `triage instance`.

vLLM 0.32's OpenAI server lets two things through to the engine's scheduler:

* `priority` (body field, or the `X-Vllm-Priority` header): an int, lower runs earlier in
  vLLM's own priority policy. We send the effective ESI level, so an instance without
  our scheduler class still orders by urgency (stock `--scheduling-policy priority`).
* `vllm_xargs` -> `SamplingParams.extra_args`: a flat dict of str/int/float (vLLM's
  schema refuses nested objects). Our fields travel as flat keys:

      triage_id                 the front end's request id (the step log and /triage/load speak it)
      triage_level              effective level (also the priority)
      triage_ttft_slo, triage_tpot_slo     seconds
      triage_predicted_output_len          tokens
      triage_waited_s           seconds the call had waited at the front end when sent

  `triage_waited_s` instead of an absolute arrival time: the instance may sit on another
  host whose clock differs; it rebuilds arrival = its own arrival_time - waited.

In process (`serving.engine`) the same fields travel as `extra_args["triage"] = {...}`
with an absolute `arrival`; `request_fields` reads both forms.
"""
from __future__ import annotations

import json
from typing import Any

PREFIX = "triage_"
KEYS = ("id", "level", "ttft_slo", "tpot_slo", "predicted_output_len")


def wire_xargs(*, request_id: str, level: int, ttft_slo: float, tpot_slo: float, predicted_output_len: int,
               waited_s: float) -> dict[str, str | int | float]:
    """The `vllm_xargs` body field for one request (flat, as vLLM's schema wants)."""
    return {f"{PREFIX}id": str(request_id), f"{PREFIX}level": int(level), f"{PREFIX}ttft_slo": float(ttft_slo),
            f"{PREFIX}tpot_slo": float(tpot_slo), f"{PREFIX}predicted_output_len": int(predicted_output_len),
            f"{PREFIX}waited_s": round(max(0.0, float(waited_s)), 6)}


def request_fields(extra_args: dict | None, arrival_time: float | None = None) -> dict[str, Any]:
    """Our fields from a request's `SamplingParams.extra_args`, as the scheduler wants
    them: {"id", "level", "ttft_slo", "tpot_slo", "predicted_output_len", "arrival"}
    (only those present). Accepts the in-process nested form (`{"triage": {...}}`, also
    as a JSON string) and the flat wire form (`triage_level`, ...). Values that do not
    parse are dropped (the scheduler falls back to `priority` and the class table)."""
    xa = extra_args or {}
    nested = xa.get("triage")
    if isinstance(nested, str):
        try:
            nested = json.loads(nested)
        except ValueError:
            nested = None
    if isinstance(nested, dict):
        return dict(nested)
    out: dict[str, Any] = {}
    casts = {"id": str, "level": int, "ttft_slo": float, "tpot_slo": float, "predicted_output_len": int}
    for k, cast in casts.items():
        v = xa.get(PREFIX + k)
        if v is None:
            continue
        try:
            out[k] = cast(v)
        except (TypeError, ValueError):
            continue
    waited = xa.get(PREFIX + "waited_s")
    if waited is not None and arrival_time is not None:
        try:
            out["arrival"] = float(arrival_time) - max(0.0, float(waited))
        except (TypeError, ValueError):
            pass
    return out
