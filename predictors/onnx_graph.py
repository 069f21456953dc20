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

`OnnxGraph.quantized_for(base, heads, fp32)` (runtime "onnx-int8", the service's default
where it passes its check): the same graph with int8 weights (ONNX Runtime's dynamic
quantisation, per output channel), about 2.3x less CPU per text on the 2-core VM
(docs/predictors.md). Its activations are quantised per pass, so a text's logits would
depend on the texts batched with it: the int8 graph therefore runs one text per pass
(which is also the cheapest per text here: no padding). It is made for the urgency
model's graph only, and used only when it is no worse than fp32 on the corpus's
validation split (see `INT8_ACCURACY_SLACK`). The recipes of `INT8_RECIPES` are tried in
order, cheapest first, and the first that passes is kept: a model retrained on another
machine lost 7 of 547 validation texts with the plain recipe, while 7-bit weights
(`reduce_range`, which avoids the 16-bit saturation of AVX2's u8 x s8 products on CPUs
without VNNI) on the MatMuls alone passed. The stamp file keeps the recipe, both graphs'
figures, each head's agreement with fp32 and every recipe tried; when none passes, the
stamp records that for these weights, so the check is not run again at every start.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np

TOLERANCE = 1e-3  # largest |logit difference| accepted between the export and PyTorch
# the int8 urgency graph is used when, on the corpus's validation split, it is no worse than
# fp32: accuracy at most INT8_ACCURACY_SLACK lower, no more under-triage (ESI 1-2 put at 3-5),
# and the same level for at least INT8_AGREEMENT of the texts
INT8_ACCURACY_SLACK = 0.01   # about two standard errors of a paired accuracy difference on ~550 texts
INT8_AGREEMENT = 0.97
# ONNX Runtime quantize_dynamic options, cheapest per text first (CPU ms a text, 2-core AMD
# EPYC without VNNI: 7.4, 8.8, 9.2 against fp32's 14.7; docs/predictors.md)
INT8_RECIPES = (
    ("per-channel", {"per_channel": True}),
    ("per-channel, 7-bit, MatMul only", {"per_channel": True, "reduce_range": True, "op_types_to_quantize": ["MatMul"]}),
    ("per-channel, 7-bit", {"per_channel": True, "reduce_range": True}),
)
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_PROBES = (
    ["chest pain, HR 120"],
    ["", "abd pain, SBP 85, 72 yo, vomiting since this morning and now confused"],
    ["Mi madre no respira bien 😟 ambulancia por favor", "dolor de pecho", "x " * 5000],
)


class OnnxUnavailable(RuntimeError):
    pass


class _Int8Refused(OnnxUnavailable):
    """Every recipe of INT8_RECIPES failed the check (stamped for these weights)."""


def graph_path(base_dir: Path, kinds: list[str]) -> Path:
    """Where the fp32 graph of these heads (by `meta.kind`, in output order) on `base_dir`'s encoder lives."""
    return Path(base_dir) / f"onnx-{'+'.join(kinds)}.onnx"


def int8_path(fp32: Path) -> Path:
    """Where the int8 graph made from the fp32 graph at `fp32` lives."""
    return fp32.with_name(fp32.stem + "-int8.onnx")


def graph_fingerprint(dirs: list[Path]) -> str:
    """The fingerprint a graph's stamp carries: the weights of its base and of each head, in order."""
    once = {d: weights_fingerprint(d) for d in dict.fromkeys(Path(d) for d in dirs)}   # each file hashed once
    return hashlib.sha256("".join(once[Path(d)] for d in dirs).encode()).hexdigest()


def int8_refusal(fingerprint: str) -> dict:
    """The stamp fields that mark an int8 graph as refused for these weights by these recipes."""
    return {"weights_sha256": fingerprint, "recipes": [name for name, _ in INT8_RECIPES]}


def int8_refused(path: Path, fingerprint: str) -> bool:
    """The int8 graph at `path` was refused for these weights (not made: the stamp says so)."""
    earlier = stamp(path)
    return not path.exists() and "rejected" in earlier and all(earlier.get(k) == v for k, v in int8_refusal(fingerprint).items())


