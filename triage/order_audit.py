"""Was the most urgent call served first? Urgency inversions, read off recorded times.

The claim under test: once the service has a call, no call of a less urgent level is
started ahead of it, whether it waits in the front end's queue or in the engine's. From
what every request records (its level, its arrival or the operator's last relabel: when
the service knew it at that level, its first token, which engine served it) an inversion
is a pair on one engine:

    A more urgent than B (a lower level number),
    B's first token came more than `tolerance_s` after A was known   (B had not started
        when A came: A's classification and B's prefill take less than `tolerance_s`, a
        prompt is prefilled within one capped step on the CPU engine, so B's first token
        later than that was scheduled after A was there; B already running when A came is
        not an inversion, the design does not preempt for it below ESI-1,
        docs/preemption.md),
    and B's first token came more than `tie_s` before A's             (A still waited:
        first tokens of one step differ by the relay's jitter, not by a step).

A call that never had a first token (shed, cancelled, failed) waited until it ended; one
with neither is left out. Calls on different engines never form a pair (which engine a
call goes to is the router's decision, reported by the cluster benchmark, not this check).

Of the inversions, those where B came after A (B known later than A) are counted apart
(`overtaken_by_later`): the queue was jumped outright, with no step that began before A
came to excuse it. An inversion by a B that was already there when A came can also be an
engine step longer than `tolerance_s` that started B's prefill before A arrived (stock
vLLM alone on one CPU core prefilled a burst's first ~25 prompts in one ~3-s step,
docs/measurements/cluster.md); one by a later B cannot.

A sweep over time, per engine and level, counts every inverted pair in O(n log n +
inverted pairs): a call, at its first token, meets only the more urgent calls waiting then.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

DEFAULT_TOLERANCE_S = 1.0
DEFAULT_TIE_S = 0.05


@dataclass(frozen=True)
class Served:
    id: str
    level: int                 # the level it was served at (after any relabel)
    known: float               # since when the service had it at that level (arrival, or the last relabel)
    first_token: float | None  # its first token, None if it never had one
    ended: float | None        # when it ended (finish), for calls without a first token
    instance: str | None = None

    @property
    def left_queue(self) -> float | None:
        return self.first_token if self.first_token is not None else self.ended


def order_audit(calls: list[Served], *, tolerance_s: float = DEFAULT_TOLERANCE_S, tie_s: float = DEFAULT_TIE_S,
                examples: int = 20) -> dict:
    """Every urgency inversion among `calls` (see the module doc): per level, how many
    calls were overtaken and how often; the worst `examples` overtaken calls (longest
    wait after the first call that overtook them). `ok` is true when no ESI-1 call was
    overtaken."""
    if tolerance_s < 0 or tie_s < 0:
        raise ValueError("tolerance_s and tie_s must be >= 0")
    events: list[tuple[float, int, Served]] = []   # (time, kind, call)
    LEAVE, SERVE, ENTER = 0, 1, 2    # at one instant: leave the waiting set, serve, enter (the bounds are strict)
    for c in calls:
        left = c.left_queue
        if left is None:
            continue
        if left - tie_s > c.known + tolerance_s:   # it waited past the tolerance: it can be overtaken
            events.append((c.known + tolerance_s, ENTER, c))
            events.append((left - tie_s, LEAVE, c))
        if c.first_token is not None:
            events.append((c.first_token, SERVE, c))
    events.sort(key=lambda e: (e[0], e[1]))
    waiting: dict[str | None, dict[int, dict[str, Served]]] = defaultdict(lambda: defaultdict(dict))   # instance, level
    overtaken: dict[str, dict] = {}
    pairs: dict[tuple[int, int], int] = defaultdict(int)   # (level overtaken, level that overtook) -> pairs
    later_pairs = 0                                          # ... of which the overtaker came after
    for t, kind, c in events:
        w = waiting[c.instance]
        if kind == ENTER:
            w[c.level][c.id] = c
        elif kind == LEAVE:
            w[c.level].pop(c.id, None)
        else:
            for lv in [lv for lv in w if lv < c.level]:
                for a in w[lv].values():
                    pairs[(a.level, c.level)] += 1
                    o = overtaken.get(a.id)
                    if o is None:
                        overtaken[a.id] = o = {"call": a, "by": 0, "by_later": 0, "first": c}
                    o["by"] += 1
                    if c.known > a.known:   # it came after A: the queue was jumped
                        o["by_later"] += 1
                        later_pairs += 1
    return _report(calls, overtaken, pairs, later_pairs, tolerance_s, tie_s, examples)


def _report(calls, overtaken, pairs, later_pairs, tolerance_s, tie_s, examples) -> dict:
    per_level: dict[int, dict] = {}
    for c in calls:
        d = per_level.setdefault(c.level, {"calls": 0, "overtaken": 0, "overtaken_by_later": 0,
                                           "overtaken_by_levels": {}})
        d["calls"] += 1
    for o in overtaken.values():
        d = per_level[o["call"].level]
        d["overtaken"] += 1
        d["overtaken_by_later"] += o["by_later"] > 0
    for (la, lb), n in sorted(pairs.items()):
        by = per_level[la]["overtaken_by_levels"]
        by[str(lb)] = by.get(str(lb), 0) + n
    worst = sorted(overtaken.values(), key=lambda o: o["call"].left_queue - o["first"].first_token, reverse=True)
    esi1 = per_level.get(1, {"calls": 0, "overtaken": 0, "overtaken_by_later": 0})
    return {
        "calls": len(calls),
        "inversions": sum(pairs.values()),
        "inversions_by_later": later_pairs,
        "overtaken": len(overtaken),
        "overtaken_by_later": sum(o["by_later"] > 0 for o in overtaken.values()),
        "ok": esi1["overtaken"] == 0,
        "esi1": {"calls": esi1["calls"], "overtaken": esi1["overtaken"],
                 "overtaken_by_later": esi1["overtaken_by_later"]},
        "per_level": {str(lv): per_level[lv] for lv in sorted(per_level)},
        "tolerance_s": tolerance_s, "tie_s": tie_s,
        "worst": [_example(o) for o in worst[:examples]],
    }


def _example(o: dict) -> dict:
    a, b = o["call"], o["first"]
    return {"id": a.id, "level": a.level, "instance": a.instance, "known": a.known,
            "first_token": a.first_token, "ended": a.ended, "overtaken_by": o["by"],
            "overtaken_by_later": o["by_later"],
            "first_overtaker": {"id": b.id, "level": b.level, "first_token": b.first_token},
            "waited_after_s": round(a.left_queue - b.first_token, 6)}
