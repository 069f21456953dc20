"""`triage bench cluster`: N local `triage instance` servers behind one `triage serve
--backend remote`, the same calls once per router.

    for router in routers:
        start (or keep) N instances: vLLM API servers with our scheduler class, each bound
            to its own core(s) on a CPU machine, warmed up by one wave of seats once started;
        empty their prefix caches (every router meets the same cold cache);
        start the front end: `triage serve --backend remote --instances ... --router R`
            (its own SQLite audit database per router);
        replay the calls (bench serve's texts, load generator and report), optionally
            SIGKILL instance 0 (its whole process group) `kill_at` seconds in;
        stop the front end (its writer drains), read its audit rows.

The baseline `stock_round_robin` is two stock vLLM priority instances (`triage instance
--stock`: vLLM's own scheduler, `--scheduling-policy priority`) with the calls dealt to
them in turn by the load generator, each carrying our classifier's level as `priority`
(computed once, as `bench serve`'s `vllm-priority`): the strongest thing a user could
assemble from stock vLLM and our predictor, without our front end.

Per router: completed, errors (ended with a clear error: an HTTP status with a JSON
message, or an SSE error event), lost (neither: a broken connection, a stream that ended
without [DONE], or a request with no audit row), TDG ratio, goodput, per gold level SLO
attainment and first-token percentiles (serving.bench.report).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from serving.bench.loadgen import Call, Result, run_calls
from serving.bench.report import (ORDER_COUNTS, against, engine_cpu_ms_a_step, order_note, served_in_order,
                                  steal_note, summarize)
from serving.bench.serve import REPORT_KEYS, cpu_seconds, engine_counters, steal_seconds
from serving.bench.systems import (BENCH_ROLE_LIMITS, KEY_LINE, MODEL_NAME, BenchError, EngineSizes, Server, alternating,
                                   port_free, require_free_port, reset_prefix_cache, stop)

BASELINE = "stock_round_robin"
ROUTER_NAMES = ("gorouting", "min_load", "pab", "round_robin", BASELINE)
REPO = Path(__file__).resolve().parents[2]


# Co-located on one CPU box, the instances' engine processes (EngineCore and workers, not
# their HTTP servers) can run at a lower priority than the front end (`--engine-nice N`), so
# that the front end, which classifies every call before its level is known, is not
# starved by the engines. By default they run as stock vLLM does (0), as the single-process
# service runs its engine (`EngineConfig.engine_nice`): on a slow 2-core VM niced engines
# spent 13-22 CPU-s more a burst than stock's and served fewer tokens/s (0.76x against
# 0.80-0.84x of stock's at 0), while calls waited 0.23 s (p50) in the front end against
# 0.54-0.60 s at 0, for the same ESI-1 first token overall (docs/measurements/cluster.md, 2026-11-26).
ENGINE_NICE = 0


@dataclass
class ClusterPlan:
    instances: int = 2
    base_port: int = 8300
    front_port: int = 8390
    sizes: EngineSizes = field(default_factory=EngineSizes)
    kill_at: float | None = None
    workdir: Path = Path("/tmp/triage-bench-cluster")
    nice: int = 0           # the front end's nice value; the instances' engines run engine_nice lower
    engine_nice: int = ENGINE_NICE
    bind: bool = True       # CPU: instance i pinned to its own core(s); False: "nobind", threads float
    eager: bool = False     # --enforce-eager: no torch.compile warm-up (minutes on a busy 2-core machine)


def _cpus(i: int, n: int) -> str:
    ncpu = os.cpu_count() or 1
    if n >= ncpu:
        return str(i % ncpu)
    per = ncpu // n
    return f"{i * per}-{i * per + per - 1}" if per > 1 else str(i * per)


def _popen(cmd: list[str], env: dict, log: Path, nice: int) -> subprocess.Popen:
    """Start a front end or an instance in a process group of its own (killed as one) but in
    this session. Under the kernel's autogroup scheduling (`sched_autogroup_enabled`, on
    here and in many distribution kernels) every *session* is a scheduling group with an
    equal claim on the CPU, and nice values count only inside a group: instances in
    sessions of their own competed with the front end as equals however far their engines
    were niced, and calls waited 0.03-2.3 s (p50) in the front end before hand-over; in
    one session, 11-16 ms (docs/measurements/cluster.md, 2026-11-26)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pre = ["nice", "-n", str(nice)] if nice else []
    with log.open("ab") as f:
        return subprocess.Popen(pre + cmd, stdout=f, stderr=subprocess.STDOUT, env=env, process_group=0,
                                cwd=str(REPO))


