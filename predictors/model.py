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


def set_threads(threads: int | None) -> None:
    import torch

    if threads:
        torch.set_num_threads(int(threads))


class Classifier:
    """A loaded classifier. Not thread-safe: use it from one thread (the service's worker)."""

    def __init__(self, model_dir: str | os.PathLike, threads: int | None = None, quantize: bool = False):
        model_dir = Path(model_dir)
        if not (model_dir / META_FILE).exists():
            raise ModelMissing(f"no trained predictor at {model_dir}: run `triage train all`")
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        set_threads(threads)
        self.dir = model_dir
        self.meta = ClassifierMeta.load(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
        if quantize:
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        self.model = model

    def encode(self, texts: list[str]):
        return self.tokenizer([clean_text(t) for t in texts], padding=True, truncation=True,
                              max_length=self.meta.max_length, return_tensors="pt")

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
