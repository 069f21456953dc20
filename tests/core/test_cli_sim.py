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


# --- scheduler inputs, TPOT metric, error-rate study, burst ---------------------------------

def _tiny_trace(tmp_path, n=60):
    p = tmp_path / "tiny.csv"
    p.write_text("arrival,prompt_tokens,output_tokens,level\n" +
                 "".join(f"{i * 0.3},{100 + 7 * i},{10 + i % 20},{1 + i % 5}\n" for i in range(n)))
    return p


def _last_json(res):
    return json.loads([x for x in res.stdout.splitlines() if x.strip()][-1])


def test_simulate_with_noisy_levels_reports_per_gold_level_with_classifier_figures(tmp_path):
    res = runner.invoke(app, ["simulate", "--trace", str(_tiny_trace(tmp_path)), "--levels", "noisy:0.4",
                              "--lengths", "noisy:0.5", "--tpot-metric", "running", "--json"])
    assert res.exit_code == 0, res.output
    d = _last_json(res)
    assert d["simulated"] is True and d["tpot_metric"] == "running"
    assert d["inputs"]["levels"] == "noisy:0.4" and d["inputs"]["lengths"] == "noisy:0.5"
    assert 0.3 < 1 - d["classifier"]["accuracy"] < 0.8
    assert sum(c["requests"] for c in d["per_class"].values()) == 60
    assert sum(c["seen_other_level"] for c in d["per_class"].values()) > 0
    assert {"mape_uncorrected", "mape_corrected", "beta_final", "truth"} <= set(d["estimator"])


@pytest.mark.parametrize("args, message", [
    (["--levels", "noisy:2"], "between 0 and 1"),
    (["--levels", "noisy:abc"], "between 0 and 1"),
    (["--lengths", "guess"], "oracle, predicted or noisy"),
    (["--texts", "nope-pool"], "unknown --texts"),
    (["--tpot-metric", "median"], "tpot-metric"),
    (["--truth", "oracle"], "unknown --truth"),
    (["--rate-scale", "0"], "rate-scale"),
    (["--scenario", "flood"], "scenario"),
    (["--instances", "2", "--router", "gorouting", "--router-param", "nope=1"], "nope"),
])
def test_bad_simulator_arguments_are_clear_errors(tmp_path, args, message):
    res = runner.invoke(app, ["simulate", "--trace", str(_tiny_trace(tmp_path, 5)), *args])
    assert res.exit_code != 0
    assert message in res.output


def test_bench_error_rate_json_rows_and_plot(tmp_path):
    png = tmp_path / "er.png"
    res = runner.invoke(app, ["bench", "error-rate", "--trace", str(_tiny_trace(tmp_path)), "--rates", "0,0.3",
                              "--policies", "triage,fcfs", "--rate-scale", "2", "--predicted-texts", "none",
                              "--plot", str(png), "--json"])
    assert res.exit_code == 0, res.output
    rows = _last_json(res)["rows"]
    assert [(r["policy"], r["rate"]) for r in rows] == [("triage", 0.0), ("fcfs", 0.0), ("triage", 0.3), ("fcfs", 0.3)]
    for r in rows:
        assert {"policy", "rate", "esi1_norm_wait", "esi1_slo_attainment", "tdg_ratio"} <= set(r)
    assert rows[0]["esi1_norm_wait"] > 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    bad = runner.invoke(app, ["bench", "error-rate", "--rates", "0,1.5", "--predicted-texts", "none"])
    assert bad.exit_code != 0 and "--rates" in bad.output
    bad = runner.invoke(app, ["bench", "error-rate", "--policies", "triage,nope", "--predicted-texts", "none"])
    assert bad.exit_code != 0 and "unknown policies" in bad.output
    for p in ("protected_pace=2", "no_such_knob=1"):
        bad = runner.invoke(app, ["bench", "error-rate", "--param", p, "--predicted-texts", "none"])
        assert bad.exit_code == 2 and "bad triage parameter" in bad.output, bad.output


def test_bench_error_rate_param_reaches_the_triage_policy_only(tmp_path):
    args = ["bench", "error-rate", "--trace", str(_tiny_trace(tmp_path)), "--rates", "0", "--policies", "triage,fcfs",
            "--rate-scale", "2", "--predicted-texts", "none", "--json"]
    plain = _last_json(runner.invoke(app, args))
    paced = _last_json(runner.invoke(app, args + ["--param", "protected_pace=0.25"]))
    assert paced["params"] == {"triage": {"protected_pace": 0.25}} and plain["params"] == {}
    assert paced["rows"][1] == plain["rows"][1]                    # fcfs untouched