def start_instance(i: int, plan: ClusterPlan, *, stock: bool, model: str) -> Server:
    from serving.engine import vllm_env
    from serving.instance.launch import instance_command

    port = plan.base_port + i
    require_free_port(port)
    s = plan.sizes
    cmd = instance_command(port, model=model, stock=stock, max_num_seqs=s.max_num_seqs,
                           max_num_batched_tokens=s.max_num_batched_tokens, max_model_len=s.max_model_len,
                           extra=["--enforce-eager"] if plan.eager else None)
    ncpu = os.cpu_count() or 1
    if plan.bind:
        env = vllm_env(kv_cache_gib=s.kv_cache_gib, cpus=_cpus(i, plan.instances))
    else:
        env = vllm_env(kv_cache_gib=s.kv_cache_gib, cpus="nobind", threads=max(1, ncpu // plan.instances))
    env["VLLM_SERVER_DEV_MODE"] = "1"   # POST /reset_prefix_cache between routers (reset_prefix_cache)
    name = f"instance{i}{'-stock' if stock else ''}"
    proc = _popen(cmd, env, plan.workdir / f"{name}.log", plan.nice)
    return Server(name, f"http://127.0.0.1:{port}", None, proc, plan.workdir / f"{name}.log")


def wait_instance(srv: Server, timeout_s: float = 600.0, engine_nice: int = ENGINE_NICE) -> None:
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if srv.proc.poll() is not None:
            raise BenchError(f"{srv.name} exited with code {srv.proc.returncode} while starting; its log "
                             f"({srv.log}) ends:\n{srv.log_tail()}")
        try:
            r = httpx.post(srv.url + "/v1/completions", timeout=30,
                           json={"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2, "temperature": 0})
            if r.status_code == 200:
                from serving.engine import cpu_only, lower_engine_priority

                if cpu_only() and engine_nice > 0:
                    lower_engine_priority(engine_nice, srv.proc.pid)
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise BenchError(f"{srv.name} did not become ready within {timeout_s:.0f} s; its log ends:\n{srv.log_tail()}")


def start_front(router: str, urls: list[str], plan: ClusterPlan, model: str, tag: str) -> Server:
    from serving.engine import vllm_env

    d = plan.workdir / f"front-{tag}"
    d.mkdir(parents=True, exist_ok=True)
    for f in ("audit.db", "spool.jsonl"):
        (d / f).unlink(missing_ok=True)
    env = vllm_env()
    env.update({"TRIAGE_PORT": str(plan.front_port), "TRIAGE_DB_URL": f"sqlite:///{d / 'audit.db'}",
                "TRIAGE_SPOOL_PATH": str(d / "spool.jsonl"), "TRIAGE_BACKEND": "remote",
                "TRIAGE_INSTANCES": ",".join(urls), "TRIAGE_ROUTER": router, "TRIAGE_MODEL": model,
                "TRIAGE_MAX_MODEL_LEN": str(plan.sizes.max_model_len),
                # as bench serve's: the benchmark's one client key must not meet the per-key caps
                # (at 128 concurrent calls a slow run was refused 429, counted as errors)
                "TRIAGE_ROLE_LIMITS": BENCH_ROLE_LIMITS,
                # stalls of a quarter second are counted and logged with where (front_pauses)
                "TRIAGE_LOOP_STALL_WARN_S": "0.25"})
    if not port_free(plan.front_port):
        raise BenchError(f"port {plan.front_port} is in use: pass another --port")
    cmd = [sys.executable, "-m", "serving.cli", "serve", "--log-level", "warning"]
    log = d / "front.log"
    if log.exists():   # an earlier turn's (its stalls are logged with where): kept as front.log.1, .2, ...
        log.rename(d / f"front.log.{1 + sum(1 for _ in d.glob('front.log.*'))}")
    proc = _popen(cmd, env, log, plan.nice)   # as the instances' HTTP servers, ENGINE_NICE above their engines
    srv = Server(f"front-{tag}", f"http://127.0.0.1:{plan.front_port}", None, proc, log, {"dir": d})
    import httpx

    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"the front end exited with code {proc.returncode}; its log ends:\n{srv.log_tail()}")
        if srv.key is None:
            m = KEY_LINE.search(log.read_text(errors="replace"))
            srv.key = m.group(1) if m else None
        if srv.key:
            try:
                r = httpx.get(srv.url + "/readyz", timeout=5)
                if r.status_code == 200:
                    srv.extra["readyz"] = r.json()
                    return srv
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    stop(srv)
    raise BenchError(f"the front end did not become ready; its log ends:\n{srv.log_tail()}")


def kill_group(srv: Server) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(10)


def per_instance(rows: list[tuple[str, int, float | None]], t0: float) -> dict[str, dict]:
    """Per instance (url, output tokens, finish time or None) -> {"calls", "output_tokens",
    "last_finish_s"}: the work an instance was given and when it ended, in seconds after `t0`
    (the burst's first call). Steps per instance do not measure load: the instance that got more
    of the least urgent calls runs the level order's longer tail of short steps
    (docs/measurements/cluster.md, 2026-12-04)."""
    out: dict[str, dict] = {}
    for inst, tokens, finish in rows:
        d = out.setdefault(inst, {"calls": 0, "output_tokens": 0, "last_finish_s": None})
        d["calls"] += 1
        d["output_tokens"] += int(tokens or 0)
        if finish is not None:
            d["last_finish_s"] = round(max(d["last_finish_s"] or 0.0, finish - t0), 2)
    return dict(sorted(out.items()))


def audit_rows(db: Path) -> dict:
    """Rows of the front end's `requests` table: count and outcomes, per instance the calls,
    output tokens and last finish (`per_instance`, seconds after the first arrival), and per
    level the time a call spent in the front end before it was handed to an instance
    (arrival to dispatch: reading, classifying, the admission queue) and from there to its
    first token (`engine_ms`: the instance's queue and prefill, and the relay), p50 / max in ms."""
    if not db.exists():
        return {"rows": 0, "outcomes": {}, "per_instance": {}, "instance_of": {}, "front_ms": {}, "engine_ms": {}}
    with contextlib.closing(sqlite3.connect(str(db))) as c:
        outcomes = dict(c.execute("SELECT outcome, count(*) FROM requests GROUP BY outcome").fetchall())
        (t0,) = c.execute("SELECT min(arrival) FROM requests").fetchone()
        inst = per_instance(c.execute("SELECT coalesce(instance, '-'), output_tokens, finish FROM requests").fetchall(),
                            t0 or 0.0)
        instance_of = dict(c.execute("SELECT id, instance FROM requests").fetchall())
        waits: dict[str, list[float]] = {}
        engine: dict[str, list[float]] = {}
        for level, wait, first in c.execute("SELECT effective_level, dispatched - arrival, first_token - dispatched "
                                            "FROM requests WHERE dispatched IS NOT NULL"):
            waits.setdefault(str(level), []).append(1000 * wait)
            if first is not None:
                engine.setdefault(str(level), []).append(1000 * first)

    def p50_max(by_level: dict[str, list[float]]) -> dict:
        return {lv: {"p50": round(statistics.median(w), 1), "max": round(max(w), 1)} for lv, w in sorted(by_level.items())}
    return {"rows": sum(outcomes.values()), "outcomes": outcomes, "per_instance": inst, "instance_of": instance_of,
            "front_ms": p50_max(waits), "engine_ms": p50_max(engine)}


def slowest_esi1(db: Path, res: list[Result], n: int = 3) -> list[dict]:
    """The `n` gold ESI-1 calls that waited longest for their first token, each with what its
    audit row says of where the wait was: the level it was served at, the instance that
    served it (the last one tried), its time in the front end before dispatch and from
    dispatch to first token, its preemptions. One slow ESI-1 call in a burst is a p99; this
    makes it readable after the run (the benchmark keeps no per-call results)."""
    late = sorted((r for r in res if r.call.gold == 1 and r.ttft is not None and r.request_id),
                  key=lambda r: r.ttft, reverse=True)[:n]
    if not late or not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(str(db))) as c:
        rows = {row[0]: row[1:] for row in c.execute(
            "SELECT id, effective_level, instance, arrival, dispatched, first_token, preemptions FROM requests "
            f"WHERE id IN ({','.join('?' * len(late))})", [r.request_id for r in late])}

    def ms(a: float | None, b: float | None) -> float | None:
        return round(1000 * (b - a), 1) if a is not None and b is not None else None

    out = []
    for r in late:
        level, inst, arrival, dispatched, first, preempted = rows.get(r.request_id, (None,) * 6)
        out.append({"request_id": r.request_id, "ttft_ms": round(1000 * r.ttft, 1), "level": level, "instance": inst,
                    "front_ms": ms(arrival, dispatched), "engine_ms": ms(dispatched, first), "preemptions": preempted})
    return out


def clear_error(r: Result) -> bool:
    """An error the client was told about: an SSE error event, or an HTTP status with a
    JSON error body. A dropped connection or a stream without [DONE] is not."""
    e = r.error or ""
    return e.startswith("stream error:") or (e.startswith("HTTP ") and '"error"' in e)


def warm_up(instances: list[Server], calls: list[Call], seats: int) -> None:
    """One full wave of seats on each newly started instance (short answers), so that no
    router's run pays the engine's first-use costs: the first router on fresh instances
    otherwise ran on a colder engine than the ones after it."""
    wave = [Call(k, c.text, c.gold, c.kind, 0.0, 16) for k, c in enumerate(calls[:seats])]

    async def all_():
        await asyncio.gather(*(run_calls(s.url, None, MODEL_NAME, wave) for s in instances))

    asyncio.run(all_())


def fault_counts(metrics_text: str) -> dict[str, int]:
    """From the front end's /metrics: calls sent again elsewhere, by reason (`queue_full`,
    `instance_fault` before any token; `resumed_midstream` after tokens; `seat_move`: waited
    for a seat, moved to a free one, triage.routing.rebalance) and streams that ended with
    `InstanceLost` (`lost_midstream`)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {"queue_full": 0, "instance_fault": 0, "resumed_midstream": 0, "seat_move": 0, "lost_midstream": 0}
    for fam in text_string_to_metric_families(metrics_text):
        for smp in fam.samples:
            if smp.name == "triage_rerouted_total":
                key = smp.labels.get("reason", "")
                out[key] = out.get(key, 0) + int(smp.value)
            elif smp.name == "triage_instance_lost_total":
                out["lost_midstream"] += int(smp.value)
    return out


def front_pauses(metrics_text: str) -> dict:
    """From the front end's /metrics: how often and how long its event loop was blocked
    (`triage_event_loop_stall_seconds`: every call and stream waits meanwhile) and its
    longest garbage collection by generation, since it started."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict = {"loop_stalls": 0, "loop_stall_s": 0.0, "gc_pause_max_s": {}}
    for fam in text_string_to_metric_families(metrics_text):
        for smp in fam.samples:
            if smp.name == "triage_event_loop_stall_seconds_count":
                out["loop_stalls"] = int(smp.value)
            elif smp.name == "triage_event_loop_stall_seconds_sum":
                out["loop_stall_s"] = round(smp.value, 2)
            elif smp.name == "triage_gc_pause_max_seconds":
                out["gc_pause_max_s"][smp.labels.get("generation", "?")] = round(smp.value, 3)
    return out


def _cpu(servers: list[Server]) -> dict[str, dict[str, float]]:
    return {s.name: cpu_seconds(s.proc.pid) for s in servers}


def _cpu_since(servers: list[Server], before: dict) -> dict[str, float]:
    """CPU seconds spent during the run: the front end's process, and the instances' HTTP
    processes and engine processes summed (a killed instance's is not counted)."""
    now = _cpu(servers)
    out = {"front": 0.0, "instances_api": 0.0, "instances_engine": 0.0}
    for s in servers:
        a, b = before.get(s.name, {}), now.get(s.name) or {}
        d = {k: b[k] - a.get(k, 0.0) for k in b}
        if s.name.startswith("front"):
            out["front"] += d.get("api", 0.0) + d.get("engine", 0.0)
        else:
            out["instances_api"] += d.get("api", 0.0)
            out["instances_engine"] += d.get("engine", 0.0)
    return {k: round(v, 1) for k, v in out.items()}


def _counters(servers: list[Server]) -> list[dict[str, int]]:
    """Each instance's engine counters so far (its /metrics: steps, tokens computed,
    preemptions; {} where unreadable, e.g. killed)."""
    return [engine_counters(s.url) for s in servers]


def _delta(before: list[dict], after: list[dict], key: str) -> list[int | None]:
    return [b[key] - a[key] if key in a and key in b else None for a, b in zip(before, after)]


def _split_rr(calls: list[Call], n: int) -> list[list[Call]]:
    return [calls[i::n] for i in range(n)]


def run_router(router: str, calls: list[Call], plan: ClusterPlan, model: str, instances: list[Server],
               classes, on_done: Callable[[Result], None] | None = None) -> tuple[dict, list[Result]]:
    """One router's run on already-started instances; returns (report, results)."""
    killed: dict = {}
    timer = None
    t_start = time.time()

    def _kill():
        killed.update({"instance": instances[0].url, "at_s": round(time.time() - t_start, 2)})
        kill_group(instances[0])

    cpu0, count0, steal0 = _cpu(instances), _counters(instances), steal_seconds()
    faults = pauses = None   # the front end's re-routes and resumptions, its stalls (not for the stock baseline)
    if router == BASELINE:
        groups = _split_rr(calls, len(instances))
        if plan.kill_at is not None:
            timer = threading.Timer(plan.kill_at, _kill)
            timer.start()
        t_start = time.time()

        async def both():
            outs = await asyncio.gather(*(run_calls(s.url, None, MODEL_NAME, g, send_priority=True, on_done=on_done)
                                          for s, g in zip(instances, groups)))
            return [r for o in outs for r in o]

        res = sorted(asyncio.run(both()), key=lambda r: r.call.idx)
        cpu = _cpu_since(instances, cpu0)
        audit = None
        where = {c.idx: s.url for s, g in zip(instances, groups) for c in g}
        t0 = min((r.sent for r in res if r.sent), default=0.0)
        load = per_instance([(where[r.call.idx], r.tokens, r.end) for r in res], t0)
    else:
        front = start_front(router, [s.url for s in instances], plan, model, router)
        cpu0.update(_cpu([front]))
        try:
            if plan.kill_at is not None:
                timer = threading.Timer(plan.kill_at, _kill)
                timer.start()
            t_start = time.time()
            res = asyncio.run(run_calls(front.url, front.key, MODEL_NAME, calls, on_done=on_done))
            cpu = _cpu_since([*instances, front], cpu0)
            time.sleep(1.0)   # the audit writer's last batch
            import httpx

            try:
                front.extra["readyz_after"] = httpx.get(front.url + "/readyz", timeout=5).json()
                text = httpx.get(front.url + "/metrics", timeout=5).text
                faults, pauses = fault_counts(text), front_pauses(text)
            except (httpx.HTTPError, ValueError):
                pass
        finally:
            if timer is not None:
                timer.cancel()
            stop(front)
        audit = audit_rows(front.extra["dir"] / "audit.db")
        audit["esi1_slowest"] = slowest_esi1(front.extra["dir"] / "audit.db", res)
        load = audit.pop("per_instance")   # calls, output tokens and last finish per instance
        served_by = audit.pop("instance_of")
        where = {r.call.idx: served_by[r.request_id] for r in res if r.request_id in served_by}
    if timer is not None:
        timer.cancel()
        timer.join(1)
    sent = [r.sent for r in res if r.sent]
    ends = [r.end for r in res if r.end is not None]
    wall = max(ends) - min(sent) if ends and sent else float("nan")
    out = summarize(res, [wall], classes)
    out["order"] = served_in_order(res, where)   # per instance: which one served each call
    ok = [r for r in res if r.ok]
    unclear = [r for r in res if not r.ok and not clear_error(r)]
    missing = max(0, len(calls) - audit["rows"]) if audit is not None else 0
    out["errors"] = sum(1 for r in res if not r.ok and clear_error(r))
    out["lost"] = len(unclear) + missing
    out["lost_examples"] = sorted({r.error or "no [DONE]" for r in unclear})[:3]
    out["completed"] = len(ok)
    out["cpu_s"] = cpu
    # per instance during the run: engine steps (fewer, fuller steps serve more tokens/s; not a
    # measure of load: `per_instance`), tokens computed (more than the calls' prompts and
    # answers by what preemptions recomputed) and preemptions
    count1 = _counters(instances)
    for k, key in REPORT_KEYS.items():
        out[key] = _delta(count0, count1, k)
    steps = out.get("engine_steps") or []
    out["engine_cpu_ms_a_step"] = engine_cpu_ms_a_step(   # a slow spell of the host shows here (report._quiet)
        cpu.get("instances_engine"), sum(steps) if steps and None not in steps else None)
    for i, inst in enumerate(instances):   # ... also beside each instance's calls
        if inst.url in load:
            load[inst.url].update({key: out[key][i] for key in REPORT_KEYS.values()})
    out["per_instance"] = load
    out["vm_steal_s"] = round(steal_seconds() - steal0, 2)   # the hypervisor's share of the run (steal_note)
    if router != BASELINE:
        out["faults"] = faults
        out["front_pauses"] = pauses
    if audit is not None:
        out["audit"] = audit
        out["audit_rows_missing"] = missing
    if killed:
        out["killed"] = killed
        k = killed["at_s"]
        t0 = min(sent)
        # the calls the kill could touch: still open when it came (streaming, waiting, or not yet sent)
        open_ = [r for r in res if r.end is None or r.end - t0 > k]
        out["after_kill"] = {"open_at_kill": len(open_), "completed": sum(r.ok for r in open_),
                             "sent_after": sum(1 for r in res if r.sent and r.sent - t0 > k)}
    return out, res


def turn_order(routers: list[str], turns: int) -> list[str]:
    """Who runs when: ours first, then the stock baseline, every other turn reversed
    (`alternating`: A B, B A, A B), so each kind's instances start once per switch."""
    base = [r for r in routers if r != BASELINE] + [r for r in routers if r == BASELINE]
    return [r for _, r in alternating(base, turns)]


TURN_FIELDS = ("tokens_per_s", "wall_s", "errors", "lost", "cpu_s", "engine_steps", "engine_tokens", "preemptions",
               "per_instance", "vm_steal_s", "engine_cpu_ms_a_step", "faults", "front_pauses", "audit", "killed", "after_kill",
               "order")


def merge_turns(runs: list[tuple[dict, list[Result]]], classes) -> dict:
    """One router's turns as one report: the calls of every turn summarized together
    (tokens/s = all tokens over all bursts' seconds), counts and CPU seconds summed, and
    each turn's own figures under `turns`."""
    reps = [r for r, _ in runs]
    if len(reps) == 1:
        return reps[0]
    out = summarize([x for _, rr in runs for x in rr], [r["wall_s"] for r in reps], classes)
    for k in ("errors", "lost", "audit_rows_missing"):
        if k in reps[0]:
            out[k] = sum(r[k] for r in reps)
    out["lost_examples"] = sorted({e for r in reps for e in r.get("lost_examples", [])})[:3]
    out["cpu_s"] = {k: round(sum(r["cpu_s"].get(k, 0.0) for r in reps), 1) for k in reps[0]["cpu_s"]}
    for key in REPORT_KEYS.values():
        out[key] = [r.get(key) for r in reps]
    out["vm_steal_s"] = round(sum(r.get("vm_steal_s", 0.0) for r in reps), 2)
    orders = [r.get("order") for r in reps]   # each turn's check on its own instances' assignment
    out["order"] = ({k: sum(o[k] for o in orders) for k in ORDER_COUNTS} | {"tolerance_s": orders[0]["tolerance_s"]}
                    if all(orders) else None)
    out["turns"] = [{k: r[k] for k in TURN_FIELDS if k in r} | {"esi1_ttft_p50_ms": r["esi1_caught"]["ttft_p50_ms"]}
                    for r in reps]
    return out


def against_baseline(routers: dict[str, dict]) -> dict[str, dict]:
    """Per router, its figures as multiples of the stock baseline's (issue 21's third bar:
    ESI-1 first token p50 of the calls the classifier put at level 1 at most 0.5x, tokens/s
    at least 0.95x; `report.against`). Empty without the baseline."""
    return against(routers, BASELINE)


def run_cluster(routers: list[str], calls: list[Call], plan: ClusterPlan, model: str, classes,
                progress: Callable[[str, int], contextlib.AbstractContextManager] | None = None,
                echo: Callable[[str], None] = lambda s: None, into: dict | None = None,
                turns: int = 1) -> dict:
    """Every router in turn (`turn_order`); instances are started once per kind and a killed
    one is restarted before the next router. `into` receives each router's report (its
    turns so far, `merge_turns`) as it completes (kept when a later router fails)."""
    out: dict = into if into is not None else {}
    runs: dict[str, list[tuple[dict, list[Result]]]] = {}
    insts: list[Server] = []
    kind: str | None = None
    try:
        for router in turn_order(routers, turns):
            want = "stock" if router == BASELINE else "triage"
            if kind != want:
                for s in insts:
                    stop(s)
                insts = [start_instance(i, plan, stock=want == "stock", model=model) for i in range(plan.instances)]
                for s in insts:
                    wait_instance(s, engine_nice=plan.engine_nice)
                warm_up(insts, calls, plan.sizes.max_num_seqs)
                kind = want
                echo(f"{plan.instances} {want} instances up: {', '.join(s.url for s in insts)}")
            for i, s in enumerate(insts):
                if s.proc.poll() is not None:   # killed by the previous run
                    insts[i] = start_instance(i, plan, stock=want == "stock", model=model)
                    wait_instance(insts[i], engine_nice=plan.engine_nice)
                    warm_up([insts[i]], calls, plan.sizes.max_num_seqs)
            for s in insts:
                reset_prefix_cache(s)
            ctx = progress(router, len(calls)) if progress else contextlib.nullcontext(lambda n: None)
            with ctx as advance:
                done = [0]

                def tick(_r, done=done, advance=advance):
                    done[0] += 1
                    advance(done[0])

                rep, res = run_router(router, calls, plan, model, insts, classes, on_done=tick)
            runs.setdefault(router, []).append((rep, res))
            out[router] = merge_turns(runs[router], classes)
            n = len(runs[router])
            echo(line(router if turns == 1 else f"{router} (turn {n} of {turns})", rep))
    finally:
        for s in insts:
            stop(s)
    if turns > 1:
        for router in runs:
            echo(line(f"{router} ({turns} turns)", out[router]))
    return out


def line(name: str, s: dict) -> str:
    one = s["per_level"].get("1", {})
    return (f"{name}: {s['completed']} ok, {s['errors']} clear errors, {s['lost']} lost, TDG {s['tdg_ratio']}, "
            f"{s['tokens_per_s']} tok/s, goodput {s['goodput_rps']} rps, ESI-1 SLO {one.get('slo_attainment')} "
            f"TTFT p50 {one.get('ttft_p50_ms')} ms p99 {one.get('ttft_p99_ms')} ms" + _esi1_wait_note(s.get("audit"))
            + order_note(s.get("order"))
            + steal_note(s.get("vm_steal_s"))
            + "".join(f"\n  {url}: {d['calls']} calls, {d['output_tokens']} output tokens, last done {d['last_finish_s']} s"
                      + _engine_note(d) for url, d in s.get("per_instance", {}).items()))


def _esi1_wait_note(audit: dict | None) -> str:
    """Where a turn's level-1 calls waited for their first token, p50: the front end (to
    dispatch) and the instance (dispatch to first token), from the audit rows."""
    front, engine = ((audit or {}).get(k, {}).get("1") for k in ("front_ms", "engine_ms"))
    if not front or not engine:
        return ""
    return f" (level 1 p50: {front['p50']} ms in the front end, {engine['p50']} ms on the instance)"


def _engine_note(d: dict) -> str:
    """An instance's engine work in a run, where its /metrics said: steps, tokens computed, preemptions."""
    parts = [f"{d[k]} {what}" for k, what in (("engine_steps", "steps"), ("engine_tokens", "tokens computed"),
                                             ("preemptions", "preempted")) if d.get(k) is not None]
    return "; " + ", ".join(parts) if parts else ""


def plot(out: dict, path: Path) -> None:
    """Per router and gold level: SLO attainment (left; TDG ratio and lost calls in the
    legend) and first-token p50 / p99 (right, log scale: where routers tie on attainment,
    the latencies still tell them apart)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from triage.sim.figure import save_figure

    routers = list(out["routers"])
    levels = sorted({lv for r in routers for lv in out["routers"][r]["per_level"]}, key=int)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(3.2 + 2.4 * len(levels), 3.6))
    w = 0.8 / max(1, len(routers))
    x = np.arange(len(levels))
    for k, r in enumerate(routers):
        s = out["routers"][r]
        lv = [s["per_level"].get(v, {}) for v in levels]
        ax.bar(x + k * w, [d.get("slo_attainment") or 0.0 for d in lv], w,
               label=f"{r} (TDG {s['tdg_ratio']}, lost {s['lost']})")
        p50 = np.array([(d.get("ttft_p50_ms") or np.nan) / 1000 for d in lv])
        p99 = np.array([(d.get("ttft_p99_ms") or np.nan) / 1000 for d in lv])
        bx.bar(x + k * w, p50, w, label=f"{r} p50")
        bx.scatter(x + k * w, p99, marker="_", s=120, color="black", zorder=3, label="p99" if k == 0 else None)
    ticks = (x + w * (len(routers) - 1) / 2, [f"ESI-{v}" for v in levels])
    ax.set_xticks(*ticks)
    bx.set_xticks(*ticks)
    ax.set_ylabel("SLO attainment (gold level)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, loc="lower left")
    bx.set_yscale("log")
    bx.set_ylabel("first token, s (p50 bars, p99 ticks)")
    bx.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"bench cluster: {out['instances']} instances, {out['requests']} calls, {out.get('scenario', 'trace')}"
                 + (f", instance killed at {out['kill_instance_at']} s" if out.get("kill_instance_at") else ""),
                 fontsize=9)
    save_figure(fig, path)
