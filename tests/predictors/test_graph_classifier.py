"""The predictors served from their ONNX graph alone (no torch): the same predictions as
the full load, and the full load whenever the graph cannot be trusted."""
from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from predictors import graph_classifier
from predictors.model import Classifier
from predictors.onnx_graph import graph_path, int8_path
from predictors.service import Predictor
from triage.paths import REPO_ROOT

from conftest import train_all_if_missing
from test_pred_model import EDGE_TEXTS


def _texts() -> list[str]:
    from predictors.corpus import load_corpus

    return [r["text"] for r in load_corpus("test")[:150]] + list(EDGE_TEXTS.values())


def _dirs(home):
    return home / "predictors" / "urgency", home / "predictors" / "length"


def _full(home, runtime: str) -> Predictor:
    """The full load (PyTorch models, then the runtime), as on a first start."""
    p = Predictor(*_dirs(home), runtime=runtime, threads=2)
    if isinstance(p.urgency, Classifier):
        return p
    mp = pytest.MonkeyPatch()
    mp.setattr(graph_classifier, "load", lambda *a, **k: None)
    try:
        return Predictor(*_dirs(home), runtime=runtime, threads=2)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def made(trained_home):
    """The predictors' home after a full load has made (or found) the graphs."""
    for runtime in ("onnx", "auto"):
        _full(trained_home, runtime)
    return trained_home


@pytest.mark.parametrize("runtime", ["auto", "onnx"])
def test_the_graph_alone_predicts_what_the_full_load_does(made, runtime):
    """int8 one text a pass ("auto") and fp32 in padded batches ("onnx"): levels, length
    buckets and estimates equal; probabilities and the site adapters' features equal to
    float rounding."""
    full = _full(made, runtime)
    alone = Predictor(*_dirs(made), runtime=runtime, threads=2)
    assert isinstance(alone.urgency, graph_classifier.GraphClassifier)
    assert alone.urgency.runtime == full.urgency.runtime and alone.shared_encoder
    texts = _texts()
    a, b = full.predict(texts), alone.predict(texts)
    assert [(x.level, x.predicted_level, x.length_bucket, x.length_tokens_estimate, x.reasons) for x in a] == \
           [(x.level, x.predicted_level, x.length_bucket, x.length_tokens_estimate, x.reasons) for x in b]
    assert max(np.abs(np.subtract(x.probs, y.probs)).max() for x, y in zip(a, b)) < 1e-5
    assert max(np.abs(x.features - y.features).max() for x, y in zip(a, b)) < 1e-4
    # the length head as served (on the full load it runs on the urgency classifier's pass)
    assert np.allclose(full.urgency.all_probs(texts[:20])[1], alone.length.probs(texts[:20]), atol=1e-5)
    assert [p.shape for p in alone.urgency.all_logits([])] == [p.shape for p in full.urgency.all_logits([])]


def test_the_tokenizer_cuts_and_pads_as_transformers_does(made):
    full, alone = _full(made, "onnx"), Predictor(*_dirs(made), runtime="onnx", threads=2)
    texts = _texts()[:60]
    want, got = full.urgency.encode(texts), alone.urgency.encode(texts)
    for k in ("input_ids", "attention_mask", "token_type_ids"):
        assert np.array_equal(want[k].numpy(), got[k]), k
    assert got["input_ids"].shape[1] <= alone.urgency.meta.max_length


def test_a_front_end_process_loads_the_predictors_without_torch(made):
    code = ("import sys, time; t = time.time(); from predictors.service import Predictor; "
            f"p = Predictor({str(_dirs(made)[0])!r}, {str(_dirs(made)[1])!r}); p.predict(['chest pain, SBP 80']); "
            "print(p.urgency.runtime, 'torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["onnx-int8", "False", "False"]


def test_new_weights_or_a_damaged_graph_take_the_full_load(made, tmp_path, caplog):
    home = tmp_path / "home"
    shutil.copytree(made / "predictors", home / "predictors")
    u, ln = _dirs(home)
    assert graph_classifier.load(u, ln, 2, "auto") is not None
    assert graph_classifier.load(u, ln, 2, "torch") is None            # not an ONNX runtime
    meta = (ln / "triage_meta.json").read_text()
    with open(ln / "model.safetensors", "ab") as f:                    # the length model retrained
        f.write(b"\0")
    assert graph_classifier.load(u, ln, 2, "auto") is None
    shutil.copy(made / "predictors" / "length" / "model.safetensors", ln / "model.safetensors")
    int8_path(graph_path(u, ["urgency", "length", "pooledmean"])).write_bytes(b"not a graph")
    with caplog.at_level("WARNING"):
        assert graph_classifier.load(u, ln, 2, "auto") is None
    assert "did not load alone" in caplog.text
    assert (ln / "triage_meta.json").read_text() == meta


def test_setup_leaves_the_graph_made_so_the_first_start_needs_no_torch(baked_home):
    """`triage train all --if-missing` (the setup script's step) on trained weights without
    a graph makes it; the service's first start then loads the graph alone."""
    home, first = baked_home
    u, ln = _dirs(home)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "skipping" in first.stderr and "ONNX graph made" in first.stderr   # nothing retrained
    assert graph_classifier.load(u, ln, 2, "auto") is not None
    again = train_all_if_missing(home)
    assert again.returncode == 0 and "its ONNX graph found" in again.stderr, again.stderr[-2000:]
