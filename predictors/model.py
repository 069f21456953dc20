"""A trained sequence classifier on disk: Hugging Face model + tokenizer + `triage_meta.json`.

`Classifier` loads one (urgency or length), tokenises safely (any string, including empty,
very long, non-ASCII and emoji text) and returns temperature-calibrated probabilities.
torch and transformers are imported here, so import this module lazily from CLI code.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from triage.paths import state_dir

log = logging.getLogger(__name__)

META_FILE = "triage_meta.json"
MAX_CHARS = 4000  # text beyond this cannot reach max_length tokens anyway; cut before tokenising
DEFAULT_LENGTH_EDGES = "q3"  # 3 buckets of equal mass at the training labels' terciles (train.parse_edges)


def predictors_dir() -> Path:
    return state_dir() / "predictors"


def default_model_dir(kind: str) -> Path:
    if kind not in ("urgency", "length"):
        raise ValueError(f"unknown predictor kind {kind!r}")
    return predictors_dir() / kind


class ModelMissing(FileNotFoundError):
    pass


@dataclass
class ClassifierMeta:
    kind: str  # "urgency" or "length"
    labels: list[int]  # class index -> ESI level (urgency) or bucket index (length)
    encoder: str
    max_length: int = 128
    temperature: float = 1.0
    escalate_below: float | None = None  # urgency: raise the level when P(level 1-2) >= this
    bucket_edges: list[int] = field(default_factory=list)  # length: token edges between buckets
    bucket_tokens: list[int] = field(default_factory=list)  # length: median tokens per bucket (the estimate)
    far_cost: float = 1.0  # length: the cost of a bucket two or more away, against 1 for an adjacent one (`ordinal_bucket`)
    train_info: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)

    def save(self, model_dir: Path) -> None:
        (Path(model_dir) / META_FILE).write_text(json.dumps(asdict(self), indent=2, sort_keys=True), encoding="utf-8")

    @classmethod
    def load(cls, model_dir: Path) -> "ClassifierMeta":
        return cls(**json.loads((Path(model_dir) / META_FILE).read_text(encoding="utf-8")))


def bucket_of(tokens: int, edges) -> int:
    """Index of the bucket holding `tokens` (edges are the lower bounds of buckets 1..n)."""
    return int(np.searchsorted(np.asarray(edges), tokens, side="right"))


def ordinal_bucket(probs: np.ndarray, far_cost: float = 1.0) -> np.ndarray:
    """The bucket(s) of least expected cost under `probs` (rows: texts, columns: buckets
    shortest first), where a wrong bucket costs 1 when adjacent to the true one and
    `far_cost` when farther. `far_cost` 1 is the argmax (every error alike); above 1 the
    decision leans towards the middle when the head is unsure between the extremes."""
    p = np.atleast_2d(np.asarray(probs, dtype=float))
    k = p.shape[-1]
    d = np.abs(np.subtract.outer(np.arange(k), np.arange(k)))
    cost = np.where(d == 0, 0.0, np.where(d == 1, 1.0, float(far_cost)))
    return (p @ cost).argmin(axis=-1)


def clean_text(text: str) -> str:
    """Make any input safe for the tokenizer: str, no NULs, bounded length."""
    if text is None:
        return ""
    if not isinstance(text, str):
        text = str(text)
    return text.replace("\x00", " ")[:MAX_CHARS]


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = logits / max(float(temperature), 1e-6)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


RUNTIMES = ("auto", "onnx-int8", "onnx", "torch", "torch-bf16")


def native_bf16() -> bool:
    """The CPU has bf16 dot-product instructions (AVX512-BF16 or AMX), read from /proc/cpuinfo."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def _check_runtime(runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")


def torch_runtime() -> str:
    """PyTorch's faster choice here: bf16 where the CPU computes it natively (about 60 % of the
    fp32 time, logits within ~0.05 of fp32), else fp32. (int8 dynamic quantisation was as fast
    but changed about one prediction in ten; see docs/predictors.md.)"""
    return "torch-bf16" if native_bf16() else "torch"


