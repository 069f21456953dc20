"""Scheduler-level tests of serving.vllm_scheduler.TriageScheduler: real vLLM 0.32.0
`Scheduler` objects on a hand-made KVCacheConfig, no model, the stand-in runner of
serving.peers. No `engine` marker: these run in a few seconds after vLLM's import."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from serving.peers import build_scheduler, make_vllm_request, run_peer, stand_in_output  # noqa: E402
from triage.classes import load_classes  # noqa: E402
from triage.profiles import load_profile  # noqa: E402
from triage.sim.traces import poisson_trace  # noqa: E402

PROFILE = "vllm-cpu-smollm2"


def step(sched):
    out = sched.schedule()
    sched.update_from_output(out, stand_in_output(sched, out))
    return out


def add(sched, rid, prompt, level, max_tokens=64, arrival=0.0, priority=None):
    sched.add_request(make_vllm_request(rid, prompt, max_tokens, priority=level if priority is None else priority,
                                        arrival=arrival, extra={"level": level, "id": rid}))


def make(kind="triage", clock=None, **kw):
    kw.setdefault("triage", {"profile": PROFILE, "record_steps": 10_000})
    s = build_scheduler(kind, **kw)
    if clock is not None and hasattr(s, "clock"):
        s.clock = clock
    return s


def test_pinned_private_members_present():
    from serving.vllm_scheduler import check_vllm_members

    s = make(num_blocks=50)
    assert check_vllm_members(s) == []


def test_plan_equals_num_scheduled_tokens_under_kv_pressure():
    """A seeded stream through a small KV pool: every step executes exactly the plan
    (requests, token counts, our victims), with preemptions happening."""
    profile = load_profile(PROFILE)
    classes = load_classes().scaled(profile.slo_scale)
    trace = poisson_trace(120, 6.0, seed=3, prompt=(32, 900), output=(4, 120))
    s = make(num_blocks=120, block_size=16, max_num_seqs=16, max_num_batched_tokens=512, max_model_len=2048,
             triage={"profile": PROFILE, "classes": classes.to_dict(), "record_steps": 100_000})
    run = run_peer("triage", trace, profile, classes, sched=s, max_num_seqs=16, max_num_batched_tokens=512,
                   max_model_len=2048, num_blocks=120, block_size=16)
    st = s.triage_stats()
    assert all(len(r.token_times) == r.output_len for r in run.requests)
    assert st["steps"] >= run.steps > 100
    assert st["preemptions"] > 0, "the stream should create KV pressure"
    assert st["plan_mismatches"] == 0
    assert st["vllm_preemptions"] == 0
    assert st["kv_mismatches"] == 0
    for rec in s.step_log:
        assert rec.scheduled == rec.plan
        assert rec.preempted == rec.victims


def test_the_policy_sees_what_vllm_did_after_every_step():
    """The policy reads numpy columns of the mirror: after each step they must show the
    tokens vLLM computed and sampled (a stale column once kept decodes looking like
    prefills to the policy, so no step was ever sized for an ESI-1 decode)."""
    import numpy as np

    s = make(num_blocks=400, block_size=16, max_num_seqs=8, max_num_batched_tokens=256)
    s.clock = lambda: 1.0
    for i in range(6):
        add(s, f"r{i}", 100 + 70 * i, level=1 + i % 5, max_tokens=20)
    decoding_seen = 0
    for _ in range(40):
        step(s)
        cat = s.tstate.joined()
        n = cat.n_run
        running = cat.reqs[:n]
        assert cat["need"][:n].tolist() == [r.need for r in running]
        last = [r.token_times[-1] if r.token_times else np.nan for r in running]
        np.testing.assert_array_equal(cat["last_token"][:n], np.array(last, dtype=float))
        decoding_seen += sum(r.need == 1 for r in running)
    assert decoding_seen > 0


def test_preemption_under_kv_pressure_picks_our_victim_and_mode():
    """KV full with levels 5, 4, 3 (admitted in that order); a level-1 arrival evicts
    the level-5 request (vLLM's fcfs would take the last admitted, level 3). Without a KV
    offloading connector the victim is recomputed."""
    now = [0.0]
    s = make(clock=lambda: now[0], num_blocks=30, block_size=16, max_num_seqs=8)
    for rid, lvl in (("A5", 5), ("B4", 4), ("C3", 3)):
        add(s, rid, 150, lvl, max_tokens=200)
        out = step(s)
        assert rid in out.num_scheduled_tokens
        now[0] += 0.1
    assert [r.request_id for r in s.running] == ["A5", "B4", "C3"]
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 0
    add(s, "D1", 100, 1, arrival=now[0])
    out = step(s)
    assert set(out.preempted_req_ids) == {"A5"}
    assert "D1" in out.num_scheduled_tokens
    assert s.requests["A5"].status.name == "PREEMPTED" and s.requests["A5"].num_computed_tokens == 0
    step_no, rid, level, keep, mode = s.preemption_log[-1]
    assert (rid, level, mode) == ("A5", 5, "recompute")
    st = s.triage_stats()
    assert st["plan_mismatches"] == 0 and st["vllm_preemptions"] == 0

    # vLLM's own scheduler in the same state admits nothing and preempts nobody
    v = make("vllm-fcfs", num_blocks=30, block_size=16, max_num_seqs=8)
    for rid, lvl in (("A5", 5), ("B4", 4), ("C3", 3)):
        add(v, rid, 150, lvl, max_tokens=200)
        step(v)
    add(v, "D1", 100, 1)
    out = step(v)
    assert "D1" not in out.num_scheduled_tokens and not out.preempted_req_ids


def test_level1_preempts_at_max_num_seqs_where_vllm_priority_cannot():
    """vLLM issue #40004: vLLM's priority policy never preempts for a seat."""
    results = {}
    for kind in ("triage", "vllm-priority"):
        now = [0.0]
        s = make(kind, clock=lambda: now[0], num_blocks=500, block_size=16, max_num_seqs=4)
        for i in range(4):
            add(s, f"low{i}", 64, 5, max_tokens=500)
        for _ in range(4):   # triage caps a step's time (max_step_s): the seats may take two steps
            step(s)
            if len(s.running) == 4:
                break
        assert len(s.running) == 4
        now[0] += 0.05
        add(s, "urgent", 64, 1, arrival=now[0])
        out = step(s)
        results[kind] = (set(out.num_scheduled_tokens), set(out.preempted_req_ids))
    scheduled, preempted = results["triage"]
    assert "urgent" in scheduled and len(preempted) == 1 and preempted <= {f"low{i}" for i in range(4)}
    scheduled, preempted = results["vllm-priority"]
    assert "urgent" not in scheduled and not preempted


def test_the_step_log_shows_the_urgent_call_and_what_it_displaced(tmp_path):
    """Issue 20's "see it happen": one JSON line a step naming what ran and what was
    preempted, why and for whom, and where the step's time went."""
    import json

    log = tmp_path / "steps.jsonl"
    now = [0.0]
    s = make(clock=lambda: now[0], num_blocks=500, block_size=16, max_num_seqs=4,
             triage={"profile": PROFILE, "step_log": str(log)})
    for i in range(4):
        add(s, f"low{i}", 64, 5, max_tokens=500)
    while len(s.running) < 4:
        step(s)
    now[0] += 0.05
    add(s, "urgent", 64, 1, arrival=now[0])
    step(s)
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(recs) == s.triage_stats()["steps"]          # every step, each written once its output is in
    last = recs[-1]
    assert ["urgent", 1, 64, "prefill"] in last["ran"]
    (victim,) = last["preempted"]
    assert victim["id"].startswith("low") and victim["level"] == 5
    assert victim["for"] == "urgent" and victim["for_level"] == 1 and victim["mode"] == "recompute"
    assert victim["id"] not in {r[0] for r in last["ran"]}
    assert last["waiting"] == 1 and last["waiting_levels"] == {"5": 1}   # the victim waits; by level
    assert all(r["sched_ms"] >= 0 and r["exec_ms"] >= 0 and r["update_ms"] >= 0 for r in recs)
    assert all(r["exec_cpu_ms"] >= r["exec_sys_ms"] >= 0 for r in recs)   # the model's CPU beside its wall time


def test_with_prefix_caching_the_plan_charges_only_the_uncached_part_of_a_prompt():
    """Calls sharing the served system turn: vLLM computes only what follows the cached
    blocks, and the plan (its tokens, hence its step-time estimate) says the same."""
    shared = list(range(100, 132))                       # two whole blocks of 16
    s = make(num_blocks=200, block_size=16, enable_prefix_caching=True)

    def add_shared(rid, own, level):
        s.add_request(make_vllm_request(rid, len(shared) + own, 8, priority=level, block_size=16, prefix=shared,
                                        extra={"level": level, "id": rid}))

    add_shared("first", 20, 3)
    out = step(s)
    assert out.num_scheduled_tokens["first"] == 52      # nothing cached yet: the whole prompt
    add_shared("second", 30, 1)
    add_shared("third", 10, 2)
    first_chunk = {}
    for _ in range(14):
        for rid, k in step(s).num_scheduled_tokens.items():
            first_chunk.setdefault(rid, k)
    assert first_chunk["second"] == 30 and first_chunk["third"] == 10   # the shared blocks were hit
    st = s.triage_stats()
    assert st["plan_mismatches"] == 0
    assert all(rec.scheduled == rec.plan for rec in s.step_log)
    assert all(r not in s.requests for r in ("first", "second", "third"))   # all finished


def test_the_learnt_step_time_corrections_can_be_read_and_put_back():
    s = make(num_blocks=100)
    saved = s.triage_control("learnt")
    assert saved["beta"] == 1.0 and saved["ratios"] == []
    s.triage_control("set_learnt", {**saved, "beta": 2.5, "ratios": [2.5] * 4})
    assert s.tstate.estimator.beta == 1.0          # queued: it applies at the next step
    add(s, "a", 40, 3)
    s.schedule()
    assert s.tstate.estimator.beta == 2.5 and s.tstate.estimator.learnt()["ratios"] == [2.5] * 4


def test_relabel_rekeys_at_next_step():
    """One seat free; the relabelled request is admitted before earlier arrivals."""
    now = [0.0]
    s = make(clock=lambda: now[0], num_blocks=500, block_size=16, max_num_seqs=2)
    add(s, "run", 64, 3, max_tokens=500)
    step(s)
    for i in range(3):
        add(s, f"w{i}", 64, 5, max_tokens=50, arrival=0.01 * (i + 1))
    assert s.triage_control("relabel", {"id": "w2", "level": 1}) is True
    assert s.tstate.requests["w2"].level == 5  # queued, applied at the next step
    now[0] += 0.05
    out = step(s)
    assert "w2" in out.num_scheduled_tokens
    assert not ({"w0", "w1"} & set(out.num_scheduled_tokens))
    assert s.tstate.requests["w2"].level == 1 and s.requests["w2"].priority == 1
    assert s.triage_stats()["relabels"] == 1


def test_set_classes_applies_at_next_step():
    s = make(num_blocks=100)
    classes = load_classes()
    edited = classes.edited({k: c for k, c in classes.classes.items()})
    s.triage_control("set_classes", edited.to_dict())
    step(s)
    assert s.tstate.classes.version == edited.version
    assert s.triage_stats()["class_edits"] == 1


def test_a_bad_relabel_or_class_table_is_refused_at_the_door_and_the_engine_steps_on():
    """A relabel to an unknown level, a malformed class table, or a table without a level a
    live request holds is refused when it is sent, with the reason (a `triage instance`
    answers 400); applied inside the next step it would raise there and end the engine. A
    queued edit's version is what the load snapshot reports until the step applies it."""
    from serving.instance.load import load_snapshot

    s = make(num_blocks=200, block_size=16, max_num_seqs=4)
    add(s, "a", 64, 3, max_tokens=20)
    step(s)
    classes = load_classes()
    refused = {
        "relabel to 9": s.triage_control("relabel", {"id": "a", "level": 9}),
        "rows without fields": s.triage_control("set_classes", {"classes": [{"level": 1}]}),
        "level 3 dropped": s.triage_control("set_classes", {**classes.to_dict(), "version": 7,
                                            "classes": [c for c in classes.to_dict()["classes"] if c["level"] != 3]}),
    }
    assert all(isinstance(r, dict) and r["refused"] for r in refused.values()), refused
    assert "9" in refused["relabel to 9"]["refused"] and "[3]" in refused["level 3 dropped"]["refused"]
    edited = classes.edited(dict(classes.classes))
    assert s.triage_control("set_classes", edited.to_dict()) is True
    assert load_snapshot(s)["classes_version"] == edited.version   # queued: the next step's table
    assert s.tstate.classes.version == classes.version
    for _ in range(25):   # the engine steps on and the call ends in full
        step(s)
    assert s.tstate.classes.version == edited.version
    assert "a" not in s.requests and s.triage_stats()["control_refused"] == 3
    # a client's own `triage_level` outside the table: served at its `priority`'s level, or the least urgent
    add(s, "odd", 32, 9, max_tokens=3, priority=2)
    add(s, "odder", 32, 0, max_tokens=3, priority=99)
    assert s.tstate.requests["odd"].level == 2 and s.tstate.requests["odder"].level == classes.least_urgent
    for _ in range(6):
        step(s)
    assert not ({"odd", "odder"} & set(s.requests))


def test_bench_peers_on_the_burst_serves_every_call_and_says_what_each_scheduler_costs_a_step():
    """`triage bench peers --scenario burst`: vLLM's two policies and ours on bench serve's
    burst (its calls, its engine sizes). Every call is served by every scheduler; each row
    says how long the scheduler itself took per engine step; ours puts ESI-1 first; a bad
    scenario is refused with a message."""
    import json

    from typer.testing import CliRunner

    import serving.cli  # noqa: F401  (registers the commands)
    from serving.cli.apps import app

    runner = CliRunner()
    r = runner.invoke(app, ["bench", "peers", "--scenario", "burst", "--requests", "40", "--spread", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["scenario"] == "burst" and out["requests"] == 40 and out["trace"] is None
    assert out["engine"]["max_num_seqs"] == 32 and out["engine"]["max_num_batched_tokens"] == 2048
    rows = {row["scheduler"]: row for row in out["rows"]}
    assert set(rows) == {"vllm-fcfs", "vllm-priority", "triage"}
    for row in rows.values():
        assert row["steps"] > 10
        assert row["cpu_s"] > 0 and row["cpu_ms_per_step"] == pytest.approx(1000 * row["cpu_s"] / row["steps"])
    ttft1 = lambda k: rows[k]["per_class"]["1"]["ttft_p99"]  # noqa: E731
    assert ttft1("triage") < ttft1("vllm-fcfs")
    assert rows["triage"]["plan_mismatches"] == 0
    bad = runner.invoke(app, ["bench", "peers", "--scenario", "flood"])
    assert bad.exit_code == 2 and "--scenario must be trace or burst" in bad.output
