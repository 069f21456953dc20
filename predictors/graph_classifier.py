"""Both predictors served from their stamped ONNX graph alone: no torch, no transformers.

The first load after training (`triage train all` does it, so the setup script leaves the
graph made) loads the urgency and length models in PyTorch, checks that they share an
encoder (`model.shares_encoder`), then exports, quantises and checks one graph for both
heads and the pooled vector (`predictors.onnx_graph`), and from then on runs only that
graph. Every later start would repeat the PyTorch load just to find the graph already
made. `load` skips it: when the graph's stamp names the weights on disk, it
loads the graph, the tokenizer (the `tokenizers` library, reading the same
`tokenizer.json` transformers' fast tokenizer reads, with the same truncation and padding)
and the two `triage_meta.json` files, and nothing else. A front end in front of remote
instances then never imports torch (about 1 s to load instead of ~6, and some 500 MB less
resident), and the predictions are the same ones (`tests/predictors/test_graph_classifier.py`).
When the graph is missing, was made from other weights, or the runtime asked for is not an
ONNX one, `load` returns None and `Predictor` takes the full path (which makes the graph).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from predictors.embedding import KIND as POOLED_KIND
from predictors.model import ClassifierMeta, Heads, clean_text
from predictors.onnx_graph import OnnxGraph, graph_fingerprint, graph_path, int8_path, int8_refused, stamp

log = logging.getLogger(__name__)


class GraphPass:
    """The shared graph and the tokenizer that feeds it: one pass gives every head's output."""

    def __init__(self, graph: OnnxGraph, tokenizer) -> None:
        self.graph, self.tokenizer = graph, tokenizer

    def encode(self, texts: list[str]) -> dict[str, np.ndarray]:
        """As `model.Classifier.encode`: cleaned, truncated to the model's length, padded to the longest."""
        enc = self.tokenizer.encode_batch([clean_text(t) for t in texts])
        return {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64)}

    def __call__(self, texts: list[str], batch_size: int = 64) -> list[np.ndarray]:
        """[urgency logits, length logits, pooled vector] for `texts`."""
        if not texts:   # no rows, each output's own width
            return [p[:0] for p in self.graph(self.encode([""]))]
        batches = [self.graph(self.encode(texts[i:i + batch_size])) for i in range(0, len(texts), batch_size)]
        return [np.concatenate(parts) for parts in zip(*batches)]


class GraphClassifier(Heads):
    """One of the graph's heads with the interface of `model.Classifier` that the service
    uses: `dir`, `meta`, `runtime`, `heads` and the logits and probabilities. The urgency
    classifier's heads are all three outputs (as on the full load, where it runs the length
    head and the pooled vector on its encoder pass); the length classifier's its own."""

    def __init__(self, model_dir: Path, meta, runtime: str, shared: GraphPass, outputs: slice,
                 heads: tuple = ()) -> None:
        self.dir, self.meta, self.runtime, self.shared, self.outputs = model_dir, meta, runtime, shared, outputs
        self.heads = (self, *heads)

    def encode(self, texts: list[str]) -> dict[str, np.ndarray]:
        return self.shared.encode(texts)

    def all_logits(self, texts: list[str], batch_size: int = 64) -> list[np.ndarray]:
        return self.shared(texts, batch_size)[self.outputs]


def load(urgency_dir: Path, length_dir: Path, threads: int | None,
         runtime: str) -> tuple[GraphClassifier, GraphClassifier] | None:
    """(urgency, length) served from the graph made for these weights, or None when only
    the full load can serve `runtime` here (see the module docstring)."""
    if runtime not in ("auto", "onnx-int8", "onnx"):
        return None
    try:
        import onnxruntime  # noqa: F401
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        um, lm = ClassifierMeta.load(urgency_dir), ClassifierMeta.load(length_dir)
    except (OSError, ValueError, TypeError):
        return None
    kinds = [um.kind, lm.kind, POOLED_KIND]
    fp32 = graph_path(urgency_dir, kinds)
    int8 = int8_path(fp32)
    if not fp32.exists():
        return None
    # OnnxGraph.export_for's base and heads: the urgency encoder; urgency, length, pooled vector on it
    want = graph_fingerprint([urgency_dir, urgency_dir, length_dir, urgency_dir])
    if stamp(fp32).get("weights_sha256") != want:
        return None
    if runtime != "onnx" and int8.exists() and stamp(int8).get("weights_sha256") == want:
        path, kind = int8, "onnx-int8"
    elif runtime == "onnx" or (runtime == "auto" and int8_refused(int8, want)):
        path, kind = fp32, "onnx"   # "auto" where int8 was refused for these weights: the full load's choice too
    else:
        return None
    try:
        tok = Tokenizer.from_file(str(urgency_dir / "tokenizer.json"))
        conf = json.loads((urgency_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        tok.enable_truncation(max_length=um.max_length, direction=conf.get("truncation_side", "right"))
        pad = conf.get("pad_token") or "[PAD]"
        tok.enable_padding(direction=conf.get("padding_side", "right"), pad_id=tok.token_to_id(pad) or 0,
                           pad_type_id=int(conf.get("pad_token_type_id", 0)), pad_token=pad)
        graph = OnnxGraph(path, threads, one_text_per_pass=kind == "onnx-int8")
        graph.input_names   # loads the session: a damaged file falls back here, not at the first call
    except Exception as e:   # tokenizers and ONNX Runtime raise their own exception types
        log.warning("the predictors' graph %s did not load alone (%s): loading the models in full", path.name, e)
        return None
    shared = GraphPass(graph, tok)
    length = GraphClassifier(length_dir, lm, kind, shared, slice(1, 2))
    pooled = SimpleNamespace(meta=SimpleNamespace(kind=POOLED_KIND, temperature=1.0))
    return GraphClassifier(urgency_dir, um, kind, shared, slice(0, 3), heads=(length, pooled)), length
