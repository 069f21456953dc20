"""What the scheduler is told about each trace request: `--levels` and `--lengths`.

    oracle      the truth: the gold level, the output length the engine will produce
    predicted   each trace request gets a text drawn (seeded) from a labelled pool, among
                the texts whose gold level is the request's level (so oracle, noisy and
                predicted runs share their gold levels); the scheduler sees what our
                urgency model says about that text, and the length head's estimate
                (`length_tokens_estimate`, expected tokens). The engine still produces
                the trace's output length.
    noisy:E     a confusion of rate E (0 <= E <= 1), seeded:
                levels  — each request independently is mistaken with probability E; a
                          mistaken level moves to an *adjacent* level, up or down with
                          equal odds where both exist (ESI-1 → 2, ESI-5 → 4). So the
                          mean error distance of a mistake is one level (1/5 of the
                          scale: seed 004 §4.1's "error rate" at E = 0.2 exactly).
                lengths — each request independently is mistaken with probability E; a
                          mistaken length is doubled or halved with equal odds (one
                          bucket off on the length head's power-of-two edges 64/128/256/512).
                The draws are common to every E (one uniform per request): the requests
                mistaken at E = 0.1 are among those mistaken at E = 0.2, so an
                error-rate curve is not blurred by resampling.

Results are always grouped by *gold* level (`TraceRequest.level`). This module is pure:
the texts, their gold levels and the model's predictions come in as plain lists (the CLI
reads the pool and runs the predictors, `serving/cli/sim_inputs.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from triage.sim.traces import TraceRequest

LEVELS = (1, 2, 3, 4, 5)


@dataclass(frozen=True)
class Mode:
    kind: str               # oracle | predicted | noisy
    rate: float = 0.0       # noisy only

    def __str__(self) -> str:
        return f"noisy:{self.rate:g}" if self.kind == "noisy" else self.kind


def parse_mode(value: str | Mode | None, what: str = "--levels") -> Mode:
    """`oracle`, `predicted` or `noisy:E` with 0 <= E <= 1; a clear ValueError otherwise."""
    if isinstance(value, Mode):
        return value
    v = (value or "oracle").strip().lower()
    if v in ("oracle", "predicted"):
        return Mode(v)
    head, sep, tail = v.partition(":")
    if head == "noisy" and sep:
        try:
            e = float(tail)
        except ValueError:
            e = float("nan")
        if 0.0 <= e <= 1.0:
            return Mode("noisy", e)
        raise ValueError(f"{what} noisy:E needs an error rate E between 0 and 1, got {tail!r}")
    raise ValueError(f"{what} must be oracle, predicted or noisy:E (0 <= E <= 1), got {value!r}")


@dataclass(frozen=True)
class TextPool:
    """A labelled pool as plain data: gold level per text, and (when known) our
    classifier's level and the length head's estimate per text."""

    name: str
    gold: Sequence[int]
    kind: Sequence[str] | None = None
    level: Sequence[int] | None = None        # predicted level per text
    length: Sequence[int] | None = None       # predicted output tokens per text

    def __len__(self) -> int:
        return len(self.gold)


def _rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(stream)])


def noisy_levels(gold: Sequence[int], rate: float, seed: int = 0) -> np.ndarray:
    """The documented confusion: a fraction ~E of levels moved to an adjacent level."""
    g = np.asarray(gold, dtype=int)
    rng = _rng(seed, 2)
    u = rng.random(len(g))
    up = rng.random(len(g)) < 0.5
    step = np.where(up, 1, -1)
    step = np.where(g == LEVELS[0], 1, np.where(g == LEVELS[-1], -1, step))
    return np.where(u < rate, g + step, g)


def noisy_lengths(true: Sequence[int], rate: float, seed: int = 0) -> np.ndarray:
    t = np.asarray(true, dtype=int)
    rng = _rng(seed, 3)
    u = rng.random(len(t))
    up = rng.random(len(t)) < 0.5
    moved = np.where(up, t * 2, np.maximum(1, t // 2))
    return np.where(u < rate, moved, t)


def draw_texts(levels: Sequence[int], pool: TextPool, seed: int = 0) -> np.ndarray:
    """One pool index per request, seeded, among the texts of the request's gold level."""
    gold = np.asarray(pool.gold, dtype=int)
    by_level = {lv: np.flatnonzero(gold == lv) for lv in set(int(x) for x in levels)}
    missing = sorted(lv for lv, ix in by_level.items() if len(ix) == 0)
    if missing:
        raise ValueError(f"texts {pool.name!r} hold no text of gold level {missing}: cannot give those requests a text")
    rng = _rng(seed, 1)
    u = rng.random(len(levels))
    return np.array([by_level[int(lv)][int(x * len(by_level[int(lv)]))] for lv, x in zip(levels, u)], dtype=int)


