"""`triage bench serve`: the same calls, over HTTP, to our service and to stock vLLM.

    scenario "burst": N calls within S seconds (a mass-casualty spike): dispatch texts
        from a labelled pool and ordinary chat prompts, seeded order and offsets,
        temperature 0, `max_tokens` fixed; R repetitions per system.
    scenario "trace": a trace's arrival times (scaled by rate_scale) with dispatch texts,
        the trace's output lengths as `max_tokens` with `ignore_eos`.

Systems take turns on the same machine, the same model, engine sizes and port; each is
started, measured on an idle call (the first-token floor), loaded, and stopped. With
`turns` (the default; `--no-turns` runs each system's repetitions back to back), each
repetition is a turn of its own: every system is started for repetition 1, then every
system for repetition 2 in reverse order, ..., so a VM whose speed drifts over the minutes
of a run (a shared host) charges the drift to every system alike.
`vllm-priority` gets each call's `priority` from *our* classifier (computed once here):
the strongest thing a user could assemble from stock vLLM and our predictor.
`triage-instance` gets the same: `triage instance`, stock vLLM's server with our scheduler
class inside, i.e. our engine half without our front end (what it costs on its own).
"""
from __future__ import annotations

import asyncio
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from serving.bench.loadgen import Call, Result, idle_ttft, run_calls
from serving.bench.report import _pct, engine_cpu_ms_a_step, served_in_order, summarize
from serving.bench.systems import (MODEL_NAME, PRIORITY_FED, EngineSizes, dir_name, is_triage, reset_prefix_cache,
                                   start_system)
from serving.bench.texts import Text, classify

IDLE_TEXT = "My father collapsed and is not breathing."


def burst_calls(pool: list[Text], chat: list[Text], n: int, spread: float, *, seed: int = 0,
                chat_share: float = 40 / 98, max_tokens: int = 64) -> list[Call]:
    rng = np.random.default_rng(seed)
    n_chat = int(round(n * chat_share)) if chat else 0
    picks = [pool[i] for i in rng.choice(len(pool), n - n_chat, replace=n - n_chat > len(pool))]
    picks += [chat[i % len(chat)] for i in rng.permutation(max(n_chat, 1))[:n_chat]] if chat else []
    order = rng.permutation(n)
    at = np.sort(rng.uniform(0.0, spread, n)) if spread > 0 else np.zeros(n)
    return [Call(k, picks[i].text, picks[i].gold, picks[i].kind, float(at[k]), max_tokens)
            for k, i in enumerate(order.tolist())]


def trace_calls(trace: str, pool: list[Text], n: int, rate_scale: float, *, seed: int = 0,
                max_tokens_cap: int = 256) -> list[Call]:
    from triage.sim.traces import load_trace

    reqs = load_trace(trace, limit=n, rate_scale=rate_scale, seed=seed)
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(pool), len(reqs), replace=len(reqs) > len(pool))
    return [Call(k, pool[i].text, pool[i].gold, pool[i].kind, float(t.arrival),
                 max(1, min(int(t.output_len), max_tokens_cap)), ignore_eos=True)
            for k, (t, i) in enumerate(zip(reqs, picks.tolist()))]


def with_predictions(calls: list[Call]) -> list[Call]:
    texts = sorted({c.text for c in calls})
    level = dict(zip(texts, classify(texts)))
    return [Call(**{**asdict(c), "predicted": level[c.text]}) for c in calls]


@dataclass
class Turn:
    """What one start of a system measured: its calls' results, the wall of each
    repetition, the idle first-token time, and the CPU seconds it spent while loaded."""

    results: list[Result] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    floors: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)
    # per engine counter (`ENGINE_COUNTERS`: steps, tokens, preemptions), its growth in each
    # repetition, where the server's /metrics says
    work: dict[str, list[int]] = field(default_factory=dict)
    steals: list[float] = field(default_factory=list)   # the VM's steal seconds per repetition
    engine_cpu: list[float] = field(default_factory=list)   # the engine's CPU seconds per repetition

    def add(self, other: "Turn") -> "Turn":
        self.results += other.results
        self.walls += other.walls
        self.floors += other.floors
        for k, v in other.work.items():
            self.work.setdefault(k, []).extend(v)
        self.steals += other.steals
        self.engine_cpu += other.engine_cpu
        for k, v in other.cpu_s.items():
            self.cpu_s[k] = self.cpu_s.get(k, 0.0) + v
        return self


