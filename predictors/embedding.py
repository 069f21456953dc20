"""The urgency model's pooled sentence vector as one more "head" on its encoder pass.

`PooledHead(urgency)` has the interface `Classifier.set_runtime(also=...)` and the ONNX
export expect of a head (`dir`, `meta.kind`, `meta.labels`, `head_modules`, `head_logits`),
so the vector comes out of the same encoder pass (and the same ONNX graph) as both
predictions. It has two halves:
* the first token's vector as the classifier reads it: BERT/MiniLM's pooler
  (tanh(W h_CLS + b)), or DistilBERT's pre-classifier + ReLU. It is the input the urgency
  classifier's own output layer reads, so a linear site adapter on it can represent the
  general model and move from there;
* the mean of the last hidden states over the text's tokens (padding excluded), the way
  the encoder was pre-trained to embed a sentence (all-MiniLM-L6-v2 is a mean-pooling
  sentence encoder). Fine-tuning for urgency made the first half about ESI urgency; the
  mean keeps more of what the text is about (which complaint, which body site), what a
  site's own protocol grades by. On KTAS's k-fold site evaluation it raised the adapted
  accuracy from 0.601 to 0.627 at the same under-triage budget (docs/predictors.md, "Site
  adaptation"), at no extra encoder cost.
"""
from __future__ import annotations

from types import SimpleNamespace

KIND = "pooledmean"   # the meta kind: names the ONNX graph file, so a graph of an older vector is not reused


class PooledHead:
    def __init__(self, base) -> None:
        self.base = base
        self.dir = base.dir
        self.model = base.model
        size = base.model.config.hidden_size if not hasattr(base.model, "pre_classifier") else base.model.pre_classifier.out_features
        # [first-token vector | token mean], 2 x the encoder's width
        self.meta = SimpleNamespace(kind=KIND, labels=list(range(2 * size)), temperature=1.0)

    @property
    def size(self) -> int:
        return len(self.meta.labels)

    def head_modules(self) -> list:
        m = self.base.model
        return [m.pre_classifier] if hasattr(m, "pre_classifier") else [m.base_model.pooler]

    def head_logits(self, hidden, mask):
        import torch

        m = self.base.model
        hidden = hidden.to(m.classifier.weight.dtype)
        first = torch.relu(m.pre_classifier(hidden[:, 0])) if hasattr(m, "pre_classifier") else m.base_model.pooler(hidden)
        w = mask.unsqueeze(-1).to(hidden.dtype)
        mean = (hidden * w).sum(dim=1) / w.sum(dim=1).clamp(min=1.0)
        return torch.cat([first, mean], dim=1)