def set_threads(threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(int(threads))


class Heads:
    """Probabilities from the subclass's `all_logits(texts, batch_size)` (one logits array
    per head of `self.heads`, this classifier's first): shared by `Classifier` and
    `graph_classifier.GraphClassifier`."""

    heads: tuple
    meta: ClassifierMeta

    def logits(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        return self.all_logits(texts, batch_size)[0]

    def all_probs(self, texts: list[str], batch_size: int = 64) -> list[np.ndarray]:
        """Calibrated probabilities of every head in `self.heads`, each with its own temperature."""
        return [softmax(lg, h.meta.temperature) for lg, h in zip(self.all_logits(texts, batch_size), self.heads)]

    def probs(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Calibrated class probabilities, shape (len(texts), n_classes)."""
        return softmax(self.logits(texts, batch_size), self.meta.temperature)


class Classifier(Heads):
    """A loaded classifier. Not thread-safe: use it from one thread (the service's worker)."""

    def __init__(self, model_dir: str | os.PathLike, threads: int | None = None, runtime: str = "torch"):
        model_dir = Path(model_dir)
        if not (model_dir / META_FILE).exists():
            raise ModelMissing(f"no trained predictor at {model_dir}: run `triage train all`")
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        set_threads(threads)
        self.dir = model_dir
        self.threads = threads
        self.meta = ClassifierMeta.load(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
        self.runtime = "torch"
        self.heads: tuple[Classifier, ...] = (self,)
        self._onnx = None
        if runtime != "torch":
            self.set_runtime(runtime)

    def set_runtime(self, runtime: str, also: tuple["Classifier", ...] = ()) -> None:
        """Where the forward pass runs, chosen once after loading (the model loads as PyTorch
        fp32): "onnx-int8" (ONNX Runtime, int8 weights, one text per pass; the urgency
        model's graph only, and only where it is no worse than fp32 on the validation split,
        see predictors.onnx_graph), "onnx" (ONNX Runtime, fp32), "torch" (fp32), "torch-bf16"
        (weights and activations in bf16), or "auto": the first of onnx-int8, onnx and
        `torch_runtime()` that is available and passes its check (a fallback is logged).
        `also`: classifiers whose heads run on this one's encoder pass (`shares_encoder`);
        `all_logits` then returns their logits after this one's."""
        from predictors.onnx_graph import OnnxGraph, OnnxUnavailable

        _check_runtime(runtime)
        if self.runtime != "torch" or self._onnx is not None:
            raise ValueError(f"runtime already set to {self.runtime}")
        self.heads = (self, *also)
        if runtime in ("auto", "onnx", "onnx-int8"):
            try:
                graph, kind = OnnxGraph.export_for(self, self.heads, self.threads), "onnx"
                if runtime != "onnx":
                    try:
                        graph, kind = OnnxGraph.quantized_for(self, self.heads, graph, self.threads), "onnx-int8"
                    except OnnxUnavailable as e:
                        if runtime == "onnx-int8":
                            raise
                        log.warning("int8 ONNX graph not used for the %s predictor (fp32 instead): %s",
                                    self.meta.kind, e)
                self._onnx, self.runtime = graph, kind
                return
            except OnnxUnavailable as e:
                if runtime != "auto":
                    raise
                log.warning("ONNX Runtime not used for the %s predictor: %s", self.meta.kind, e)
                runtime = torch_runtime()
        if runtime == "torch-bf16":
            import torch

            self.model = self.model.to(torch.bfloat16)
        self.runtime = runtime

    def encode(self, texts: list[str]):
        return self.tokenizer([clean_text(t) for t in texts], padding=True, truncation=True,
                              max_length=self.meta.max_length, return_tensors="pt")

    def hidden(self, enc):
        """The PyTorch encoder's last hidden states for a tokenised batch (no classification head)."""
        return self.model.base_model(**enc).last_hidden_state

    def head_logits(self, hidden, mask=None):
        """This classifier's head on encoder hidden states: BERT/MiniLM pooler + classifier,
        or DistilBERT's pre_classifier + ReLU + classifier on the first token (dropout is
        off in eval mode). Equal to the model's own forward when `hidden` is its encoder's.
        `mask` (the batch's attention mask) is for heads that pool over tokens; this one
        reads the first token only."""
        import torch

        m = self.model
        hidden = hidden.to(m.classifier.weight.dtype)  # e.g. a bf16 encoder pass into an fp32 head
        if hasattr(m, "pre_classifier"):
            return m.classifier(torch.relu(m.pre_classifier(hidden[:, 0])))
        return m.classifier(m.base_model.pooler(hidden))

    def head_modules(self) -> list:
        """The modules `head_logits` runs."""
        m = self.model
        if hasattr(m, "pre_classifier"):
            return [m.pre_classifier, m.classifier]
        return [m.base_model.pooler, m.classifier]

    def all_logits(self, texts: list[str], batch_size: int = 64) -> list[np.ndarray]:
        """Logits of every head in `self.heads` (this classifier's first) from one encoder pass per batch."""
        import torch

        out: list[list[np.ndarray]] = [[] for _ in self.heads]
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                enc = self.encode(texts[i : i + batch_size])
                if self._onnx is not None:
                    logits = self._onnx(enc)
                else:
                    hidden = self.hidden(enc)
                    logits = [h.head_logits(hidden, enc["attention_mask"]).float().numpy() for h in self.heads]
                for acc, lg in zip(out, logits):
                    acc.append(lg)
        return [np.concatenate(acc) if acc else np.zeros((0, len(h.meta.labels)), dtype=np.float32)
                for acc, h in zip(out, self.heads)]


def _encoder_state(model) -> dict:
    """The encoder's weights without a BERT pooler (the pooler belongs to the head)."""
    return {k: v for k, v in model.base_model.state_dict().items() if not k.startswith("pooler.")}


def shares_encoder(a: Classifier, b: Classifier) -> bool:
    """True when `b` can be run as a head on `a`'s encoder pass: same tokenizer settings,
    identical encoder weights, and `b`'s head on `a`'s hidden states gives `b`'s own logits.
    Call before `set_runtime` (the check compares fp32 weights)."""
    import torch

    if a.runtime != "torch" or b.runtime != "torch":
        raise ValueError("shares_encoder compares PyTorch fp32 weights: call it before set_runtime()")
    if a.meta.max_length != b.meta.max_length or a.tokenizer.get_vocab() != b.tokenizer.get_vocab():
        return False
    if not hasattr(b.model, "pre_classifier") and getattr(b.model.base_model, "pooler", None) is None:
        return False
    sa, sb = _encoder_state(a.model), _encoder_state(b.model)
    if sa.keys() != sb.keys() or not all(torch.equal(sa[k], sb[k]) for k in sa):
        return False
    with torch.inference_mode():
        enc = a.encode(["chest pain, HR 120", "a cough for two weeks, no fever"])
        return bool(torch.allclose(b.head_logits(a.hidden(enc)), b.model(**enc).logits, atol=1e-4))
