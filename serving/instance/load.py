"""The load snapshot a `triage instance` answers at `GET /triage/load`.

Built inside vLLM's EngineCore process by our scheduler class (control op "load" of
`TriageScheduler.triage_control`), between two engine steps, so it is consistent:

    {"time": <the scheduler's clock>, "scheduler": "TriageScheduler", "policy": "triage",
     "profile": "vllm-cpu-smollm2", "block_size": 32, "kv_blocks": 2047, "free_blocks": 1900,
     "max_num_seqs": 32, "max_model_len": 2048, "classes_version": 1,
     "estimator": {"kind": "proserve", "a_p": ..., "t_c": ..., "beta": 1.07},
     "waiting": [REQ, ...], "running": [REQ, ...], "stats": {...TriageStats...}}

    REQ = {"id": front end's id (else vLLM's), "level", "stage", "prompt", "computed",
           "generated", "need" (tokens before the next token), "remaining" (predicted
           output tokens still to come), "slack_s" (next token deadline - now),
           "ttft_slo", "tpot_slo"}

No prompt text, ever. `slack_s` is relative, so a router on another host needs no
synchronised clock.
"""
from __future__ import annotations

from typing import Any


def _row(r, cid: dict, now: float) -> dict[str, Any]:
    return {"id": cid.get(r.id, r.id), "level": int(r.level), "stage": r.stage.name.lower(),
            "prompt": int(r.prompt_len), "computed": int(r.computed), "generated": int(r.generated),
            "need": int(r.need), "remaining": int(r.remaining_output), "slack_s": round(r.next_deadline - now, 4),
            "ttft_slo": float(r.ttft_slo), "tpot_slo": float(r.tpot_slo)}


def load_snapshot(sched) -> dict[str, Any]:
    """`sched`: a running `serving.vllm_scheduler.TriageScheduler`."""
    st = sched.tstate
    now = sched.clock()
    cid = getattr(sched, "_client_id", {})
    est = st.estimator
    e = est.to_dict() if hasattr(est, "to_dict") else {}
    e["beta"] = float(est.beta)
    stats = sched.triage_stats()
    return {
        "time": now, "scheduler": type(sched).__name__, "policy": stats.get("policy"), "profile": stats.get("profile"),
        "block_size": int(sched.block_size), "kv_blocks": int(st.kv.num_blocks),
        "free_blocks": int(sched.kv_cache_manager.block_pool.get_num_free_blocks()),
        "max_num_seqs": int(sched.max_num_active_reqs), "max_model_len": int(sched.max_model_len),
        "classes_version": sched.next_classes_version(), "estimator": e,   # a queued edit's: next step's table
        "waiting": [_row(r, cid, now) for r in st.waiting],
        "running": [_row(r, cid, now) for r in st.running],
        "stats": stats,
    }
