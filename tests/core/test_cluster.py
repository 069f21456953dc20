"""Multi-instance simulation: N co-located instances or P:D disaggregated."""
from __future__ import annotations

from collections import Counter

import pytest

from triage.classes import load_classes
from triage.policies import make_policy
from triage.profiles import load_profile
from triage.sim.cluster import parse_pd, simulate_cluster
from triage.sim.simulator import simulate
from triage.sim.traces import poisson_trace

PROFILE = load_profile("a5000-qwen1.5-7b")
CLASSES = load_classes().scaled(PROFILE.slo_scale)
TRACE = poisson_trace(150, rate=4.0, seed=3, prompt=(32, 1200), output=(2, 120))


@pytest.mark.parametrize("policy", ["fcfs", "slidebatching", "sedf"])
def test_one_instance_is_step_for_step_the_single_simulator(policy):
    a = simulate(TRACE, make_policy(policy), PROFILE, CLASSES, seed=4)
    b = simulate_cluster(TRACE, policy, PROFILE, CLASSES, seed=4)
    assert a.steps == b.steps
    assert [r.token_times for r in a.requests] == [r.token_times for r in b.requests]


@pytest.mark.parametrize("router", ["round_robin", "min_load", "pab", "gorouting"])
def test_colocated_instances_finish_everything(router):
    res = simulate_cluster(TRACE, "triage", PROFILE, CLASSES, instances=3, router=router, seed=1)
    assert len(res.requests) == len(TRACE)
    assert all(len(r.token_times) == r.output_len for r in res.requests)
    assert set(Counter(r.instance for r in res.requests)) <= {0, 1, 2}
    again = simulate_cluster(TRACE, "triage", PROFILE, CLASSES, instances=3, router=router, seed=1)
    assert [r.token_times for r in res.requests] == [r.token_times for r in again.requests]


def test_round_robin_splits_evenly_and_more_instances_help():
    res = simulate_cluster(TRACE, "fcfs", PROFILE, CLASSES, instances=3, router="round_robin")
    assert sorted(Counter(r.instance for r in res.requests).values()) == [50, 50, 50]
    one = simulate_cluster(TRACE, "fcfs", PROFILE, CLASSES)
    ttft = lambda rs: sum(r.ttft for r in rs) / len(rs)  # noqa: E731
    assert ttft(res.requests) < ttft(one.requests)


@pytest.mark.parametrize("router", ["round_robin", "gorouting", "pab"])
def test_pd_disaggregated_moves_requests_after_their_first_token(router):
    res = simulate_cluster(TRACE, "slidebatching", PROFILE, CLASSES, pd="2:1", router=router,
                           kv_fixed_s=0.05, kv_per_token_s=0.0)
    assert len(res.requests) == len(TRACE)
    for r in res.requests:
        assert len(r.token_times) == r.output_len
        if r.output_len > 1:
            assert r.instance == 2                               # finished on the decode instance
            assert r.token_times[1] - r.token_times[0] >= 0.05   # the KV transfer delay


def test_pd_prefill_instances_use_phi_p():
    seen = []

    def factory():
        p = make_policy("slidebatching")
        seen.append(p)
        return p

    simulate_cluster(TRACE[:20], factory, PROFILE, CLASSES, pd="2:1", decode_policy=None)
    assert [p.phi for p in seen] == ["p", "p", "a"]


def test_parse_pd():
    assert parse_pd("3:2") == (3, 2) and parse_pd(None) is None
    for bad in ("3", "0:1", "a:b", "2:0"):
        with pytest.raises(ValueError):
            parse_pd(bad)


def test_bench_rows_goodput_and_plot(tmp_path):
    from triage.sim.bench import bench_policies, goodput, plot_policies
    trace = tmp_path / "t.csv"
    trace.write_text("arrival,prompt_tokens,output_tokens,level\n" +
                     "".join(f"{i * 0.5},{200 + 10 * i},{20},{1 + i % 5}\n" for i in range(40)))
    out = bench_policies(trace, ["fcfs", "triage"], [1.0, 4.0], limit=None)
    assert [(r["policy"], r["rate_scale"]) for r in out["rows"]] == [("fcfs", 1.0), ("triage", 1.0), ("fcfs", 4.0), ("triage", 4.0)]
    assert all(0 <= r["tdg_ratio"] <= 1 and "1" in r["per_class"] for r in out["rows"])
    g = goodput(trace, "fcfs", 0.9, limit=None, lo=0.5, hi=64.0, tol=0.5)
    assert {"policy", "goodput_scale", "tpot_metric", "levels"} <= set(g) and 0.5 <= g["goodput_scale"] <= 64.0
    png = plot_policies(out["rows"], tmp_path / "p.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bench_cluster_reads_reroutes_and_resumptions_off_the_front_ends_metrics():
    """What `bench cluster` reports of an instance fault: the front end's own counters, as
    the service exports them (a resumed stream is not a lost one)."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    from serving.bench.cluster import fault_counts

    r = CollectorRegistry()
    rer = Counter("triage_rerouted_total", "x", ["reason"], registry=r)
    lost = Counter("triage_instance_lost_total", "x", ["instance"], registry=r)
    rer.labels("resumed_midstream").inc(41)
    rer.labels("instance_fault").inc(3)
    lost.labels("http://a").inc(1)
    lost.labels("http://b").inc(2)
    got = fault_counts(generate_latest(r).decode())
    assert got == {"queue_full": 0, "instance_fault": 3, "resumed_midstream": 41, "seat_move": 0, "lost_midstream": 3}
    assert fault_counts("") == {"queue_full": 0, "instance_fault": 0, "resumed_midstream": 0, "seat_move": 0,
                                "lost_midstream": 0}