def run_turn(name: str, calls: list[Call], reps: int, sizes: EngineSizes, *, port: int, workdir: Path, model: str,
             on_done: Callable[[Result], None] | None = None, triage_env: dict | None = None,
             warm_cache: bool = False) -> Turn:
    """Start `name`, time an idle call, replay `calls` `reps` times, stop it. Before each
    repetition the prefix cache is emptied (unless `warm_cache`): the same calls again would
    find their prompts cached, which new calls never do (measured: 5,211 prompt tokens
    computed in a first burst, 1,250 in a repeat; docs/measurements/single-engine.md)."""
    turn = Turn()
    with start_system(name, sizes, port=port, workdir=workdir / dir_name(name), model=model,
                      triage_env=triage_env) as srv:
        turn.floors.append(asyncio.run(idle_ttft(srv.url, srv.key, MODEL_NAME, IDLE_TEXT)))
        cpu0 = cpu_seconds(srv.proc.pid)
        for _ in range(reps):
            if not warm_cache:
                reset_prefix_cache(srv)
            # settled both times: the probes and prefix-cache reset just before ran steps our
            # service's counter may not show yet (it polls its engine every 0.5 s); read
            # unsettled, those steps were charged to the burst (6-12 of ~150, measured
            # 2026-12-04 against the step log)
            count0, steal0 = engine_counters(srv.url, settle_s=STEPS_SETTLE_S), steal_seconds()
            engine0 = cpu_seconds(srv.proc.pid).get("engine", 0.0)
            res = asyncio.run(run_calls(srv.url, srv.key, MODEL_NAME, calls, send_priority=name in PRIORITY_FED,
                                        on_done=on_done))
            turn.steals.append(steal_seconds() - steal0)
            turn.engine_cpu.append(cpu_seconds(srv.proc.pid).get("engine", 0.0) - engine0)
            count1 = engine_counters(srv.url, settle_s=STEPS_SETTLE_S)
            for k in count0.keys() & count1.keys():
                turn.work.setdefault(k, []).append(count1[k] - count0[k])
            sent = [r.sent for r in res if r.sent]
            ends = [r.end for r in res if r.end is not None]
            turn.walls.append(max(ends) - min(sent) if ends and sent else float("nan"))
            turn.results.extend(res)
        cpu1 = cpu_seconds(srv.proc.pid)
    turn.cpu_s = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
    return turn


def report_system(name: str, turn: Turn, workdir: Path) -> dict:
    out = summarize(turn.results, turn.walls, _classes())
    if is_triage(name):
        out["esi1_caught_split"] = esi1_time_split(turn.results, f"sqlite:///{workdir / dir_name(name) / 'audit.db'}")
    out["idle_ttft_ms"] = round(1000 * statistics.median(turn.floors), 1)
    out["order"] = served_in_order(turn.results)
    # where the CPU went while loaded: the API process (HTTP, our classifier and front end)
    # and the engine processes (vLLM's EngineCore, which holds the scheduler, and its workers)
    out["cpu_s"] = {k: round(v, 1) for k, v in turn.cpu_s.items()}
    # per repetition: how many engine steps it took (fewer, fuller steps serve more tokens/s),
    # the tokens its engine computed (recomputed prompts included) and the preemptions
    for k, key in REPORT_KEYS.items():
        if turn.work.get(k):
            out[key] = turn.work[k]
    if turn.steals:  # CPU time the hypervisor took while this system was measured
        out["vm_steal_s"] = round(sum(turn.steals), 2)
    # each repetition on its own, in the order run (with --turns, one per start): how far
    # the VM's speed drifted during the run, beside the pooled figures above
    n = len(turn.walls)
    if n > 1 and len(turn.results) % n == 0:
        k = len(turn.results) // n
        classes = _classes()
        reps = [summarize(turn.results[i * k:(i + 1) * k], turn.walls[i:i + 1], classes) for i in range(n)]
        out["per_rep"] = [{"wall_s": r["wall_s"], "tokens_per_s": r["tokens_per_s"],
                           "esi1_ttft_p50_ms": r["esi1_caught"]["ttft_p50_ms"]} for r in reps]
        for r, st in zip(out["per_rep"], turn.steals):   # one steal figure per repetition (run_turn)
            r["vm_steal_s"] = round(st, 2)
        # what a step cost the engine, repetition by repetition: a slow spell of the host shows
        # here when steal does not (`report._quiet`); the engine's CPU seconds against the wall
        # show another process taking the cores
        for r, cpu, steps in zip(out["per_rep"], turn.engine_cpu, turn.work.get("steps") or []):
            r["engine_cpu_ms_a_step"] = engine_cpu_ms_a_step(cpu, steps)
            r["engine_cpu_s"] = round(cpu, 2)
    return out


def run_system(name: str, calls: list[Call], reps: int, sizes: EngineSizes, *, port: int, workdir: Path, model: str,
               on_done: Callable[[Result], None] | None = None,
               triage_env: dict | None = None) -> tuple[dict, list[Result]]:
    """One start of `name`, `reps` repetitions: its report and raw results."""
    turn = run_turn(name, calls, reps, sizes, port=port, workdir=workdir, model=model, on_done=on_done,
                    triage_env=triage_env)
    return report_system(name, turn, workdir), turn.results


