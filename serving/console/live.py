"""The live queue as the operator console shows it: one row per live request.

    live_view(frontend, now, with_text=True)   # {"waiting": [...], "running": [...], ...}

A request is *waiting* while it sits in the front-end's queue or inside the engine
before its first token, and *running* once tokens flow. Each row carries what a
dispatcher needs to judge it: age, the classifier's probabilities, predicted vs
effective level, predicted length, the slack to its next token deadline (seed 000/002's
envelope: deadline(i) = arrival + TTFT + (i-1)·TPOT), instance and tokens so far.

`text` (the first words of the caller's message) is included only when `with_text` is
true: the console passes it for operators, never for auditors. It comes from
`Job.preview`, which lives in memory with the request and is never stored or logged.
"""
from __future__ import annotations

from typing import Any

PREVIEW_WORDS = 12
PREVIEW_CHARS = 120


def preview_words(text: str, words: int = PREVIEW_WORDS, chars: int = PREVIEW_CHARS) -> str:
    """The first `words` words of `text` (at most `chars` characters), '…' when cut."""
    parts = (text or "").split()
    head = " ".join(parts[:words])
    cut = len(parts) > words
    if len(head) > chars:
        head, cut = head[:chars].rstrip(), True
    return head + ("…" if cut else "")


def deadline_slack(job, now: float) -> float:
    """Seconds until the request's next token is due (negative: already late)."""
    i = job.output_tokens + 1
    return job.arrival + job.ttft_slo + (i - 1) * job.tpot_slo - now


def row(job, now: float, *, instance: str | None, position: int | None, with_text: bool) -> dict[str, Any]:
    p = job.prediction
    out = {
        "request_id": job.id,
        "state": "running" if job.output_tokens > 0 else "waiting",
        "where": "queue" if job.stage == "queued" else "engine",
        "position": position,
        "age_s": round(now - job.arrival, 3),
        "level": job.level,
        "predicted_level": job.predicted_level,
        "classifier_level": getattr(p, "predicted_level", None) if p is not None else None,
        "override_level": job.override_level,
        "probs": [round(float(x), 4) for x in getattr(p, "probs", ())] if p is not None else [],
        "predicted_output_len": job.predicted_output_len,
        "max_tokens": job.max_tokens,
        "prompt_tokens": job.prompt_tokens,
        "output_tokens": job.output_tokens,
        "ttft_slo": job.ttft_slo,
        "tpot_slo": job.tpot_slo,
        "slack_s": round(deadline_slack(job, now), 3),
        "preemptions": job.preemptions,
        "instance": instance,
    }
    if with_text:
        out["text"] = job.preview
    return out


def live_view(fe, now: float, *, with_text: bool) -> dict[str, Any]:
    instance = getattr(fe.backend, "instance", None)
    positions = {j.id: i for i, j in enumerate(fe.queue.ordered())}
    rows = [row(j, now, instance=instance, position=positions.get(j.id), with_text=with_text)
            for j in list(fe.jobs.values()) if j.stage != "done" and j.prediction is not None]
    # most urgent first; within a level the front-end queue's order, then age
    rows.sort(key=lambda r: (r["level"], r["position"] if r["position"] is not None else -1, -r["age_s"]))
    levels = [{"level": c.level, "name": c.name, "ttft": c.ttft, "tpot": c.tpot}
              for c in (fe.classes.classes[k] for k in fe.classes.levels)]
    return {"at": now, "classes_version": fe.classes.version, "levels": levels, "text": with_text,
            "waiting": [r for r in rows if r["state"] == "waiting"],
            "running": [r for r in rows if r["state"] == "running"]}