def test_bench_policies_takes_the_scheduler_inputs(tmp_path):
    res = runner.invoke(app, ["bench", "policies", "--trace", str(_tiny_trace(tmp_path)), "--policies",
                              "fcfs,fcfs-prefill-first", "--rate-scales", "2", "--levels", "noisy:0.2",
                              "--tpot-metric", "max-gap", "--json"])
    assert res.exit_code == 0, res.output
    d = _last_json(res)
    assert d["levels"] == "noisy:0.2" and d["tpot_metric"] == "max-gap"
    assert all("classifier" in r for r in d["rows"])


def _predictors_trained() -> bool:
    from triage.paths import state_dir

    return all((state_dir() / "predictors" / k / "triage_meta.json").exists() for k in ("urgency", "length"))


@pytest.mark.skipif(not _predictors_trained(), reason="predictors not trained (triage train all)")
def test_simulate_with_predicted_levels_and_lengths_from_a_text_file(tmp_path):
    from triage.paths import state_dir

    texts = tmp_path / "pool.jsonl"
    rows = [("unconscious, not breathing, no pulse", 1), ("chest pain radiating to left arm, sweating", 2),
            ("abdominal pain since yesterday, vomiting twice", 3), ("sprained ankle playing football", 4),
            ("needs a prescription refill", 5)]
    texts.write_text("".join(json.dumps({"text": f"{t} (case {k})", "level": lv}) + "\n"
                             for t, lv in rows for k in range(2)))
    args = ["simulate", "--trace", str(_tiny_trace(tmp_path)), "--levels", "predicted", "--lengths", "predicted",
            "--texts", str(texts), "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    d = _last_json(res)
    c = d["classifier"]
    assert c["n"] == 60 and 0 <= c["accuracy"] <= 1 and "under_triage_1_2" in c
    assert c["distinct_texts"]["n"] == 10
    assert d["inputs"]["texts"] == str(texts) and d["inputs"]["length_error"]["mean_true"] > 0
    p = d["inputs"]["predictions"]
    assert (state_dir() / "cache").exists() and p["computed"] + p["cached"] == 10
    again = _last_json(runner.invoke(app, args))
    assert again["inputs"]["predictions"]["computed"] == 0, "predictions are cached per model fingerprint"
    assert again["per_class"] == d["per_class"]


def _served_model_ready() -> bool:
    from triage.paths import state_dir

    return (state_dir() / "models" / "SmolLM2-135M-Instruct" / "tokenizer_config.json").exists()


def test_a_simulated_burst_call_answers_as_long_as_it_does_live():
    """Every text bench serve sends has its answer length measured at bench serve's own
    sampling (temperature 0, `scripts/answer_lengths.py --bench`): the chat prompts no
    longer all run to the cap in the simulator (live they average ~40 of 64 tokens)."""
    from serving.bench.texts import data_dir, load_chat, load_pool
    from serving.cli.sim_inputs import BENCH_LENGTHS, answer_tokens, text_key

    doc = json.loads((data_dir() / "bench" / BENCH_LENGTHS).read_text())
    assert doc["measured_with"]["overrides"] == {"temperature": 0.0} and doc["measured_with"]["max_tokens"] >= 64
    texts = [t.text for t in load_pool("corpus-test")], [t.text for t in load_chat()]
    assert all(text_key(t) in doc["lengths"] for group in texts for t in group)
    out = answer_tokens(64)
    chat = [out(t) for t in texts[1]]
    assert 20 < sum(chat) / len(chat) < 60 and min(chat) < 64 <= max(chat)
    assert max(answer_tokens(16)(t) for t in texts[1]) == 16
    assert answer_tokens(64)("a text bench serve never sends") == 64


@pytest.mark.skipif(not _served_model_ready(), reason="served model not prepared (its tokenizer counts the prompts)")
def test_simulated_burst_prints_bench_serve_shape():
    """(--levels predicted runs our classifier on the burst's texts: the same path as
    the JSONL test above; noisy levels keep this test free of the predictors.)"""
    res = runner.invoke(app, ["simulate", "--scenario", "burst", "--requests", "20", "--spread", "1",
                              "--texts", "corpus-test", "--levels", "noisy:0.2", "--json"])
    assert res.exit_code == 0, res.output
    d = _last_json(res)
    assert d["scenario"] == "burst" and d["simulated"] and d["requests"] == 20
    assert d["engine"]["max_num_seqs"] == 32 and d["engine"]["max_num_batched_tokens"] == 2048
    s = d["systems"]["sim-triage"]
    assert s["completed"] == 20 and s["errors"] == 0 and s["tokens_per_s"] > 0 and s["idle_ttft_ms"] > 0
    for lv in s["per_level"].values():
        assert {"n", "ttft_p50_ms", "ttft_p99_ms", "ttft_max_ms", "slo_attainment", "tpot_mean_ms"} <= set(lv)
    assert "accuracy" in s["classifier"] and d["truth"]["kind"] == "measured"
    # by default each call produces what the served model answers it (measured at bench
    # serve's sampling, data/bench/answer_lengths.json); --output-tokens N: N each
    assert d["output_tokens"] == "answers" and 1 < d["output_tokens_per_call"] < 64
    fixed = _last_json(runner.invoke(app, ["simulate", "--scenario", "burst", "--requests", "20", "--spread", "1",
                                           "--texts", "corpus-test", "--levels", "noisy:0.2", "--output-tokens", "10",
                                           "--json"]))
    assert fixed["output_tokens"] == 10 and fixed["output_tokens_per_call"] == 10
    bad = runner.invoke(app, ["simulate", "--scenario", "burst", "--texts", "nope-pool"])
    assert bad.exit_code != 0 and "unknown --texts" in bad.output


def test_simulate_a_cluster_with_router_parameters_and_seat_stealing(tmp_path):
    """`--router-param` reaches the router, `--steal` the cluster; the JSON says which."""
    base = ["simulate", "--trace", str(_tiny_trace(tmp_path)), "--instances", "2", "--router", "gorouting", "--json"]
    res = runner.invoke(app, base + ["--router-param", "seat_wait=false", "--steal"])
    assert res.exit_code == 0, res.output
    d = _last_json(res)
    assert d["router"] == "gorouting" and d["router_params"] == {"seat_wait": False} and d["steal"] is True
    assert sum(c["requests"] for c in d["per_class"].values()) == 60


def test_a_burst_simulated_on_the_steps_of_a_live_step_log_runs_at_that_machines_speed(tmp_path):
    """`--truth steplog:FILE`: the simulated engine's steps take what the steps of a live
    engine's step log took. A log from a machine three times faster than the profile's fit
    makes the simulated burst about three times faster; the JSON names the log."""
    from serving.steplog_report import engine_steps
    from triage.estimators import Work
    from triage.profiles import load_profile

    args = ["simulate", "--scenario", "burst", "--requests", "20", "--spread", "1", "--texts", "corpus-test",
            "--levels", "noisy:0.2", "--policy", "fcfs", "--json"]
    model = _last_json(runner.invoke(app, args + ["--truth", "model"]))
    fitted = load_profile(model["profile"]).estimator("proserve")
    rows, t = [], 100.0
    for step in range(1, 201):   # 8 calls at a time: a prompt of 40 tokens, then 24 decodes each
        k = (step - 1) % 25
        ran = [[f"c{(step - 1) // 25}-{j}", 3, 40 if k == 0 else 1, "prefill" if k == 0 else "decode"] for j in range(8)]
        rows.append({"step": step, "t": t, "running": 8, "waiting": 0, "ran": ran, "preempted": []})
        t += 0.05
    for r, (works, _) in zip(rows, engine_steps([dict(r, exec_ms=1.0) for r in rows])):
        r["exec_ms"] = 1000 * fitted._batch_time([Work(*w) for w in works]) / 3
    log = tmp_path / "steps.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    fast = _last_json(runner.invoke(app, args + ["--truth", f"steplog:{log}"]))
    assert fast["truth"]["kind"] == "measured" and str(log) in fast["truth"]["source"] and fast["truth"]["samples"] == 200
    ratio = fast["systems"]["sim-fcfs"]["tokens_per_s"] / model["systems"]["sim-fcfs"]["tokens_per_s"]
    assert 2.2 < ratio < 4.0, ratio
    bad = runner.invoke(app, args + ["--truth", f"steplog:{tmp_path / 'missing.jsonl'}"])
    assert bad.exit_code != 0 and "no step log at" in bad.output