def weights_fingerprint(model_dir: Path) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(model_dir)):
        if name.endswith((".safetensors", ".bin")):
            with open(model_dir / name, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


class OnnxGraph:
    """Callable: tokenised batch (PyTorch tensors or numpy arrays) -> one logits array (numpy fp32) per head."""

    def __init__(self, path: Path, threads: int | None, input_names: tuple[str, ...] | None = None,
                 one_text_per_pass: bool = False):
        """`input_names`: the tokenizer outputs the graph reads (None: as the graph declares them)."""
        self.path = path
        self.threads = threads
        self.one_text_per_pass = one_text_per_pass
        self._input_names = input_names

    @property
    def input_names(self) -> tuple[str, ...]:
        if self._input_names is None:
            self._input_names = tuple(i.name for i in self.session.get_inputs())
        return self._input_names

    @functools.cached_property
    def session(self):
        """Loaded on the first pass: the fp32 graph behind a fresh int8 one is never loaded."""
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = int(self.threads or 0)
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # no busy-waiting between passes: on two cores it would take CPU from the event loop and the engine
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(self.path), so, providers=["CPUExecutionProvider"])

    def __call__(self, enc) -> list[np.ndarray]:
        """`enc`: the tokenised batch, PyTorch tensors or numpy arrays."""
        feeds = {k: np.asarray(enc[k]) for k in self.input_names}
        if not self.one_text_per_pass or len(feeds["input_ids"]) <= 1:
            return self.session.run(None, feeds)
        per_text = []
        for i, n in enumerate(feeds["attention_mask"].sum(axis=1).tolist()):   # each text unpadded
            per_text.append(self.session.run(None, {k: v[i:i + 1, :max(1, int(n))] for k, v in feeds.items()}))
        return [np.concatenate(out) for out in zip(*per_text)]

    @classmethod
    def quantized_for(cls, base, heads: tuple, fp32: "OnnxGraph", threads: int | None) -> "OnnxGraph":
        """`fp32` with int8 weights (see the module docstring), quantised and checked once
        per weights; OnnxUnavailable when it fails its check or cannot be made."""
        path = int8_path(fp32.path)
        fingerprint = stamp(fp32.path).get("weights_sha256")
        if fingerprint is None:
            raise OnnxUnavailable(f"the fp32 graph's stamp ({fp32.path.with_suffix('.json')}) is unreadable")
        if int8_refused(path, fingerprint):
            raise OnnxUnavailable(stamp(path)["rejected"])   # these weights failed these recipes already
        try:
            _made_once(path, fingerprint, lambda: {"agreement_with_fp32": _quantize(base, heads, fp32, path, threads)})
        except _Int8Refused as e:
            _write_stamp(path, {**int8_refusal(fingerprint), "rejected": str(e)})
            raise
        return cls(path, threads, fp32.input_names, one_text_per_pass=True)

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
        path = graph_path(base.dir, [h.meta.kind for h in heads])
        fingerprint = graph_fingerprint([c.dir for c in (base, *heads)])
        _made_once(path, fingerprint, lambda: {"max_abs_logit_diff": _export(base, heads, path, names, threads)})
        return cls(path, threads, names)


def stamp(path: Path) -> dict:
    """The JSON beside a graph file (its weights' fingerprint and check figures), {} if unreadable."""
    try:
        out = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def _made_once(path: Path, fingerprint: str, make) -> None:
    """Run `make` (which writes `path` and returns its check figures) unless `path` exists and
    its stamp names these weights; then stamp it (atomically)."""
    if path.exists() and stamp(path).get("weights_sha256") == fingerprint:
        return
    _write_stamp(path, {"weights_sha256": fingerprint, **make()})


def _write_stamp(path: Path, figures: dict) -> None:
    dest = path.with_suffix(".json")
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(figures), encoding="utf-8")
    os.replace(tmp, dest)


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


