"""Per-system figures of an HTTP benchmark, always by *gold* level.

SLO attainment uses the papers' definition (seed 000 / 002): TTFT within the class's
TTFT SLO and the request's *mean* TPOT within its TPOT SLO; the largest gap between two
tokens is reported beside it. TDG is seed 000's envelope gain (triage.gain).
"""
from __future__ import annotations

import numpy as np

from serving.bench.loadgen import Result
from triage.classes import PriorityClasses
from triage.gain import request_gain
from triage.order_audit import Served, order_audit
from triage.request import Request


def _ms(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else round(1000.0 * x, 1)


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def _tpot_mean(r: Result) -> float | None:
    t = r.token_times()
    return (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None


def _max_gap(r: Result) -> float | None:
    t = r.token_times()
    return max(b - a for a, b in zip(t, t[1:])) if len(t) > 1 else None


def slo_ok(r: Result, classes: PriorityClasses) -> bool:
    c = classes.get(r.call.gold)
    tp = _tpot_mean(r)
    return r.ok and r.ttft < c.ttft and (tp is None or tp < c.tpot)


def group(results: list[Result], classes: PriorityClasses) -> dict:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok]
    tpot = [x for x in map(_tpot_mean, ok) if x is not None]
    gaps = [x for x in map(_max_gap, ok) if x is not None]
    return {"n": len(results), "completed": len(ok),
            "slo_attainment": round(sum(slo_ok(r, classes) for r in results) / len(results), 4) if results else None,
            "ttft_p50_ms": _ms(_pct(ttft, 50)), "ttft_p99_ms": _ms(_pct(ttft, 99)), "ttft_max_ms": _ms(max(ttft, default=None)),
            "tpot_mean_ms": _ms(float(np.mean(tpot)) if tpot else None),
            "max_gap_p99_ms": _ms(_pct(gaps, 99))}


def tdg_ratio(results: list[Result], classes: PriorityClasses) -> float:
    gain = ideal = 0.0
    for r in results:
        c = classes.get(r.call.gold)
        q = Request(id=str(r.call.idx), arrival=r.sent, prompt_len=1, predicted_level=r.call.gold, ttft_slo=c.ttft,
                    tpot_slo=c.tpot, output_len=r.call.max_tokens if r.call.ignore_eos else max(1, r.tokens))
        q.token_times = r.token_times() if r.ok else []
        g = request_gain(q, classes)
        gain, ideal = gain + g.gain, ideal + g.ideal
    return round(gain / ideal, 4) if ideal else 0.0


def classifier_figures(results: list[Result]) -> dict:
    """How the levels the system served at compare with gold (dispatch texts and chat)."""
    d = [r for r in results if r.level is not None and r.call.kind == "dispatch"]
    chat = [r for r in results if r.level is not None and r.call.kind == "chat"]
    crit = [r for r in d if r.call.gold <= 2]
    out = {"dispatch_n": len(d)}
    if d:
        out["accuracy"] = round(sum(r.level == r.call.gold for r in d) / len(d), 4)
    if crit:
        out["under_triage_1_2"] = round(sum(r.level > 2 for r in crit) / len(crit), 4)
    if chat:
        out["chat_n"] = len(chat)
        out["chat_at_level_1_2"] = round(sum(r.level <= 2 for r in chat) / len(chat), 4)
    return out


def summarize(results: list[Result], walls: list[float], classes: PriorityClasses) -> dict:
    ok = [r for r in results if r.ok]
    wall = float(sum(walls)) or float("nan")
    levels = sorted({r.call.gold for r in results})
    caught = [r for r in results if r.call.gold == 1 and r.level == 1]
    cg = group(caught, classes)
    out = {
        "completed": len(ok), "errors": len(results) - len(ok),
        "error_examples": sorted({r.error for r in results if r.error})[:3],
        "wall_s": round(wall / max(1, len(walls)), 2), "reps": len(walls),
        "tokens_per_s": round(sum(r.tokens for r in ok) / wall, 1) if ok else 0.0,
        "goodput_rps": round(sum(slo_ok(r, classes) for r in results) / wall, 3),
        "tdg_ratio": tdg_ratio(results, classes),
        "per_level": {str(lv): group([r for r in results if r.call.gold == lv], classes) for lv in levels},
        "chat": group([r for r in results if r.call.kind == "chat"], classes),
        "esi1_caught": {"n": cg["n"], "ttft_p50_ms": cg["ttft_p50_ms"], "ttft_p99_ms": cg["ttft_p99_ms"],
                        "ttft_max_ms": cg["ttft_max_ms"]},
        "classifier": classifier_figures(results),
        "client_late_max_ms": client_late_max_ms(results, len(walls)),
    }
    return out


ORDER_COUNTS = ("esi1_calls", "esi1_overtaken", "esi1_overtaken_by_later", "overtaken", "overtaken_by_later",
                "inversions")


def served_in_order(results: list[Result], where: dict[int, str] | None = None) -> dict | None:
    """The order check (triage/order_audit.py, the same as `GET /audit/order`) from the
    client's clock: each call at the level the system served it at, or, for a system told no
    level (stock vLLM fcfs), at our classifier's, so every system is judged by the same
    levels; on one engine, or per engine where `where` maps a call's index to the one that
    served it. A call that failed before its first token is left out (when it ended is not
    known). None without levels."""
    calls = [Served(str(i), lv, r.sent, r.first, r.end, where.get(r.call.idx) if where else None)
             for i, r in enumerate(results)
             if (r.first is not None or r.end is not None) and (lv := r.level or r.call.predicted) is not None]
    if not calls:
        return None
    rep = order_audit(calls)
    return {"esi1_calls": rep["esi1"]["calls"], "esi1_overtaken": rep["esi1"]["overtaken"],
            "esi1_overtaken_by_later": rep["esi1"]["overtaken_by_later"], "overtaken": rep["overtaken"],
            "overtaken_by_later": rep["overtaken_by_later"], "inversions": rep["inversions"],
            "tolerance_s": rep["tolerance_s"]}


def order_note(o: dict | None) -> str:
    """The order check on a benchmark's summary line."""
    return (f", ESI-1 calls overtaken by a less urgent one {o['esi1_overtaken']} of {o['esi1_calls']}, "
            f"by one that came later {o['esi1_overtaken_by_later']} ({o['inversions']} inversions in all)") if o else ""


def client_late_max_ms(results: list[Result], reps: int = 1) -> float | None:
    """How much later than planned the load generator posted its most delayed call (each
    repetition against its own start): tens of ms normally; a second means the machine
    itself stood still (a paused VM, a starved client), and every system's figures from
    that run are disturbed."""
    if not any(r.sent for r in results) or reps < 1 or len(results) % reps:
        return None
    k = len(results) // reps
    late = 0.0
    for i in range(reps):
        offs = [r.sent - r.call.at for r in results[i * k:(i + 1) * k] if r.sent]
        if offs:
            late = max(late, max(offs) - min(offs))
    return round(1000 * late, 1)


def received_timeline(results: list[Result], reps: int, width: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """The tokens/s a system's clients received, bin by bin (`width` s) since each repetition
    began (a call's send time less its planned offset), averaged over `reps` repetitions:
    (bin starts, rates). Where tokens/s is lost (a slow ramp while the calls arrive, a long
    tail) is where one system's line stands below another's."""
    t = np.array([tt - (r.sent - r.call.at) for r in results if r.ok for tt in r.token_times()])
    if not len(t):
        return np.zeros(0), np.zeros(0)
    counts, edges = np.histogram(t, bins=np.arange(0.0, t.max() + width, width))
    return edges[:-1], counts / width / max(1, reps)


def against(systems: dict[str, dict], baseline: str, turns_key: str = "turns") -> dict[str, dict]:
    """Each system's figures as multiples of `baseline`'s (issue 20's and 21's bars read
    straight from the JSON): tokens/s, and the first token p50 / p99 of the ESI-1 calls the
    classifier caught (a stock baseline without our levels has none: None) and of every gold
    ESI-1 call, pooled over the repetitions; and tokens/s repetition by repetition, each
    against the baseline's of the same number (how far the machine drifted between them; the
    repetitions are under `turns_key`); with it, over the repetitions in which the VM slowed
    neither system (`quiet_turns`, `tokens_per_s_quiet`: a turn whose baseline ran in a slow
    spell of the VM flatters the system against it, or the other way round; None where every
    turn was slowed or none reports its steal; `_quiet`). Empty without the baseline."""
    base = systems.get(baseline)
    if not base:
        return {}

    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    def esi1(r: dict, k: str):
        return (r.get("esi1_caught") or {}).get(k)

    def gold1(r: dict, k: str):
        return ((r.get("per_level") or {}).get("1") or {}).get(k)

    step = _typical_step_ms(systems.values(), turns_key)
    out = {}
    for name, r in systems.items():
        if name == baseline:
            continue
        out[name] = {"tokens_per_s": ratio(r.get("tokens_per_s"), base.get("tokens_per_s")),
                     "esi1_ttft_p50": ratio(esi1(r, "ttft_p50_ms"), esi1(base, "ttft_p50_ms")),
                     "esi1_ttft_p99": ratio(esi1(r, "ttft_p99_ms"), esi1(base, "ttft_p99_ms")),
                     "gold1_ttft_p50": ratio(gold1(r, "ttft_p50_ms"), gold1(base, "ttft_p50_ms")),
                     "gold1_ttft_p99": ratio(gold1(r, "ttft_p99_ms"), gold1(base, "ttft_p99_ms"))}
        if r.get(turns_key) and base.get(turns_key):
            pairs = list(zip(r[turns_key], base[turns_key]))
            out[name]["tokens_per_s_turns"] = [ratio(a["tokens_per_s"], b["tokens_per_s"]) for a, b in pairs]
            quiet = [(a, b) for a, b in pairs if _quiet(a, step) and _quiet(b, step)]
            out[name]["quiet_turns"] = len(quiet)
            out[name]["tokens_per_s_quiet"] = ratio(sum(a["tokens_per_s"] for a, _ in quiet),   # None: none quiet
                                                    sum(b["tokens_per_s"] for _, b in quiet))
    return out


QUIET_STEAL_S = 0.5   # a repetition in which the hypervisor took less CPU than this from the VM
QUIET_STEP_SPREAD = 0.25   # ... and whose engine CPU a step is within this share of the run's typical


def _typical_step_ms(systems, turns_key: str) -> float | None:
    """The median engine CPU a step (`engine_cpu_ms_a_step`) over every system's repetitions:
    the same model on the same engine sizes, so what one step costs differs little between
    systems (measured 2026-12-05: within 5 % of the median) and a lot when the host is slow (+50 %)."""
    xs = sorted(t["engine_cpu_ms_a_step"] for r in systems for t in r.get(turns_key) or []
                if t.get("engine_cpu_ms_a_step"))
    return xs[len(xs) // 2] if len(xs) >= 3 else None


def _quiet(rep: dict, typical_step_ms: float | None = None) -> bool:
    """A repetition that reports its VM steal (`vm_steal_s`) and was not slowed by it, nor
    by a slow spell of the host that steal does not show: its engine's CPU a step more than
    `QUIET_STEP_SPREAD` off the run's typical (2026-12-05: stock's turn took 77.5 CPU-s for
    the 320 steps another took in 50.5, with 0.05 CPU-s of steal)."""
    steal = rep.get("vm_steal_s")
    if steal is None or steal >= QUIET_STEAL_S:
        return False
    ms = rep.get("engine_cpu_ms_a_step")
    return not (ms and typical_step_ms) or abs(ms / typical_step_ms - 1) <= QUIET_STEP_SPREAD


def engine_cpu_ms_a_step(cpu_s: float | None, steps: int | None) -> float | None:
    """A repetition's engine CPU seconds over its engine steps, in ms (None where either is unknown)."""
    return round(1000 * cpu_s / steps, 1) if cpu_s and steps else None


def against_line(name: str, baseline: str, x: dict) -> str:
    """One system's `against` figures as a line for a person (the benches print it on stderr)."""
    quiet = (f"; {x['tokens_per_s_quiet']} over the {x['quiet_turns']} of {len(x['tokens_per_s_turns'])} "
             "turns the VM did not slow"
             if x.get("tokens_per_s_quiet") is not None and x["quiet_turns"] < len(x["tokens_per_s_turns"]) else "")
    return (f"{name} x {baseline}: tokens/s {x['tokens_per_s']} (turns {x.get('tokens_per_s_turns', '-')}{quiet}), "
            f"ESI-1 first token p50 {x['esi1_ttft_p50']}, p99 {x['esi1_ttft_p99']} "
            f"(gold ESI-1: {x['gold1_ttft_p50']}, {x['gold1_ttft_p99']})")


def steal_note(steal_s: float | None) -> str:
    """A run's line gets a warning when the hypervisor took more than a second of CPU from
    the VM while it ran (`vm_steal_s`): its figures, and any comparison with a system run
    at another time, carry that slow spell."""
    if not steal_s or steal_s < 1.0:
        return ""
    return f", VM steal {steal_s} CPU-s (the VM was slowed: compare with care)"
