"""Seed reproductions (`triage bench reproduce`): the traces they build, the goodput
read-out, and the command's report shape on a quick run."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from serving.cli import app
from triage.paths import shared_datasets_dir
from triage.sim.reproduce.common import largest_passing
from triage.sim.traces import concurrent_spikes, lengths_trace, resolve_trace

SHARED = shared_datasets_dir()
needs_data = pytest.mark.skipif(not (SHARED / "lengths_sharegpt_8k_llama2tok.csv.gz").exists(),
                                reason="shared datasets not found beside the checkout")


def test_concurrent_spikes_arrive_simultaneously():
    tr = concurrent_spikes(arrivals=20, max_concurrent=100, gap=0.1, seed=3)
    times, counts = np.unique([t.arrival for t in tr], return_counts=True)
    assert len(times) == 20 and np.allclose(np.diff(times), 0.1)
    assert counts.max() <= 100 and counts.max() > 50          # up to 100 at one instant
    with pytest.raises(ValueError):
        concurrent_spikes(arrivals=0, max_concurrent=5, gap=0.1)


@needs_data
def test_lengths_tables_replay_as_poisson_traces():
    tr = lengths_trace("sharegpt", rate=4.0, limit=2000, seed=1)
    assert len(tr) == 2000 and tr[0].arrival == 0.0
    gaps = np.diff([t.arrival for t in tr])
    assert (gaps >= 0).all() and abs(gaps.mean() - 0.25) < 0.03      # 4 req/s
    assert tr[0].prompt_len == 74 and tr[0].output_len == 918          # the file's first row
    faster = resolve_trace("lengths:sharegpt", rate=4.0, rate_scale=2.0, limit=2000, seed=1)
    assert faster[-1].arrival == pytest.approx(tr[-1].arrival / 2)
    with pytest.raises(ValueError, match="--rate"):
        resolve_trace("lengths:arxiv", limit=10)
    with pytest.raises(FileNotFoundError, match="sharegpt"):
        lengths_trace("nope", rate=1.0)


def test_goodput_read_out_interpolates_between_the_last_pass_and_first_miss():
    assert largest_passing([(1, 1.0), (2, 0.95), (3, 0.85)], 0.9) == pytest.approx(2.5)
    assert largest_passing([(1, 0.5), (2, 0.4)], 0.9) == 0.0
    assert largest_passing([(1, 1.0), (2, 0.99)], 0.9) == 2


def test_unknown_seed_is_a_clear_error():
    res = CliRunner().invoke(app, ["bench", "reproduce", "--seed", "007"])
    assert res.exit_code != 0 and "unknown seed" in res.output


@needs_data
def test_reproduce_004_quick_has_the_documented_json_shape(tmp_path):
    png = tmp_path / "s004.png"
    res = CliRunner().invoke(app, ["bench", "reproduce", "--seed", "004", "--quick", "--json", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout.strip().splitlines()[-1])
    assert d["seed"] == "004" and d["simulated"] is True and png.exists()
    assert set(d["esi1_norm_wait"]) >= {"fcfs", "sjf", "hpjf", "semantic", "triage"}
    assert all(v > 0 for v in d["esi1_norm_wait"].values())
    for r in d["rows"]:
        assert set(r) == {"metric", "paper", "ours", "setup"}


def test_seed000_ablation_batch_capacity_follows_alg1():
    """Alg. 1 bounds a latency-aware batch by its time budget and memory (no token budget);
    'w/o latency-aware' is the static token budget; η is one static step (not below it)."""
    from triage.estimators import Work
    from triage.profiles import load_profile
    from triage.sim.reproduce import seed000

    prof = load_profile(seed000.PROFILE)
    eta = seed000.static_step_eta()
    assert eta == round(prof.estimator().batch_time([Work(prof.limits.max_num_batched_tokens, 0)]), 3)
    assert prof.estimator().t_c < eta <= 0.2          # inside [t_c, TPOT SLO]
    steps = {s.label: s for s in seed000.ablation_steps()}
    assert [s.label for s in seed000.STEPS] == ["w/ only deadline", "w/ only density", "w/o latency-aware", "ours"]
    assert steps["w/o latency-aware"].max_num_batched_tokens is None          # the profile's static 512
    assert steps["w/o latency-aware"].params["latency_aware"] is False
    for k in ("w/ only deadline", "w/ only density", "ours"):
        assert steps[k].max_num_batched_tokens == seed000.UNBOUND_TOKENS
        assert steps[k].params["eta"] == eta
    # §4.3's engine (decodes always in the batch) under every step; Alg. 1 as printed beside
    assert all(s.params["decodes"] == "always" for s in seed000.STEPS)
    assert seed000.PRINTED.params == {**steps["ours"].params, "decodes": "queue"}


def test_envelope_attainment_needs_every_token_inside_its_deadline():
    """Seed 001's SLO (every per-token deadline a + L_ttft + k·L_tbt) and seed 002's
    envelope: one late token is a miss, a rejected request is a miss."""
    from types import SimpleNamespace

    from triage.sim.reproduce.common import envelope_attainment, uniform_classes

    classes = uniform_classes(1.0, 0.1, weights=(1.0,))
    ok = SimpleNamespace(arrival=0.0, level=1, token_times=[0.9, 1.05, 1.2])      # deadlines 1.0, 1.1, 1.2
    late = SimpleNamespace(arrival=0.0, level=1, token_times=[0.5, 0.6, 1.25])    # mean TPOT fine, last token late
    assert envelope_attainment({"requests_done": [ok, late], "rejected": 0}, classes) == 0.5
    assert envelope_attainment({"requests_done": [ok], "rejected": 1}, classes) == 0.5