def _quantize(base, heads: tuple, fp32: OnnxGraph, path: Path, threads: int | None) -> dict:
    """Write the int8 graph of `fp32` to `path` (atomically) with the first recipe of
    `INT8_RECIPES` that is no worse than fp32 on the validation split (`INT8_ACCURACY_SLACK`);
    return its name, per head the share of texts whose class it keeps (classifier heads) or
    the mean cosine of its vector with fp32's (the pooled vector the site adapters read), the
    urgency accuracy and under-triage of both graphs, and every recipe tried; _Int8Refused
    when none passes."""
    if heads[0].meta.kind != "urgency":
        raise OnnxUnavailable("an int8 graph is checked against urgency labels: made for the urgency model only")
    try:
        from predictors.corpus import load_corpus

        rows = load_corpus("validation")
    except (OSError, ValueError) as e:
        raise OnnxUnavailable(f"no validation texts to check an int8 graph against ({e})") from None
    texts = [r["text"] for r in rows]
    gold = np.array([int(r["level"]) for r in rows])
    encs = [base.encode(texts[i:i + 32]) for i in range(0, len(texts), 32)]
    ref = [fp32(enc) for enc in encs]
    tmp = path.with_suffix(".tmp")
    tried = []
    try:
        for name, options in INT8_RECIPES:
            out = _check_recipe(options, fp32, tmp, threads, encs, ref, heads, gold)
            tried.append({"recipe": name, "accuracy": out["int8"]["accuracy"],
                          "under_triage": out["int8"]["under_triage"], "agreement": out["urgency"]["class_agreement"]})
            if (out["int8"]["accuracy"] >= out["fp32"]["accuracy"] - INT8_ACCURACY_SLACK
                    and out["int8"]["under_triage"] <= out["fp32"]["under_triage"]
                    and out["urgency"]["class_agreement"] >= INT8_AGREEMENT):
                os.replace(tmp, path)
                return {"recipe": name, "texts": len(texts), **out, "tried": tried}
    finally:
        tmp.unlink(missing_ok=True)
    raise _Int8Refused(f"the int8 graph is worse than fp32 on the validation split with every recipe "
                       f"(fp32: {out['fp32']}; tried: {tried})")


def _check_recipe(options: dict, fp32: OnnxGraph, tmp: Path, threads: int | None, encs: list, ref: list,
                  heads: tuple, gold: np.ndarray) -> dict:
    """Quantise `fp32` to `tmp` with `options`; its heads' agreement with fp32 (`ref`, fp32's
    outputs on the batches `encs`) and both graphs' urgency accuracy and under-triage."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()   # the quantiser advises "pre-processing" on the root logger
    level = root.level
    try:
        root.setLevel(logging.ERROR)
        # the fused graph's com.microsoft ops hide some tensors' types from shape inference: they are float
        quantize_dynamic(str(fp32.path), str(tmp), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": 1}, **options)
    finally:
        root.setLevel(level)
    int8 = OnnxGraph(tmp, threads, fp32.input_names, one_text_per_pass=True)
    got = [int8(enc) for enc in encs]
    labels = np.array(heads[0].meta.labels)
    out = {}
    for h, head in enumerate(heads):   # each head's outputs over all texts, fp32 and int8
        a, b = (np.concatenate([batch[h] for batch in outs]) for outs in (ref, got))
        if head.meta.kind in ("urgency", "length"):
            out[head.meta.kind] = {"class_agreement": round(float((a.argmax(1) == b.argmax(1)).mean()), 4)}
        else:
            cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
            out[head.meta.kind] = {"cosine_mean": round(float(cos.mean()), 4)}
        if h == 0:   # the urgency head against the gold levels
            for name, logits in (("fp32", a), ("int8", b)):
                lv = labels[logits.argmax(1)]
                out[name] = {"accuracy": round(float((lv == gold).mean()), 4),
                             "under_triage": int(((gold <= 2) & (lv >= 3)).sum())}
    return out


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
