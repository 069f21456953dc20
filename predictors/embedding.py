"""The urgency model's pooled sentence vector as one more "head" on its encoder pass.

`PooledHead(urgency)` has the interface `Classifier.set_runtime(also=...)` and the ONNX
export expect of a head (`dir`, `meta.kind`, `meta.labels`, `head_modules`, `head_logits`),
so the vector comes out of the same encoder pass (and the same ONNX graph) as both
predictions: BERT/MiniLM's pooler (tanh(W h_CLS + b)), or DistilBERT's pre-classifier + ReLU
on the first token. It is the input the urgency classifier's own output layer reads, so a
linear site adapter on it can represent the general model and move from there.
"""
from __future__ import annotations

from types import SimpleNamespace


class PooledHead:
    def __init__(self, base) -> None:
        self.base = base
        self.dir = base.dir
        self.model = base.model
        size = base.model.config.hidden_size if not hasattr(base.model, "pre_classifier") else base.model.pre_classifier.out_features
        self.meta = SimpleNamespace(kind="pooled", labels=list(range(size)), temperature=1.0)

    @property
    def size(self) -> int:
        return len(self.meta.labels)

    def head_modules(self) -> list:
        m = self.base.model
        return [m.pre_classifier] if hasattr(m, "pre_classifier") else [m.base_model.pooler]

    def head_logits(self, hidden):
        import torch

        m = self.base.model
        hidden = hidden.to(m.classifier.weight.dtype)
        if hasattr(m, "pre_classifier"):
            return torch.relu(m.pre_classifier(hidden[:, 0]))
        return m.base_model.pooler(hidden)
