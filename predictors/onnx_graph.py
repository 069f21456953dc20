"""A classifier's forward pass under ONNX Runtime (the predictor service's default runtime).

On a 2-core CPU the service runs micro-batches of one to four short texts; there eager
PyTorch spends much of each pass dispatching small ops. The same fp32 graph, exported once
and run by ONNX Runtime with its BERT fusions (attention, embedding + layer norm, skip layer
norm, bias + GELU), takes about half the time (docs/predictors.md has the figures).

`OnnxGraph.export_for(base, heads)` traces `base`'s encoder followed by each head of `heads`
(classifiers that share `base`'s encoder, see `model.shares_encoder`; `base` itself is
usually the first), so one call returns every head's logits from one encoder pass. It is
exported with torch's TorchScript-based exporter (torch 2.13's dynamo exporter gave hidden
states off by up to 7 for this model), fused by `onnxruntime.transformers.optimizer`, and
checked against PyTorch on probe batches of several lengths, with padding, empty and
non-ASCII text; an export off by more than `TOLERANCE` is refused. The file lives beside the
model (`onnx-<kinds>.onnx`) with a fingerprint of every weight it holds, so a retrained
model is exported again and an unchanged one loads in well under a second.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np

TOLERANCE = 1e-3  # largest |logit difference| accepted between the export and PyTorch
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_PROBES = (
    ["chest pain, HR 120"],
    ["", "abd pain, SBP 85, 72 yo, vomiting since this morning and now confused"],
    ["Mi madre no respira bien 😟 ambulancia por favor", "dolor de pecho", "x " * 5000],
)


class OnnxUnavailable(RuntimeError):
    pass


def weights_fingerprint(model_dir: Path) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(model_dir)):
        if name.endswith((".safetensors", ".bin")):
            with open(model_dir / name, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


class OnnxGraph:
    """Callable: tokenised batch (PyTorch tensors) -> one logits array (numpy fp32) per head."""

    def __init__(self, path: Path, threads: int | None, input_names: tuple[str, ...]):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = int(threads or 0)
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # no busy-waiting between passes: on two cores it would take CPU from the event loop and the engine
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        self.input_names = input_names

    def __call__(self, enc) -> list[np.ndarray]:
        return self.session.run(None, {k: enc[k].numpy() for k in self.input_names})

    @classmethod
    def export_for(cls, base, heads: tuple, threads: int | None) -> "OnnxGraph":
        """The graph of `base`'s encoder and `heads`, exporting and checking it first when the
        file is missing or was made from other weights."""
        try:
            import onnxruntime  # noqa: F401
        except ImportError as e:
            raise OnnxUnavailable("onnxruntime is not installed (scripts/setup.sh installs it)") from e
        if base.runtime != "torch":
            raise OnnxUnavailable("export needs the PyTorch fp32 model")
        names = tuple(k for k in _INPUTS if k in base.encode(["x"]))
        path = base.dir / f"onnx-{'+'.join(h.meta.kind for h in heads)}.onnx"
        stamp = path.with_suffix(".json")
        fingerprint = hashlib.sha256("".join(weights_fingerprint(c.dir) for c in (base, *heads)).encode()).hexdigest()
        try:
            fresh = path.exists() and json.loads(stamp.read_text(encoding="utf-8"))["weights_sha256"] == fingerprint
        except (OSError, ValueError, KeyError):
            fresh = False
        if not fresh:
            diff = _export(base, heads, path, names, threads)
            tmp = stamp.with_suffix(".tmp")
            tmp.write_text(json.dumps({"weights_sha256": fingerprint, "max_abs_logit_diff": diff}), encoding="utf-8")
            os.replace(tmp, stamp)
        return cls(path, threads, names)


def _export(base, heads: tuple, path: Path, names: tuple[str, ...], threads: int | None) -> float:
    """Write the fused graph to `path` (atomically); return its largest logit difference from PyTorch."""
    import torch
    from onnxruntime.transformers.optimizer import optimize_model

    class Graph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = base.model.base_model
            self.heads = torch.nn.ModuleList(m for h in heads for m in h.head_modules())  # so their weights are exported

        def forward(self, *args):
            inputs = dict(zip(names, args))
            hidden = self.encoder(**inputs).last_hidden_state
            return tuple(h.head_logits(hidden, inputs["attention_mask"]) for h in heads)

    outputs = [f"logits_{i}" for i in range(len(heads))]
    example = base.encode(_PROBES[1])
    raw, tmp = path.with_suffix(".raw.tmp"), path.with_suffix(".tmp")
    try:
        _trace(Graph(), base, tuple(example[k] for k in names), raw, names, outputs)
        cfg = base.model.config
        optimize_model(str(raw), model_type="bert", num_heads=cfg.num_attention_heads, hidden_size=cfg.hidden_size).save_model_to_file(str(tmp))
        graph = OnnxGraph(tmp, threads, names)
        diff = 0.0
        with torch.inference_mode():
            for texts in _PROBES:
                enc = base.encode(texts)
                hidden = base.hidden(enc)
                for got, head in zip(graph(enc), heads):
                    diff = max(diff, float(np.abs(got - head.head_logits(hidden, enc["attention_mask"]).numpy()).max()))
        if not diff <= TOLERANCE:
            raise OnnxUnavailable(f"the ONNX export differs from PyTorch by {diff:.3g} (> {TOLERANCE})")
        os.replace(tmp, path)
    finally:
        raw.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return diff


def _trace(graph, base, args: tuple, out: Path, names: tuple[str, ...], outputs: list[str]) -> None:
    """Export `graph` with plain (eager) attention, the pattern ONNX Runtime fuses into its
    Attention op; `base` keeps its own attention implementation afterwards."""
    import torch

    attn = base.model.config._attn_implementation
    base.model.set_attn_implementation("eager")
    try:
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")  # the tracer's warnings are about the shapes made dynamic here
            torch.onnx.export(graph.eval(), args, str(out), input_names=list(names), output_names=outputs, opset_version=17,
                              dynamo=False, dynamic_axes={**{k: {0: "batch", 1: "tokens"} for k in names}, **{o: {0: "batch"} for o in outputs}})
    finally:
        base.model.set_attn_implementation(attn)
