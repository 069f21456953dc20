from pathlib import Path

import pytest

from triage.classes import load_classes
from triage.policies import make_policy
from triage.profiles import load_profile
from triage.sim.metrics import summarize
from triage.sim.simulator import simulate
from triage.sim.traces import KTAS_MIX, load_trace, poisson_trace, spike_trace
from triage.paths import shared_datasets_dir

AZURE = shared_datasets_dir() / "azure_llm_2023_conv.csv.gz"
MOONCAKE = shared_datasets_dir() / "mooncake_fast25_conversation_trace.csv.gz"
needs_data = pytest.mark.skipif(not AZURE.exists(), reason="shared datasets not found beside the checkout")


@needs_data
def test_azure_loader_scales_arrivals_and_draws_the_ktas_mix():
    a = load_trace(AZURE, limit=2000)
    b = load_trace(AZURE, limit=2000, rate_scale=2.0)
    assert a[0].arrival == 0 and a[1].arrival > 0
    assert b[-1].arrival == pytest.approx(a[-1].arrival / 2)
    share1 = sum(t.level == 1 for t in a) / len(a)
    share3 = sum(t.level == 3 for t in a) / len(a)
    assert abs(share1 - KTAS_MIX[0]) < 0.01 and abs(share3 - KTAS_MIX[2]) < 0.03
    assert [t.level for t in a] == [t.level for t in load_trace(AZURE, limit=2000)], "levels are seeded"


@needs_data
def test_mooncake_loader_reads_milliseconds():
    t = load_trace(MOONCAKE, limit=50)
    assert t[-1].arrival < 60 and t[0].prompt_len > 1000


def test_requests_longer_than_the_engine_are_clipped_like_a_vllm_client_must(tmp_path: Path):
    p = tmp_path / "t.csv"
    p.write_text("arrival,prompt_tokens,output_tokens\n0,100,50\n1,5000,300\n2,100,3000\n")
    fits, long_prompt, long_output = load_trace(p, max_len=2048)
    assert (fits.prompt_len, fits.output_len) == (100, 50), "a request that fits is unchanged"
    assert (long_prompt.prompt_len, long_prompt.output_len) == (1748, 300)
    assert (long_output.prompt_len, long_output.output_len) == (100, 1024), "output keeps at most half"
    assert all(t.prompt_len + t.output_len <= 2048 for t in (fits, long_prompt, long_output))


@needs_data
def test_mooncake_runs_on_four_instances_without_stalling_on_its_longest_prompts():
    """Mooncake prompts reach 126k tokens: clipped to what one instance can hold, every
    request finishes (without the clip, the full-prompt KV gate never admits them)."""
    from triage.sim.cluster import simulate_cluster

    prof = load_profile("a100-qwen1.5-7b-analytic")
    classes = load_classes().scaled(prof.slo_scale)
    trace = load_trace(MOONCAKE, limit=400, rate_scale=0.5, max_len=prof.max_request_tokens)
    assert max(t.prompt_len + t.output_len for t in trace) <= prof.max_request_tokens
    res = simulate_cluster(trace, lambda: make_policy("triage"), prof, classes, instances=4, router="gorouting")
    assert len(res.requests) == len(trace)
    assert all(r.generated == r.output_len for r in res.requests)

@needs_data
def test_triage_on_the_cpu_profile_past_its_kv_limit_finishes_every_request():
    """The Azure trace at the small CPU profile's knee fills its KV cache with 32 running
    answers: an earlier build planned an empty step there ("empty plan with 113 requests
    left") and the engine would have stalled; a running request out of blocks frees them."""
    prof = load_profile("vllm-cpu-smollm2")
    classes = load_classes().scaled(prof.slo_scale)
    trace = load_trace(AZURE, limit=300, rate_scale=0.04, max_len=prof.max_request_tokens)
    res = simulate(trace, prof.make_policy("triage"), prof, classes, seed=0)
    assert len(res.requests) == len(trace)
    assert all(r.generated == r.output_len for r in res.requests)
    s = summarize(res.requests, classes, "triage")
    assert s["per_class"]["1"]["slo_attainment"] == 1.0



def test_generic_csv_with_levels(tmp_path: Path):
    p = tmp_path / "t.csv"
    p.write_text("arrival,prompt_tokens,output_tokens,level\n0.5,10,5,1\n0.0,20,3,4\n")
    t = load_trace(p)
    assert [(x.arrival, x.level) for x in t] == [(0.0, 4), (0.5, 1)]


def test_bad_traces_are_clear_errors(tmp_path: Path):
    p = tmp_path / "bad.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="unknown trace columns"):
        load_trace(p)
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="rate_scale"):
        load_trace(p, rate_scale=0)


def test_simulation_is_deterministic_and_finishes_everything():
    prof = load_profile()
    classes = load_classes().scaled(prof.slo_scale)
    trace = poisson_trace(300, rate=3.0, seed=5)
    a = simulate(trace, make_policy("triage"), prof, classes, seed=3)
    b = simulate(trace, make_policy("triage"), prof, classes, seed=3)
    assert len(a.requests) == 300 and all(len(r.token_times) == r.output_len for r in a.requests)
    assert [r.token_times for r in a.requests] == [r.token_times for r in b.requests]
    c = simulate(trace, make_policy("triage"), prof, classes, seed=4)
    assert [r.token_times for r in a.requests] != [r.token_times for r in c.requests]


def test_spike_of_level1_requests_is_served_first_by_triage_not_by_fcfs():
    prof = load_profile()
    classes = load_classes().scaled(prof.slo_scale)
    base = poisson_trace(400, rate=4.0, seed=2, prompt=(200, 2000), output=(50, 400), mix=(0, 0, 0, 0.5, 0.5))
    trace = spike_trace(base, at=30.0, count=20, level=1, gap=0.2)
    res = {p: summarize(simulate(trace, make_policy(p), prof, classes).requests, classes, p) for p in ("fcfs", "triage")}
    assert res["triage"]["per_class"]["1"]["slo_attainment"] >= 0.95
    assert res["triage"]["per_class"]["1"]["ttft_p99"] < res["fcfs"]["per_class"]["1"]["ttft_p99"]
