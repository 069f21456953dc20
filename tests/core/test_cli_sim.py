import json

import pytest
from typer.testing import CliRunner

from serving.cli import app
from triage.paths import shared_datasets_dir

AZURE = shared_datasets_dir() / "azure_llm_2023_conv.csv.gz"
runner = CliRunner()


@pytest.mark.skipif(not AZURE.exists(), reason="shared datasets not found beside the checkout")
def test_simulate_json_has_the_documented_shape(tmp_path):
    out = tmp_path / "req.jsonl"
    res = runner.invoke(app, ["simulate", "--trace", str(AZURE), "--policy", "triage", "--limit", "120",
                              "--rate-scale", "0.1", "--json", "--requests-out", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout.strip().splitlines()[-1])
    assert {"policy", "requests", "tdg_ratio", "slo_attainment", "per_class"} <= set(d)
    assert d["requests"] == 120 and 0 <= d["tdg_ratio"] <= 1
    for c in d["per_class"].values():
        assert {"slo_attainment", "tdg_ratio", "ttft_p50", "ttft_p99", "tpot_p99", "norm_wait_mean"} <= set(c)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 120 and all(len(r["token_times"]) > 0 for r in rows)


def test_unknown_policy_is_a_clear_error():
    res = runner.invoke(app, ["simulate", "--policy", "nope", "--limit", "5"])
    assert res.exit_code != 0 and "unknown policy" in res.output


def test_bench_overhead_prints_percentiles():
    res = runner.invoke(app, ["bench", "overhead", "--waiting", "50", "--running", "20", "--repeats", "20",
                              "--policy", "triage", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["p50_us"] > 0 and d["p99_us"] >= d["p50_us"]


@pytest.mark.skipif(not AZURE.exists(), reason="shared datasets not found beside the checkout")
def test_bench_policies_compares_routers_on_instances_and_plots(tmp_path):
    png = tmp_path / "p.png"
    res = runner.invoke(app, ["bench", "policies", "--trace", str(AZURE), "--policies", "fcfs,triage", "--limit", "150",
                              "--rate-scales", "0.4", "--instances", "2", "--router", "min_load,gorouting",
                              "--plot", str(png), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout.strip().splitlines()[-1])["rows"]
    assert [(r["router"], r["policy"]) for r in rows] == [("min_load", "fcfs"), ("min_load", "triage"),
                                                           ("gorouting", "fcfs"), ("gorouting", "triage")]
    assert all(0 <= r["tdg_ratio"] <= 1 for r in rows)
    assert png.read_bytes()[:4] == b"\x89PNG"
    bad = runner.invoke(app, ["bench", "policies", "--router", "min_load,nope", "--limit", "5"])
    assert bad.exit_code != 0 and "unknown routers" in bad.output