def classifier_figures(gold: Sequence[int], seen: Sequence[int], kinds: Sequence[str] | None = None) -> dict:
    """How the levels the scheduler saw compare with gold: accuracy, under-triage of gold
    1-2 (seen at a less urgent level than 2), over-triage, per request (texts counted as
    often as they are used). Ordinary chat (kind "chat") is counted apart."""
    g = np.asarray(gold, dtype=int)
    s = np.asarray(seen, dtype=int)
    disp = np.ones(len(g), dtype=bool) if kinds is None else np.asarray([k != "chat" for k in kinds])
    gd, sd = g[disp], s[disp]
    crit = gd <= 2
    out: dict = {"n": int(len(gd))}
    if len(gd):
        out["accuracy"] = round(float(np.mean(gd == sd)), 4)
        out["mean_abs_error_levels"] = round(float(np.mean(np.abs(gd - sd))), 4)
        out["over_triage"] = round(float(np.mean(sd < gd)), 4)
    if crit.any():
        out["under_triage_1_2"] = round(float(np.mean(sd[crit] > 2)), 4)
        out["n_gold_1_2"] = int(crit.sum())
    one = gd == 1
    if one.any():
        out["esi1_recall"] = round(float(np.mean(sd[one] == 1)), 4)
    if not disp.all():
        chat = s[~disp]
        out["chat_n"] = int(len(chat))
        out["chat_at_level_1_2"] = round(float(np.mean(chat <= 2)), 4)
    return out


def apply_inputs(trace: Sequence[TraceRequest], *, levels: str | Mode = "oracle", lengths: str | Mode = "oracle",
                 pool: TextPool | None = None, seed: int = 0,
                 picks: Sequence[int] | None = None) -> tuple[list[TraceRequest], dict]:
    """The trace with what the scheduler is told set on every request, and a report:
    {"levels", "lengths", "texts", "classifier"} (classifier figures whenever the
    levels are not the oracle's; with texts also over the distinct texts used).
    `picks`: the pool index of every request when the texts are already chosen (the
    burst scenario); otherwise they are drawn by gold level (`draw_texts`)."""
    lv, ln = parse_mode(levels, "--levels"), parse_mode(lengths, "--lengths")
    trace = list(trace)
    info: dict = {"levels": str(lv), "lengths": str(ln)}
    gold = [t.level for t in trace]
    seen_level: list[int | None] = [None] * len(trace)
    seen_out: list[int | None] = [None] * len(trace)
    texts_needed = "predicted" in (lv.kind, ln.kind)
    if picks is not None:
        if pool is None or len(picks) != len(trace):
            raise ValueError("picks need a pool and one index per request")
        picks = np.asarray(picks, dtype=int)
        info["texts"] = pool.name
        info["distinct_texts"] = int(len(set(picks.tolist())))
    elif texts_needed:
        if pool is None:
            raise ValueError("--levels/--lengths predicted need a labelled text pool (--texts)")
        picks = draw_texts(gold, pool, seed)
        info["texts"] = pool.name
        info["distinct_texts"] = int(len(set(picks.tolist())))
    if lv.kind == "predicted":
        if pool.level is None:
            raise ValueError("the text pool carries no predicted levels")
        seen_level = [int(pool.level[i]) for i in picks]
    elif lv.kind == "noisy":
        seen_level = [int(x) for x in noisy_levels(gold, lv.rate, seed)]
    if ln.kind == "predicted":
        if pool.length is None:
            raise ValueError("the text pool carries no predicted lengths")
        seen_out = [max(1, int(pool.length[i])) for i in picks]
    elif ln.kind == "noisy":
        seen_out = [int(x) for x in noisy_lengths([t.output_len for t in trace], ln.rate, seed)]
    out = []
    for k, t in enumerate(trace):
        kw = {}
        if seen_level[k] is not None:
            kw["seen_level"] = seen_level[k]
        if seen_out[k] is not None:
            kw["seen_output"] = seen_out[k]
        if picks is not None and pool.kind is not None:
            kw["kind"] = pool.kind[picks[k]]
        out.append(replace(t, **kw) if kw else t)
    if lv.kind != "oracle":
        kinds = [t.kind for t in out]
        info["classifier"] = classifier_figures(gold, [t.scheduler_level for t in out], kinds)
        if picks is not None and lv.kind == "predicted":
            uniq = sorted(set(picks.tolist()))
            info["classifier"]["distinct_texts"] = classifier_figures(
                [pool.gold[i] for i in uniq], [pool.level[i] for i in uniq],
                [pool.kind[i] for i in uniq] if pool.kind is not None else None)
    if ln.kind != "oracle":
        true = np.asarray([t.output_len for t in out], dtype=float)
        seen = np.asarray([t.scheduler_output for t in out], dtype=float)
        info["length_error"] = {"mape": round(float(np.mean(np.abs(seen - true) / true)), 4),
                                "mean_seen": round(float(seen.mean()), 1), "mean_true": round(float(true.mean()), 1)}
    return out, info
