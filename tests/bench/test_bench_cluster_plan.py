"""bench cluster's process plan: who runs at which priority (no engine is started here)."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serving.bench import cluster
from serving.bench.report import served_in_order
from serving.engine import lower_engine_priority


@pytest.fixture
def started(monkeypatch, tmp_path):
    calls = []

    class Proc:
        def poll(self):
            return None

    def fake_popen(cmd, env, log, nice):
        calls.append((cmd, env, Path(log).name, nice))
        return Proc()

    monkeypatch.setattr(cluster, "_popen", fake_popen)
    monkeypatch.setattr(cluster, "port_free", lambda port: True)
    return calls, tmp_path


@pytest.mark.parametrize("nice", [0, 10])
def test_instances_http_servers_start_at_the_front_ends_priority(started, nice):
    calls, tmp = started
    plan = cluster.ClusterPlan(instances=2, workdir=tmp, nice=nice)
    for i in range(2):
        cluster.start_instance(i, plan, stock=False, model="m")
    cluster.start_instance(0, plan, stock=True, model="m")
    assert [c[3] for c in calls] == [nice] * 3
    assert [c[2] for c in calls] == ["instance0.log", "instance1.log", "instance0-stock.log"]


def test_an_instances_engine_children_run_below_it():
    """What wait_instance does once an instance answers, with `--engine-nice 5`: its child
    processes (vLLM's EngineCore and workers) get 5 more, the instance's own HTTP process
    none, so the front end's classifier and the instances' HTTP servers win the CPU from
    the engines (a starved front end once held ESI-1 calls 9.4 s, docs/measurements/cluster.md)."""
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"])
    try:
        import psutil

        deadline = time.time() + 10
        while not psutil.Process(parent.pid).children() and time.time() < deadline:
            time.sleep(0.05)
        (child,) = psutil.Process(parent.pid).children()
        before = child.nice()
        assert lower_engine_priority(5, parent.pid) == [child.pid]
        assert child.nice() == min(19, before + 5)
        assert psutil.Process(parent.pid).nice() == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        for p in psutil.Process(parent.pid).children(recursive=True):
            p.kill()
        parent.kill()
        parent.wait()


def test_instances_and_front_end_share_the_benchs_session_in_groups_of_their_own(tmp_path):
    """Nice values only count inside one autogroup (one session): the front end and the
    instances must share the bench's session for the engines' lower priority to yield the
    front end's CPU, and each must lead its own process group so a kill takes it whole."""
    proc = cluster._popen([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ),
                          tmp_path / "p.log", 0)
    try:
        assert os.getsid(proc.pid) == os.getsid(0)
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
        cluster.kill_group(cluster.Server("p", "", None, proc, tmp_path / "p.log"))
        assert proc.returncode is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_turns_alternate_so_each_kind_of_instance_starts_once_per_switch():
    """--turns 3 with one of our routers and the stock baseline: A B, B A, A B, so a drift of
    the machine is not charged to the same router every time, and the instances restart
    only where the kind changes (4 starts, not 6)."""
    order = cluster.turn_order(["stock_round_robin", "gorouting"], 3)
    assert order == ["gorouting", "stock_round_robin", "stock_round_robin", "gorouting", "gorouting",
                     "stock_round_robin"]
    starts = sum(1 for i, r in enumerate(order) if i == 0 or (r == cluster.BASELINE) != (order[i - 1] == cluster.BASELINE))
    assert starts == 4
    assert cluster.turn_order(["gorouting", "min_load"], 1) == ["gorouting", "min_load"]


def test_turns_are_reported_together_and_each_on_its_own():
    """Two turns of one router: tokens/s is all tokens over all bursts' seconds (not the
    mean of two rates), counts and CPU seconds add up, and each turn keeps its own figures."""
    from serving.bench.loadgen import Call, Result
    from serving.bench.serve import _classes

    classes = _classes()

    def turn(tokens: int, wall: float, cpu: float, steal: float = 0.0):
        res = [Result(Call(i, "t", 1 if i == 0 else 3, "dispatch", 0.0, 64), sent=0.0, first=0.2 + i, end=wall,
                      tokens=tokens, level=1 if i == 0 else 3) for i in range(2)]
        rep = cluster.summarize(res, [wall], classes) | {"lost": 0, "lost_examples": [], "audit_rows_missing": 0,
                                                        "cpu_s": {"front": cpu, "instances_engine": 10 * cpu},
                                                        "engine_steps": [50, 60], "errors": 0, "vm_steal_s": steal,
                                                        "order": served_in_order(res, {0: "i0", 1: "i1"})}
        return rep, res

    one, two = turn(30, 10.0, 1.0), turn(10, 30.0, 2.0, steal=4.5)
    assert cluster.merge_turns([one], classes) is one[0]
    m = cluster.merge_turns([one, two], classes)
    assert m["tokens_per_s"] == round((2 * 30 + 2 * 10) / 40.0, 1)   # 2.0, where the mean of rates would be 3.3
    assert m["completed"] == 4 and m["reps"] == 2 and m["errors"] == 0 and m["lost"] == 0
    assert m["cpu_s"] == {"front": 3.0, "instances_engine": 30.0}
    assert m["engine_steps"] == [[50, 60], [50, 60]]
    assert [t["tokens_per_s"] for t in m["turns"]] == [6.0, round(20 / 30.0, 1)]
    assert [t["esi1_ttft_p50_ms"] for t in m["turns"]] == [200.0, 200.0]
    # the turn the hypervisor slowed is marked, and so is the pooled line
    assert [t["vm_steal_s"] for t in m["turns"]] == [0.0, 4.5] and m["vm_steal_s"] == 4.5
    assert "VM steal 4.5 CPU-s" in cluster.line("gorouting", m) and "VM steal" not in cluster.line("gorouting", one[0])
    # the order check adds up over the turns (each judged on its own turn's instances)
    assert m["order"] == {"esi1_calls": 2, "esi1_overtaken": 0, "esi1_overtaken_by_later": 0, "overtaken": 0,
                          "overtaken_by_later": 0, "inversions": 0, "tolerance_s": 1.0}
    assert "ESI-1 calls overtaken by a less urgent one 0 of 2" in cluster.line("gorouting", m)


def test_the_order_check_pairs_calls_on_one_instance_only():
    """An ESI-1 call waiting on one instance is not overtaken by a call another instance
    started (which instance gets a call is the router's business); on its own instance it is."""
    from serving.bench.loadgen import Call, Result

    urgent = Result(Call(0, "t", 1, "dispatch", 0.0, 8), sent=100.0, first=103.0, end=104.0, tokens=8, level=1)
    chat = Result(Call(1, "t", 5, "chat", 0.0, 8), sent=100.5, first=102.0, end=103.0, tokens=8, level=5)
    assert served_in_order([urgent, chat], {0: "i0", 1: "i1"})["esi1_overtaken"] == 0
    assert served_in_order([urgent, chat], {0: "i0", 1: "i0"})["esi1_overtaken"] == 1


def test_front_pauses_reads_the_front_ends_stalls_and_longest_collections():
    """bench cluster reports how long the front end's event loop stood still (every call
    waits then) and its longest garbage collection, from the service's own /metrics."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from serving.gc_heap import GcPauses

    reg = CollectorRegistry()
    h = Histogram("triage_event_loop_stall_seconds", "x", buckets=(1, 2), registry=reg)
    h.observe(1.37)
    h.observe(0.3)
    pauses = GcPauses()
    pauses.max = [0.001, 0.02, 1.25]
    reg.register(pauses)
    got = cluster.front_pauses(generate_latest(reg).decode())
    assert got["loop_stalls"] == 2 and got["loop_stall_s"] == pytest.approx(1.67)
    assert got["gc_pause_max_s"] == {"0": 0.001, "1": 0.02, "2": 1.25}
    assert cluster.front_pauses("") == {"loop_stalls": 0, "loop_stall_s": 0.0, "gc_pause_max_s": {}}


def test_each_router_is_reported_as_a_multiple_of_the_stock_baseline():
    """The third bar's two ratios read straight from the JSON: pooled ESI-1 (caught) first-token
    p50 / p99 and tokens/s against the stock baseline's, and tokens/s turn by turn and over the
    turns the hypervisor left alone."""
    def rep(tps, p50, p99, turns):
        return {"tokens_per_s": tps, "esi1_caught": {"n": 35, "ttft_p50_ms": p50, "ttft_p99_ms": p99},
                "turns": [{"tokens_per_s": t, "vm_steal_s": st} for t, st in turns]}

    routers = {"gorouting": rep(199.4, 1845.9, 2785.5, [(200.3, 0.02), (193.3, 0.01), (204.8, 0.03)]),
               cluster.BASELINE: rep(215.5, 4181.2, 8393.2, [(210.4, 0.02), (221.2, 1.2), (215.3, 0.06)])}
    x = cluster.against_baseline(routers)
    assert list(x) == ["gorouting"]
    assert x["gorouting"] == {"tokens_per_s": 0.925, "esi1_ttft_p50": 0.441, "esi1_ttft_p99": 0.332,
                              "gold1_ttft_p50": None, "gold1_ttft_p99": None,   # no per-level figures given
                              "tokens_per_s_turns": [0.952, 0.874, 0.951],
                              "quiet_turns": 2, "tokens_per_s_quiet": 0.952}   # the second turn's baseline was slowed
    assert cluster.against_baseline({"gorouting": routers["gorouting"]}) == {}   # no baseline run
    routers["gorouting"]["esi1_caught"]["ttft_p50_ms"] = None                      # no ESI-1 call caught
    assert cluster.against_baseline(routers)["gorouting"]["esi1_ttft_p50"] is None


def test_a_turn_the_host_slowed_without_steal_is_left_out_of_the_quiet_ratio():
    """A run of 2026-12-05 (Intel AMX VM): stock's second turn took 40.1 s and 77.5 engine
    CPU-s for the 320 steps its first took in 26.4 s and 50.5 CPU-s, with 0.05 CPU-s of steal:
    a slow spell of the host that steal does not show. By the command we served 1.186x stock's
    tokens/s; the turn both systems ran at the VM's usual speed says 0.936x."""
    from serving.bench.report import against_line, engine_cpu_ms_a_step

    def rep(turns):
        return {"tokens_per_s": sum(t for t, _ in turns) / len(turns), "esi1_caught": {},
                "turns": [{"tokens_per_s": t, "vm_steal_s": 0.03,
                           "engine_cpu_ms_a_step": engine_cpu_ms_a_step(cpu, steps)} for t, (cpu, steps) in turns]}

    routers = {"gorouting": rep([(272.6, (53.0, 328)), (276.5, (52.0, 319))]),
               cluster.BASELINE: rep([(291.2, (50.5, 319)), (191.9, (77.5, 320))])}
    x = cluster.against_baseline(routers)["gorouting"]
    assert x["tokens_per_s_turns"] == [0.936, 1.441]
    assert x["quiet_turns"] == 1 and x["tokens_per_s_quiet"] == 0.936
    assert "0.936 over the 1 of 2 turns the VM did not slow" in against_line("gorouting", cluster.BASELINE, x)
    routers[cluster.BASELINE]["turns"][1]["engine_cpu_ms_a_step"] = 170.0   # within a quarter of the others
    assert cluster.against_baseline(routers)["gorouting"]["quiet_turns"] == 2


def test_a_turn_reports_each_instances_calls_tokens_and_last_finish(tmp_path):
    """The front end's audit database (the real schema, by Alembic) read back per instance:
    what each instance was given and when it ended, so that a reader of `bench cluster`
    can tell uneven work (one instance done seconds after the other) from uneven steps (two
    instances done together, one with the longer tail of short steps). A call never
    dispatched (shed at the front end) counts under '-' and has no finish. Per level, the
    report splits the wait for a first token into the front end's part and the instance's."""
    from sqlalchemy.orm import Session

    from serving.db.models import RequestRow
    from serving.db.session import make_engine, upgrade

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    upgrade(url)
    t0 = 1_800_000_000.0
    rows = [("a", 0.0, 40.79, 38, "http://i0"), ("b", 0.5, 12.0, 64, "http://i0"), ("c", 0.2, 40.57, 10, "http://i1"),
            ("d", 1.0, None, 0, None)]
    with Session(make_engine(url)) as s:
        for rid, at, fin, out, inst in rows:
            s.add(RequestRow(id=rid, endpoint="chat", effective_level=5, ttft_slo=1.0, tpot_slo=0.1, classes_version=1,
                             arrival=t0 + at, dispatched=None if inst is None else t0 + at + 0.01,
                             first_token=None if inst is None else t0 + at + 0.51,
                             finish=None if fin is None else t0 + fin, output_tokens=out, instance=inst,
                             outcome="ok" if inst else "shed"))
        s.commit()
    got = cluster.audit_rows(tmp_path / "audit.db")
    assert got["rows"] == 4 and got["outcomes"] == {"ok": 3, "shed": 1}
    # where a level's first token waited: in the front end (to dispatch), then on the instance
    assert got["front_ms"] == {"5": {"p50": 10.0, "max": 10.0}}
    assert got["engine_ms"] == {"5": {"p50": 500.0, "max": 500.0}}
    assert got["instance_of"] == {"a": "http://i0", "b": "http://i0", "c": "http://i1", "d": None}
    assert got["per_instance"] == {"-": {"calls": 1, "output_tokens": 0, "last_finish_s": None},
                                   "http://i0": {"calls": 2, "output_tokens": 102, "last_finish_s": 40.79},
                                   "http://i1": {"calls": 1, "output_tokens": 10, "last_finish_s": 40.57}}
    line = cluster.line("gorouting", {"completed": 3, "errors": 1, "lost": 0, "tdg_ratio": 1.0, "tokens_per_s": 1.0,
                                      "goodput_rps": 1.0, "per_level": {}, "per_instance": got["per_instance"]})
    assert "http://i0: 2 calls, 102 output tokens, last done 40.79 s" in line
    assert "in the front end" not in line   # no level-1 row: no split to print
    split = {"front_ms": {"1": {"p50": 512.0, "max": 900.0}}, "engine_ms": {"1": {"p50": 2400.0, "max": 3500.0}}}
    line = cluster.line("gorouting", {"completed": 3, "errors": 1, "lost": 0, "tdg_ratio": 1.0, "tokens_per_s": 1.0,
                                      "goodput_rps": 1.0, "per_level": {}, "audit": split})
    assert "(level 1 p50: 512.0 ms in the front end, 2400.0 ms on the instance)" in line
    # where the instances' /metrics said, each one's engine work is printed beside its calls
    got["per_instance"]["http://i0"].update(engine_steps=179, engine_tokens=9120, preemptions=3)
    got["per_instance"]["http://i1"].update(engine_steps=148, engine_tokens=None, preemptions=None)
    line = cluster.line("gorouting", {"completed": 3, "errors": 1, "lost": 0, "tdg_ratio": 1.0, "tokens_per_s": 1.0,
                                      "goodput_rps": 1.0, "per_level": {}, "per_instance": got["per_instance"]})
    assert "last done 40.79 s; 179 steps, 9120 tokens computed, 3 preempted" in line
    assert "  http://i1: 1 calls, 10 output tokens, last done 40.57 s; 148 steps" in line.splitlines()


def test_the_slowest_esi1_calls_say_where_they_waited(tmp_path):
    """A run's ESI-1 p99 is one or two calls: the report names them, slowest first, with
    the instance that served each, its time in the front end before dispatch and on the
    instance until its first token (from the audit row), so an outlier can be read after the
    run. Calls of other gold levels and calls with no first token are not listed."""
    from sqlalchemy.orm import Session

    from serving.bench.loadgen import Call, Result
    from serving.db.models import RequestRow
    from serving.db.session import make_engine, upgrade

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    upgrade(url)
    t0 = 1_800_000_000.0
    with Session(make_engine(url)) as s:
        for rid, inst, wait, first in [("fast", "http://i0", 0.02, 0.4), ("stuck", "http://i1", 0.05, 14.7),
                                       ("chat", "http://i0", 0.03, 20.0)]:
            s.add(RequestRow(id=rid, endpoint="chat", effective_level=1, ttft_slo=1.0, tpot_slo=0.1, classes_version=1,
                             arrival=t0, dispatched=t0 + wait, first_token=t0 + first, instance=inst, outcome="ok",
                             preemptions=0))
        s.commit()

    def result(rid, gold, ttft):
        r = Result(Call(0, "x", gold, "dispatch", 0.0, 64), sent=100.0, request_id=rid)
        r.first = None if ttft is None else 100.0 + ttft
        return r

    res = [result("fast", 1, 0.42), result("stuck", 1, 14.75), result("chat", 5, 20.0), result("lost", 1, None)]
    got = cluster.slowest_esi1(tmp_path / "audit.db", res)
    assert [g["request_id"] for g in got] == ["stuck", "fast"]
    assert got[0] == {"request_id": "stuck", "ttft_ms": 14750.0, "level": 1, "instance": "http://i1", "front_ms": 50.0,
                      "engine_ms": 14650.0, "preemptions": 0}
    assert cluster.slowest_esi1(tmp_path / "missing.db", res) == []
