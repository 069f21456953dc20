"""Read a step log (setting `step_log`, docs/preemption.md "See it happen") and say where a
busy spell's steps and time went: how long the seats took to fill, how many steps ran
until the queue emptied, how long the tail drained, what a step costs (a least-squares fit
of the model time on decodes and prompt tokens), which steps stalled far past that cost
and whether the engine was computing or waiting for a core, which ran slow on cores other
work held (an arrival spike's classifier beside the engine), what was preempted and why,
and each level's answer lengths. `triage steps FILE` prints it; `--plot` draws it; `--request ID`
follows one call instead (`follow`).

A busy spell is a stretch with a queue: from the step that admitted its first arrivals
(back from the first step that left a request waiting, to the step after the engine last
stood empty or after an idle gap) to the last step before an idle gap (`idle_gap_s` in which
no step ran) after the queue last held one. So two policies replaying the same calls are
read from the same first call (a policy that takes the first arrivals in a few large steps
leaves nobody waiting in them; its spell must not start a second later than one's that
queues sooner). One log can hold
several: bursts apart in time, or engines started one after another writing to one file
(`bench serve` taking turns; a step number that does not grow starts a new engine's
steps). Each is found and listed; the report reads one of them in full (the first unless
asked). A log in which nothing ever waited is read whole.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

TRIM_SD = 2.5   # a step this many residual s.d. off the step-cost fit is left out of it
STALL_X, STALL_MIN_MS = 3.0, 500.0   # a step this many times its fitted cost and this much over it is a stall
STARVED_SHARE = 0.5   # a stall with less than this part of an ordinary step's CPU share waited for a core
# a step of at least SHARED_MIN_MS (the CPU times are 10-ms ticks) that ran SHARED_X times its
# fitted cost with less than SHARED_SHARE of an ordinary step's CPU share ran on cores shared with other work
SHARED_MIN_MS, SHARED_X, SHARED_SHARE = 100.0, 1.25, 0.8


class StepLogError(ValueError):
    """The file is not a step log this module can read (the message says why)."""


def load(path: str | Path) -> list[dict]:
    """The step records with work in them, in order. A partial last line (the log of a
    running server) is skipped; a file with no step record is refused."""
    p = Path(path)
    if not p.is_file():
        raise StepLogError(f"no step log at {p}")
    rows = []
    with p.open(encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("ran"):
                rows.append(rec)
    if not rows:
        raise StepLogError(f"{p} holds no step record with work in it (is it a step log? see docs/preemption.md)")
    return rows


def busy_windows(rows: list[dict], idle_gap_s: float = 1.0) -> list[tuple[int, int]]:
    """(first, last) index of every busy spell (module docstring), inclusive, in order;
    the whole log as one when nothing ever waited."""
    out: list[tuple[int, int]] = []
    a = 0
    for b in range(1, len(rows) + 1):   # stretches of steps, cut at idle gaps and engine restarts
        if b < len(rows) and not _breaks(rows, b, idle_gap_s):
            continue
        waited = [i for i in range(a, b) if rows[i].get("waiting", 0) > 0]
        if waited:   # from the step that admitted the first arrivals (back from the first wait
            # to the step after the engine last stood empty) to the stretch's end
            s = waited[0]
            while s > a and rows[s - 1].get("ran"):
                s -= 1
            out.append((s, b - 1))
        a = b
    return out or [(0, len(rows) - 1)]


def busy_window(rows: list[dict], idle_gap_s: float = 1.0, spell: int = 1) -> tuple[int, int]:
    """(first, last) index of the `spell`-th busy spell (from 1), inclusive."""
    return _pick(busy_windows(rows, idle_gap_s), spell)


def _pick(spells: list[tuple[int, int]], spell: int) -> tuple[int, int]:
    if not 1 <= spell <= len(spells):
        raise StepLogError(f"the log holds {len(spells)} busy spell{'s' * (len(spells) != 1)}, not a spell {spell}")
    return spells[spell - 1]


def _breaks(rows: list[dict], i: int, idle_gap_s: float) -> bool:
    """Step record i begins a new stretch: an idle gap before it, or another engine's steps
    (its step number does not follow on)."""
    prev, step = rows[i - 1].get("step"), rows[i].get("step")
    restarted = prev is not None and step is not None and step <= prev
    return restarted or _idle_before(rows, i) >= idle_gap_s


def _idle_before(rows: list[dict], i: int) -> float:
    """Seconds in which no step ran before step record i: from the end of the step before
    it (its `t` is when it was scheduled, plus its model time) to i's `t`. A long step is
    not an idle gap."""
    prev = rows[i - 1]
    return rows[i]["t"] - prev["t"] - (prev.get("exec_ms") or 0) / 1000


def _decodes(r: dict) -> int:
    return sum(1 for x in r["ran"] if x[3] == "decode")


def _prompt_tokens(r: dict) -> int:
    return sum(x[2] for x in r["ran"] if x[3] != "decode")


def step_cost(rows: list[dict]) -> dict | None:
    """Model time a step (`exec_ms`) ~ fixed + per decode x decodes + per prompt token x
    prompt tokens, fitted by least squares, refitted without the steps more than TRIM_SD
    residual s.d. off (up to three rounds; `dropped` counts them: steps slowed by other work
    on the same cores, such as the front end's classifier during an arrival spike); None
    when the steps cannot separate the three."""
    timed = [r for r in rows if r.get("exec_ms") is not None]
    if len(timed) < 8:
        return None
    x = np.array([[1.0, _decodes(r), _prompt_tokens(r)] for r in timed])
    y = np.array([r["exec_ms"] for r in timed], dtype=float)
    if np.linalg.matrix_rank(x) < 3:
        return None
    keep = np.ones(len(y), dtype=bool)
    for round_ in range(4):   # the fit, then up to three refits without the steps it leaves far off
        coef, *_ = np.linalg.lstsq(x[keep], y[keep], rcond=None)
        resid = y - x @ coef
        sd = float(np.std(resid[keep]))
        trimmed = np.abs(resid) <= TRIM_SD * sd
        if round_ == 3 or trimmed.sum() < 8 or np.linalg.matrix_rank(x[trimmed]) < 3 or (trimmed == keep).all():
            break
        keep = trimmed
    return {"fixed_ms": round(float(coef[0]), 2), "per_decode_ms": round(float(coef[1]), 3),
            "per_prompt_token_ms": round(float(coef[2]), 3), "residual_sd_ms": round(sd, 2),
            "steps": int(keep.sum()), "dropped": int((~keep).sum())}


def stalls(rows: list[dict], cost: dict | None, most: int = 10) -> dict | None:
    """The steps far slower than the step-cost fit says their work takes (`STALL_X` times it
    and `STALL_MIN_MS` over): how many, the seconds they lost, and the worst `most` of them
    (`at_s` from the first row). Where the log has the model's CPU time (`exec_cpu_ms`; older
    logs do not) each says what the engine did meanwhile: "starved" when it got
    less than `STARVED_SHARE` of the CPU share of the other steps (it waited for a core:
    other work on its cores, or the VM's host), "computing" otherwise (the engine itself
    worked longer: a compilation, page faults). Every step of a busy spell waits on a stall
    (an urgent call's next token too), so a dispatch centre wants to know which it was. None
    without a fit."""
    if cost is None:
        return None
    t0 = rows[0]["t"]
    found = [(r, e) for r, e in _timed(rows, cost) if _stalled(r, e)]
    usual = _usual_share(rows, cost)
    out = []
    for r, expected in sorted(found, key=lambda x: x[0]["exec_ms"] - x[1], reverse=True)[:most]:
        share = r["exec_cpu_ms"] / r["exec_ms"] if r.get("exec_cpu_ms") is not None else None
        verdict = None if share is None or not usual else "starved" if share < STARVED_SHARE * usual else "computing"
        out.append({"step": r.get("step"), "at_s": round(r["t"] - t0, 3), "exec_ms": round(r["exec_ms"], 1),
                    "expected_ms": round(expected, 1), "cpu_share": None if share is None else round(share, 3),
                    "sys_ms": r.get("exec_sys_ms"), "verdict": verdict})
    return {"n": len(found), "lost_s": round(sum(r["exec_ms"] - e for r, e in found) / 1000, 3),
            "usual_cpu_share": None if usual is None else round(usual, 3), "worst": out}


def shared_cores(rows: list[dict], cost: dict | None) -> dict | None:
    """The steps that ran slow because other work held the model's cores: at least
    `SHARED_MIN_MS` long, `SHARED_X` times their fitted cost or more, with the model's CPU
    share under `SHARED_SHARE` of an ordinary step's (stalls included). On two cores shared
    with the front end these are a burst's first steps, while its classifier reads the
    arrivals (docs/measurements/single-engine.md, 2026-12-07 late morning): the seconds
    lost there are throughput lost and every queued urgent call's wait. `n`, `lost_s`
    (model time over the fitted cost), when each ran (`at_s`, from the first row) and the
    model's CPU share in them beside the usual; None without a fit or without CPU times in
    the log."""
    usual = _usual_share(rows, cost)
    if not usual:
        return None
    t0 = rows[0]["t"]
    hit = [(r, e, r["exec_cpu_ms"] / r["exec_ms"]) for r, e in _timed(rows, cost)
           if r.get("exec_cpu_ms") is not None and r["exec_ms"] >= SHARED_MIN_MS and r["exec_ms"] >= SHARED_X * e
           and r["exec_cpu_ms"] / r["exec_ms"] < SHARED_SHARE * usual]
    shares = [x for *_, x in hit]
    return {"n": len(hit), "lost_s": round(sum(r["exec_ms"] - e for r, e, _ in hit) / 1000, 3),
            "at_s": [round(r["t"] - t0, 3) for r, *_ in hit],
            "cpu_share_min": round(min(shares), 3) if hit else None,
            "cpu_share_max": round(max(shares), 3) if hit else None, "usual_cpu_share": round(usual, 3)}


def _timed(rows: list[dict], cost: dict) -> list[tuple[dict, float]]:
    """(step, its model time by the fitted cost in ms) for every step with a model time."""
    return [(r, cost["fixed_ms"] + cost["per_decode_ms"] * _decodes(r) + cost["per_prompt_token_ms"] * _prompt_tokens(r))
            for r in rows if r.get("exec_ms") is not None]


def _stalled(r: dict, expected_ms: float) -> bool:
    return r["exec_ms"] > max(STALL_X * expected_ms, expected_ms + STALL_MIN_MS)


def _usual_share(rows: list[dict], cost: dict | None) -> float | None:
    """The model's CPU time over its wall time in the steps that did not stall (with two
    OpenMP threads ~2): what an ordinary step of this log gets; None without a fit or CPU times."""
    if cost is None:
        return None
    cpu_ms = wall_ms = 0.0
    for r, e in _timed(rows, cost):
        if not _stalled(r, e) and r.get("exec_cpu_ms") is not None:
            cpu_ms, wall_ms = cpu_ms + r["exec_cpu_ms"], wall_ms + r["exec_ms"]
    return cpu_ms / wall_ms if wall_ms > 0 else None


def engine_steps(rows: list[dict]) -> list[tuple[list[tuple[int, int]], float]]:
    """Every timed step as the simulator's measured truth takes it (`simulate --truth
    steplog:FILE`, triage/sim/truth.py): ([(tokens computed, tokens already in the KV), ...
    one per request], model seconds). A request's KV is counted from the log itself (its
    prompt chunks and decodes so far; back to 0 when it is preempted to be recomputed), so a
    prefix-cache hit, which the log does not show, is missing from it."""
    kv: dict[str, int] = defaultdict(int)
    out = []
    for r in rows:
        works = []
        for rid, _, k, kind in r["ran"]:
            n = 1 if kind == "decode" else int(k)
            works.append((n, kv[rid]))
            kv[rid] += n
        for p in r.get("preempted", []):
            if p.get("mode") == "recompute":
                kv[p.get("id")] = 0
        if works and (r.get("exec_ms") or 0) > 0:
            out.append((works, r["exec_ms"] / 1000))
    return out


def _free_while_waiting(w: list[dict], seats: int) -> dict:
    """Capacity a spell's steps left unused while calls waited: the steps that ran fewer
    than `seats` requests with a queue, the seats they could have filled (free seats, at
    most the calls waiting) and those seats x the step's time until the next (seat-seconds).
    A burst's ramp shows here: the step cap and an urgent call's short first step admit a
    prompt or two a step while seats stand free, where a scheduler filling every seat in
    one long step shows none (and an urgent arrival waits for that step)."""
    steps, seat_steps, seat_s = 0, 0, 0.0
    for i, r in enumerate(w):
        free = min(seats - len(r["ran"]), r.get("waiting", 0))
        if free <= 0:
            continue
        dur = (w[i + 1]["t"] - r["t"]) if i + 1 < len(w) else (r.get("exec_ms") or 0) / 1000
        steps, seat_steps, seat_s = steps + 1, seat_steps + free, seat_s + free * dur
    return {"steps": steps, "seat_steps": seat_steps, "seat_s": round(seat_s, 3)}


def summarize(rows: list[dict], idle_gap_s: float = 1.0, spell: int = 1) -> dict:
    """The report `triage steps --json` prints (module docstring): `busy` and the rest for
    the `spell`-th busy spell, and `spells`, every spell's `busy` figures."""
    spells = busy_windows(rows, idle_gap_s)
    a, b = _pick(spells, spell)
    w = rows[a:b + 1]
    costs = [step_cost(rows[i:j + 1]) for i, j in spells]   # each spell's own: an idle engine's steps run slower
    figures = [_busy(rows[i:j + 1], c) for (i, j), c in zip(spells, costs)]
    calls = defaultdict(lambda: [None, 1, 0])   # id -> [level, answer tokens, prompt tokens]
    for r in w:
        for rid, lvl, k, kind in r["ran"]:
            c = calls[rid]
            c[0] = lvl
            if kind == "decode":
                c[1] += 1   # from 1: the first token comes with the prompt's last chunk
            else:
                c[2] += k
    by_level = defaultdict(list)
    for lvl, answer, prompt in calls.values():
        by_level[lvl].append((answer, prompt))
    cap = max((c[1] for c in calls.values()), default=0)
    pre = [p for r in w for p in r.get("preempted", [])]
    return {
        "steps": len(rows),
        "spell": spell,
        "busy": figures[spell - 1],
        "spells": figures,
        "step_cost": costs[spell - 1],   # the spell only: an idle engine's steps run slower (cold caches, clocks)
        "preemptions": {"n": len(pre), "by_reason": dict(Counter(p.get("reason") for p in pre)),
                        "by_mode": dict(Counter(p.get("mode") for p in pre)),
                        "out_of_seat": out_of_seat(w)},
        "levels": {str(lvl): {"requests": len(cs), "mean_tokens": round(sum(a for a, _ in cs) / len(cs), 1),
                              "at_longest": sum(1 for a, _ in cs if a == cap),
                              "mean_prompt_tokens": round(sum(p for _, p in cs) / len(cs), 1)}
                   for lvl, cs in sorted(by_level.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))},
    }


def out_of_seat(w: list[dict]) -> dict:
    """Per level of the preempted calls: how long each was out of its seat, from the step
    that preempted it to the next step it ran in (the stall its stream shows mid-answer,
    a recompute's prompt included), p50 and max; `not_resumed`: calls that never ran again
    in the spell."""
    gaps: dict = defaultdict(list)
    out: dict = {}   # id -> (level, when preempted), until it runs again
    for r in w:
        for e in r["ran"]:
            if e[0] in out:
                lv, t = out.pop(e[0])
                gaps[lv].append(r["t"] - t)
        for p in r.get("preempted", []):
            out[p.get("id")] = (p.get("level"), r["t"])
    missing = Counter(lv for lv, _ in out.values())
    levels = sorted(set(gaps) | set(missing), key=lambda lv: (lv is None, lv or 0))
    return {str(lv): {"n": len(gaps[lv]) + missing[lv],
                      "p50_s": round(float(np.median(gaps[lv])), 3) if gaps[lv] else None,
                      "max_s": round(max(gaps[lv]), 3) if gaps[lv] else None,
                      "not_resumed": missing[lv]} for lv in levels}


def _busy(w: list[dict], cost: dict | None) -> dict:
    """One busy spell's figures: its steps and time, how long the seats took to fill, the
    steps that ran every seat, the steps until the queue emptied and the tail after it."""
    t0 = w[0]["t"]
    seats = max(len(r["ran"]) for r in w)
    full = next(i for i, r in enumerate(w) if len(r["ran"]) >= seats)
    waited = [i for i, r in enumerate(w) if r.get("waiting", 0) > 0]
    last_wait = waited[-1] if waited else 0
    return {
        "first_step": w[0].get("step"), "last_step": w[-1].get("step"), "steps": len(w),
        "wall_s": round(w[-1]["t"] - t0, 3),
        "seats_seen": seats,
        "seats_full_after": {"steps": full, "s": round(w[full]["t"] - t0, 3)},
        "steps_every_seat": sum(1 for r in w if len(r["ran"]) >= seats),
        "steps_to_last_admission": last_wait,
        "tail": {"steps": len(w) - 1 - last_wait, "s": round(w[-1]["t"] - w[last_wait]["t"], 3)},
        "mean_running": round(sum(len(r["ran"]) for r in w) / len(w), 2),
        "seats_free_while_waiting": _free_while_waiting(w, seats),
        "decodes": sum(_decodes(r) for r in w), "prompt_tokens": sum(_prompt_tokens(r) for r in w),
        "model_s": round(sum(r.get("exec_ms") or 0 for r in w) / 1000, 3),
        "sched_s": round(sum(r.get("sched_ms") or 0 for r in w) / 1000, 3),
        "update_s": round(sum(r.get("update_ms") or 0 for r in w) / 1000, 3),
        "stalls": stalls(w, cost),
        "shared_cores": shared_cores(w, cost),
    }


def plot(rows: list[dict], path: str | Path, idle_gap_s: float = 1.0, spell: int = 1) -> Path:
    """PNG of the `spell`-th busy spell: requests running and waiting at each step, and each step's
    model time; a preemption is a red mark."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from triage.sim.figure import save_figure

    a, b = busy_window(rows, idle_gap_s, spell)
    w = rows[a:b + 1]
    t = np.array([r["t"] - w[0]["t"] for r in w])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True, height_ratios=(2, 1))
    top.step(t, [len(r["ran"]) for r in w], where="post", label="ran in the step")
    top.step(t, [r.get("waiting", 0) for r in w], where="post", label="waiting")
    pre = [(ti, len(r["ran"])) for ti, r in zip(t, w) if r.get("preempted")]
    if pre:
        top.scatter(*zip(*pre), color="red", marker="v", zorder=3, label="preemption")
    top.set_ylabel("requests")
    top.legend(loc="upper right")
    bottom.bar(t, [r.get("exec_ms") or 0 for r in w], width=np.diff(t, append=t[-1]) * 0.9 if len(t) > 1 else 0.1,
               align="edge", color="grey")
    bottom.set_ylabel("model ms")
    bottom.set_xlabel("seconds since the busy spell began")
    fig.suptitle("engine steps (step log)")
    return save_figure(fig, path, dpi=110)


def follow(rows: list[dict], request_id: str) -> dict:
    """One call through the log (`triage steps FILE --request ID`): its level, the steps its
    prompt ran in, the step whose end brought its first token (the last prompt chunk before
    its first decode), its decodes, the steps it was preempted in and for whom, and the calls
    it displaced. StepLogError when the log never ran it."""
    mine = [(r, x) for r in rows for x in r["ran"] if x[0] == request_id]
    if not mine:
        raise StepLogError(f"the log never ran {request_id!r}")
    t0 = mine[0][0]["t"]
    first_decode = next((k for k, (_, x) in enumerate(mine) if x[3] == "decode"), len(mine))
    prompt_before = [r for r, x in mine[:first_decode] if x[3] != "decode"]   # none: the log began mid-answer
    ft = prompt_before[-1] if prompt_before else None
    pre = [(r, p) for r in rows for p in r.get("preempted", [])]
    return {
        "id": request_id, "level": mine[0][1][1], "first_step": mine[0][0].get("step"), "last_step": mine[-1][0].get("step"),
        "prompt_steps": [{"step": r.get("step"), "tokens": x[2], "beside": len(r["ran"]) - 1} for r, x in mine if x[3] != "decode"],
        "first_token": ft and {"step": ft.get("step"),   # out when that step's model time is over
                               "s_after_first_step": round(ft["t"] + (ft.get("exec_ms") or 0) / 1000 - t0, 3)},
        "decodes": sum(1 for _, x in mine if x[3] == "decode"),
        "preempted": [{"step": r.get("step"), **{k: p.get(k) for k in ("reason", "for", "for_level", "mode")}}
                      for r, p in pre if p.get("id") == request_id],
        "displaced": [{"step": r.get("step"), **{k: p.get(k) for k in ("id", "level", "reason", "mode")}}
                      for r, p in pre if p.get("for") == request_id],
    }
