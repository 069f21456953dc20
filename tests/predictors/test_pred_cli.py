"""CLI JSON shapes: classify, classify --file, evaluate urgency and length, bench classify."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from serving.cli.apps import app
import serving.cli  # noqa: F401  (registers the commands)

runner = CliRunner()


def _json_lines(out: str) -> list[dict]:
    return [json.loads(l) for l in out.splitlines() if l.strip().startswith("{")]


def test_classify_text(home_env):
    r = runner.invoke(app, ["classify", "my wife collapsed and is not breathing"])
    assert r.exit_code == 0, r.output
    (obj,) = _json_lines(r.stdout)
    assert set(obj) == {"level", "probs", "length_bucket"}
    assert obj["level"] in range(1, 6) and len(obj["probs"]) == 5 and isinstance(obj["length_bucket"], int)


def test_classify_file(home_env, tmp_path):
    f = tmp_path / "in.txt"
    f.write_text("chest pain, age 70\nneed a work note\n🚑 help\n\n", encoding="utf-8")
    r = runner.invoke(app, ["classify", "--file", str(f)])
    assert r.exit_code == 0, r.output
    objs = _json_lines(r.stdout)
    assert len(objs) == 4  # one per line, empty line included
    assert all(set(o) == {"level", "probs", "length_bucket"} for o in objs)


def test_classify_needs_exactly_one_input(home_env):
    assert runner.invoke(app, ["classify"]).exit_code != 0


@pytest.mark.parametrize("command", [["classify", "chest pain"], ["evaluate", "urgency"], ["bench", "classify"]])
def test_an_unknown_runtime_is_a_clear_error(home_env, command):
    r = runner.invoke(app, [*command, "--runtime", "fp16"])
    said = " ".join(r.output.replace("│", " ").split())   # the message as read, across the error box's lines
    assert r.exit_code == 2 and "must be one of auto, onnx-int8, onnx, torch, torch-bf16" in said


def test_classify_without_models_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_HOME", str(tmp_path))
    r = runner.invoke(app, ["classify", "x"])
    assert r.exit_code == 2 and "triage train" in r.output


def test_evaluate_corpus_test_json(home_env):
    r = runner.invoke(app, ["evaluate", "urgency", "--dataset", "corpus-test", "--json"])
    assert r.exit_code == 0, r.output
    (rep,) = _json_lines(r.stdout)
    assert {"n", "accuracy", "macro_f1", "under_triage_1_2", "level1_recall", "confusion"} <= set(rep)
    assert rep["n"] == sum(map(sum, rep["confusion"])) > 300
    assert 0 <= rep["ece"] < 0.5 and 0 <= rep["ece_uncalibrated"] < 0.5  # calibration of the urgency probabilities


def test_evaluate_length_json(home_env):
    r = runner.invoke(app, ["evaluate", "length", "--json"])
    assert r.exit_code == 0, r.output
    (rep,) = _json_lines(r.stdout)
    assert {"accuracy", "within_one", "majority_baseline", "mae_tokens", "capped_fraction", "label_sampling"} <= set(rep)
    assert rep["split"] == "test" and rep["n"] > 300
    assert 0 <= rep["majority_baseline"] <= 1 and 0 <= rep["accuracy"] <= rep["within_one"] <= 1
    assert rep["mae_tokens"] > 0 and 0 <= rep["capped_fraction"] <= 1


def test_evaluate_semigran_json(home_env):
    r = runner.invoke(app, ["evaluate", "urgency", "--dataset", "semigran", "--json"])
    if r.exit_code != 0 and "not found" in r.output:
        pytest.skip("shared datasets not present")
    assert r.exit_code == 0, r.output
    (rep,) = _json_lines(r.stdout)
    assert rep["n"] == 45 and rep["level1_recall"] is None and len(rep["confusion"]) == 3


def test_bench_classify_json(home_env):
    r = runner.invoke(app, ["bench", "classify", "--rate", "20", "--seconds", "1", "--json"])
    assert r.exit_code == 0, r.output
    (rep,) = _json_lines(r.stdout)
    assert {"rate", "p50_ms", "p99_ms"} <= set(rep)
    assert rep["rate"] == 20 and 0 < rep["p50_ms"] <= rep["p99_ms"]
