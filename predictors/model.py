"""A trained sequence classifier on disk: Hugging Face model + tokenizer + `triage_meta.json`.

`Classifier` loads one (urgency or length), tokenises safely (any string, including empty,
very long, non-ASCII and emoji text) and returns temperature-calibrated probabilities.
torch and transformers are imported here, so import this module lazily from CLI code.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from triage.paths import state_dir

META_FILE = "triage_meta.json"
MAX_CHARS = 4000  # text beyond this cannot reach max_length tokens anyway; cut before tokenising
DEFAULT_LENGTH_EDGES = (64, 128, 256, 512)  # 5 buckets: <64, 64-127, 128-255, 256-511, >=512 (the generation cap)


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


PRECISIONS = ("auto", "fp32", "bf16")


def native_bf16() -> bool:
    """The CPU has bf16 dot-product instructions (AVX512-BF16 or AMX), read from /proc/cpuinfo."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


def resolve_precision(precision: str) -> str:
    """"auto" is bf16 where the CPU computes it natively (about 60 % of the fp32 time, logits
    within ~0.05 of fp32), else fp32. (int8 dynamic quantisation was as fast but changed
    about one prediction in ten; see docs/predictors.md.)"""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return "bf16" if native_bf16() else "fp32"
    return precision


def set_threads(threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(int(threads))


class Classifier:
    """A loaded classifier. Not thread-safe: use it from one thread (the service's worker)."""

    def __init__(self, model_dir: str | os.PathLike, threads: int | None = None, precision: str = "fp32"):
        model_dir = Path(model_dir)
        if not (model_dir / META_FILE).exists():
            raise ModelMissing(f"no trained predictor at {model_dir}: run `triage train all`")
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        set_threads(threads)
        self.dir = model_dir
        self.meta = ClassifierMeta.load(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
        self.precision = "fp32"
        self.set_precision(precision)

    def set_precision(self, precision: str) -> None:
        """Convert the loaded fp32 model once to "bf16" (weights and activations); see
        `resolve_precision` for "auto"."""
        import torch

        precision = resolve_precision(precision)
        if precision == self.precision:
            return
        if self.precision != "fp32":
            raise ValueError(f"model already converted to {self.precision}")
        self.model = self.model.to(torch.bfloat16)
        self.precision = precision

    def encode(self, texts: list[str]):
        return self.tokenizer([clean_text(t) for t in texts], padding=True, truncation=True,
                              max_length=self.meta.max_length, return_tensors="pt")

    def hidden(self, enc):
        """The encoder's last hidden states for a tokenised batch (no classification head)."""
        return self.model.base_model(**enc).last_hidden_state

    def head_logits(self, hidden):
        """This classifier's head on encoder hidden states: BERT/MiniLM pooler + classifier,
        or DistilBERT's pre_classifier + ReLU + classifier on the first token (dropout is
        off in eval mode). Equal to the model's own forward when `hidden` is its encoder's."""
        import torch

        m = self.model
        if hasattr(m, "pre_classifier"):
            return m.classifier(torch.relu(m.pre_classifier(hidden[:, 0])))
        return m.classifier(m.base_model.pooler(hidden))

    def logits(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        import torch

        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                enc = self.encode(texts[i : i + batch_size])
                out.append(self.model(**enc).logits.float().numpy())
        if not out:
            return np.zeros((0, len(self.meta.labels)), dtype=np.float32)
        return np.concatenate(out)

    def probs(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Calibrated class probabilities, shape (len(texts), n_classes)."""
        return softmax(self.logits(texts, batch_size), self.meta.temperature)


def _encoder_state(model) -> dict:
    """The encoder's weights without a BERT pooler (the pooler belongs to the head)."""
    return {k: v for k, v in model.base_model.state_dict().items() if not k.startswith("pooler.")}


def shares_encoder(a: Classifier, b: Classifier) -> bool:
    """True when `b` can be run as a head on `a`'s encoder pass: same tokenizer settings,
    identical encoder weights, and `b`'s head on `a`'s hidden states gives `b`'s own logits.
    Call before `set_precision` (the check compares fp32 weights)."""
    import torch

    if a.precision != "fp32" or b.precision != "fp32":
        raise ValueError("shares_encoder compares fp32 weights: call it before set_precision()")
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


def shared_probs(a: Classifier, b: Classifier, texts: list[str], batch_size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Both classifiers' calibrated probabilities from one encoder pass (see `shares_encoder`)."""
    import torch

    la, lb = [], []
    with torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            h = a.hidden(a.encode(texts[i : i + batch_size]))
            la.append(a.head_logits(h).float().numpy())
            lb.append(b.head_logits(h).float().numpy())
    if not la:
        return np.zeros((0, len(a.meta.labels))), np.zeros((0, len(b.meta.labels)))
    return softmax(np.concatenate(la), a.meta.temperature), softmax(np.concatenate(lb), b.meta.temperature)