def esi1_time_split(results: list[Result], db_url: str) -> dict:
    """Where a caught ESI-1 call's first token time goes, from our service's audit rows
    (server clock): `front_ms` = arrival to hand-over to the engine (reading the call,
    classifying it, the front-end queue); `engine_ms` = hand-over to first token (waiting
    for a seat or a step, the prefill, the first decode). The client's TTFT adds HTTP."""
    from sqlalchemy import select

    from serving.db.models import RequestRow
    from serving.db.session import make_engine

    ids = [r.request_id for r in results if r.call.gold == 1 and r.level == 1 and r.ok and r.request_id]
    if not ids:
        return {"n": 0}
    eng = make_engine(db_url)
    try:
        with eng.connect() as c:
            rows = c.execute(select(RequestRow.arrival, RequestRow.dispatched, RequestRow.first_token)
                             .where(RequestRow.id.in_(ids))).all()
    finally:
        eng.dispose()
    front = [1000 * (d - a) for a, d, f in rows if d is not None and f is not None]
    engine = [1000 * (f - d) for a, d, f in rows if d is not None and f is not None]
    pct = lambda xs, q: None if not xs else round(_pct(xs, q), 1)  # noqa: E731
    return {"n": len(front), "front_ms_p50": pct(front, 50), "front_ms_p99": pct(front, 99),
            "engine_ms_p50": pct(engine, 50), "engine_ms_p99": pct(engine, 99)}


STEPS_SETTLE_S = 0.6   # our service's step counter trails its engine by up to 0.5 s


def engine_counters(url: str, settle_s: float = 0.0) -> dict[str, int]:
    """The engine's counters so far, read from the server's /metrics (`counters_in`); our
    service polls its engine every 0.5 s: `settle_s` waits that out. {} when unreadable."""
    import time

    import httpx

    time.sleep(settle_s)
    try:
        return counters_in(httpx.get(url + "/metrics", timeout=5).text)
    except httpx.HTTPError:
        return {}


# what a /metrics says about the engine's work: steps (stock vLLM and `triage instance`: the
# per-step histogram's count), tokens computed (the same histogram's sum: prompt chunks, decodes
# and recomputed prompts of preempted requests) and preemptions; our service exports the three
# as counters of its own. A counter that is absent is left out, never guessed.
ENGINE_COUNTERS = {"steps": ("vllm:iteration_tokens_total_count", "triage_engine_steps_total"),
                   "tokens": ("vllm:iteration_tokens_total_sum", "triage_engine_tokens_total"),
                   "preemptions": ("vllm:num_preemptions_total", "triage_engine_preemptions_total")}
# the JSON key each counter's growth is reported under (`bench serve` per repetition,
# `bench cluster` per instance)
REPORT_KEYS = {"steps": "engine_steps", "tokens": "engine_tokens", "preemptions": "preemptions"}


def counters_in(metrics_text: str) -> dict[str, int]:
    """`ENGINE_COUNTERS` found in a Prometheus text, each summed over its label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {n: key for key, ns in ENGINE_COUNTERS.items() for n in ns}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(metrics_text):
        for smp in fam.samples:
            if smp.name in names:
                out[names[smp.name]] = out.get(names[smp.name], 0.0) + smp.value
    return {k: int(v) for k, v in out.items()}


def steps_in(metrics_text: str) -> int | None:
    """The engine step count in a Prometheus text (`counters_in`); None when it holds none."""
    return counters_in(metrics_text).get("steps")


def steal_seconds() -> float:
    """CPU seconds the hypervisor has taken from this VM since boot (`steal` in /proc/stat,
    summed over its CPUs; 0 where the kernel does not report it). Over a repetition, time
    during which the engine's cores were not ours: a VM's slow spell that would otherwise be
    charged to whichever system ran through it."""
    import psutil

    return float(getattr(psutil.cpu_times(), "steal", 0.0))


def cpu_seconds(pid: int) -> dict[str, float]:
    """user+system CPU seconds of a server's main process and of its descendants."""
    import psutil

    try:
        main = psutil.Process(pid)
        t = main.cpu_times()
        out = {"api": t.user + t.system, "engine": 0.0}
        for c in main.children(recursive=True):
            try:
                ct = c.cpu_times()
                out["engine"] += ct.user + ct.system
            except psutil.Error:
                pass
        return out
    except psutil.Error:
        return {}


def _classes():
    from triage.classes import load_classes
    from triage.profiles import load_profile

    return load_classes().scaled(load_profile("vllm-cpu-smollm2").slo_scale)


def slo_scale() -> float:
    from triage.profiles import load_profile

    return load_profile("vllm-cpu-smollm2").slo_scale
