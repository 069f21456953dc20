"""Fine-tune the urgency and length-bucket classifiers on the project's corpus.

Seeded and deterministic on CPU. Validation split: temperature scaling and (urgency) the
`escalate_below` threshold. Test split: reported only. KTAS and Semigran are never read here.
"""
from __future__ import annotations

import hashlib
import math
import random
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from predictors.calibration import expected_calibration_error, fit_temperature
from predictors.corpus import corpus_path, length_labels_meta, length_labels_path, load_corpus, load_length_label_rows, load_length_labels
from predictors.encoder import resolve_encoder
from predictors.metrics import bucket_report, urgency_report
from predictors.model import (DEFAULT_LENGTH_EDGES, META_FILE, ClassifierMeta, ModelMissing, bucket_of, default_model_dir,
                             ordinal_bucket, softmax)
from predictors.urgency import choose_escalate_below, decide_many

# progress(phase, done, total): the CLI draws bars from it; phase in {"epoch <i>", "calibrate"}
ProgressFn = Callable[[str, int, int], None]


RECIPE = 4  # bump when the default training changes, so `train all --if-missing` retrains older models (3: corpus revision 4, length labels at T=0.2; 4: corpus revision 5, SpO2 < 90 level-1 rows and awake level-1 patients)


@dataclass
class TrainConfig:
    epochs: int = 8  # chosen on validation (docs/predictors.md): 3 epochs left 2 vs 3 confused
    lr: float = 1e-4
    batch_size: int = 32
    max_length: int = 128
    weight_decay: float = 0.01
    warmup: float = 0.1
    seed: int = 0
    threads: int = 2
    limit: int = 0  # use only the first N training rows (tests); 0 = all
    freeze_embeddings: bool = True  # the word-embedding table is half of MiniLM's weights; freezing it halves optimizer work
    train_layers: int | None = 3  # fine-tune only the top N transformer layers (+ pooler, head); None = all; 0 = head only

    @classmethod
    def length_head(cls, **kw) -> "TrainConfig":
        """Defaults for the length head (only pooler + classifier train, on cached encoder
        states, so many epochs cost seconds)."""
        return cls(**{"epochs": 20, "lr": 1e-3, **kw})


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _fine_tune(texts: list[str], labels: list[int], n_classes: int, encoder: Path, cfg: TrainConfig,
               progress: ProgressFn | None, new_head: bool = False, val: tuple[list[str], list[int]] | None = None):
    """Fine-tune; returns (tokenizer, model in eval mode, info dict).

    `new_head`: `encoder` is another classifier whose encoder is kept; the new output layer
    starts at the training prior (zero weights, bias = log class frequency), so it predicts
    the prior until training finds signal. `val`: keep the epoch (0 = that start) with the
    lowest validation loss (on the cached-states path only)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(cfg.threads)
    _seed_all(cfg.seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized classifier weights" is expected here
    try:
        tok = AutoTokenizer.from_pretrained(encoder)
        model = AutoModelForSequenceClassification.from_pretrained(encoder, num_labels=n_classes, ignore_mismatched_sizes=new_head)
    finally:
        hf_logging.set_verbosity(verbosity)
    if new_head:  # `encoder` is another classifier: keep its encoder (and pooler) but not its output layer
        freq = np.bincount(labels, minlength=n_classes) + 1.0
        with torch.no_grad():
            model.classifier.weight.zero_()
            model.classifier.bias.copy_(torch.tensor(np.log(freq / freq.sum()), dtype=model.classifier.bias.dtype))
    model.train()
    if cfg.freeze_embeddings:
        for p in model.base_model.embeddings.parameters():
            p.requires_grad_(False)
    if cfg.train_layers is not None:
        layers = _encoder_layers(model)
        for layer in layers[: max(0, len(layers) - cfg.train_layers)]:
            for p in layer.parameters():
                p.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(texts) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    sched = get_linear_schedule_with_warmup(opt, int(cfg.warmup * total), total)
    gen = np.random.default_rng(cfg.seed)
    y = torch.tensor(labels, dtype=torch.long)
    lengths = np.array([len(x) for x in tok(texts, truncation=True, max_length=cfg.max_length)["input_ids"]])
    top = _TopLayers.build(model, tok, texts, cfg) if cfg.train_layers is not None else None
    keeper = _BestEpoch.build(model, tok, val, cfg) if val is not None and top is not None else None
    for epoch in range(cfg.epochs):
        for s, idx in enumerate(_length_grouped_batches(lengths, cfg.batch_size, gen)):
            if top is not None:
                logits = top.logits(idx)
            else:
                enc = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=cfg.max_length, return_tensors="pt")
                logits = model(**enc).logits
            loss = torch.nn.functional.cross_entropy(logits, y[idx])
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if progress:
                progress(f"epoch {epoch + 1}/{cfg.epochs}", s + 1, steps_per_epoch)
        if keeper is not None:
            keeper.check(epoch + 1)
    info = {}
    if keeper is not None:
        keeper.restore()
        info = {"best_epoch": keeper.epoch, "validation_loss_by_epoch": keeper.losses}
    model.eval()
    return tok, model, info


class _BestEpoch:
    """Validation loss after every epoch (on cached encoder states); `restore` puts back the
    trainable weights of the best epoch (0 = before training)."""

    def __init__(self, model, top, y):
        self.model, self.top, self.y = model, top, y
        self.best: tuple[float, int, dict] | None = None
        self.losses: list[float] = []
        self.check(0)

    @classmethod
    def build(cls, model, tok, val, cfg) -> "_BestEpoch | None":
        import torch

        top = _TopLayers.build(model, tok, list(val[0]), cfg)
        return cls(model, top, torch.tensor(list(val[1]), dtype=torch.long)) if top is not None else None

    def check(self, epoch: int) -> None:
        import torch

        self.model.eval()
        with torch.no_grad():
            loss = float(torch.nn.functional.cross_entropy(self.top.logits(list(range(len(self.y)))), self.y))
        self.model.train()
        self.losses.append(round(loss, 4))
        if self.best is None or loss < self.best[0]:
            state = {k: v.detach().clone() for k, v in self.model.named_parameters() if v.requires_grad}
            self.best = (loss, epoch, state)

    def restore(self) -> None:
        import torch

        with torch.no_grad():
            params = dict(self.model.named_parameters())
            for k, v in self.best[2].items():
                params[k].copy_(v)

    @property
    def epoch(self) -> int:
        return self.best[1]


class _TopLayers:
    """Training only the top layers: the frozen embeddings + lower layers are run once per
    text (no dropout) and their outputs cached, so each step runs only the top layers.
    Used for BERT-type encoders (MiniLM) after checking, in eval mode, that the cached path
    gives the same logits as the model's own forward; otherwise training runs the full
    forward with the lower layers frozen (same result, slower)."""

    def __init__(self, model, states, k):
        self.model, self.states, self.k = model, states, k

    @classmethod
    def build(cls, model, tok, texts, cfg):
        import torch

        if not hasattr(model, "bert") or not hasattr(model, "classifier"):
            return None
        layers = _encoder_layers(model)
        k = max(0, len(layers) - cfg.train_layers)
        model.eval()
        states = []
        with torch.no_grad():
            for i in range(0, len(texts), 64):
                enc = tok(texts[i : i + 64], padding=True, truncation=True, max_length=cfg.max_length, return_tensors="pt")
                h = cls._lower(model, enc, k)
                for row, m in zip(h, enc["attention_mask"]):
                    states.append((row[: int(m.sum())].clone()))
            probe = tok(texts[:8], padding=True, truncation=True, max_length=cfg.max_length, return_tensors="pt")
            ref = model(**probe).logits
            self = cls(model, states, k)
            ok = torch.allclose(self.logits(list(range(min(8, len(texts))))), ref, atol=1e-3)
        model.train()
        return self if ok else None

    @staticmethod
    def _lower(model, enc, k):
        from transformers.masking_utils import create_bidirectional_mask

        h = model.bert.embeddings(input_ids=enc["input_ids"], token_type_ids=enc.get("token_type_ids"))
        mask = create_bidirectional_mask(config=model.config, inputs_embeds=h, attention_mask=enc["attention_mask"])
        for layer in _encoder_layers(model)[:k]:
            out = layer(h, attention_mask=mask)
            h = out[0] if isinstance(out, tuple) else out
        return h

    def logits(self, idx):
        import torch
        from transformers.masking_utils import create_bidirectional_mask

        rows = [self.states[i] for i in idx]
        n = max(r.shape[0] for r in rows)
        h = torch.zeros(len(rows), n, rows[0].shape[1])
        am = torch.zeros(len(rows), n, dtype=torch.long)
        for j, r in enumerate(rows):
            h[j, : r.shape[0]] = r
            am[j, : r.shape[0]] = 1
        mask = create_bidirectional_mask(config=self.model.config, inputs_embeds=h, attention_mask=am)
        for layer in _encoder_layers(self.model)[self.k :]:
            out = layer(h, attention_mask=mask)
            h = out[0] if isinstance(out, tuple) else out
        pooled = self.model.bert.pooler(h)
        return self.model.classifier(self.model.dropout(pooled))


def _encoder_layers(model):
    """The transformer blocks of a BERT-like (MiniLM) or DistilBERT encoder."""
    base = model.base_model
    if hasattr(base, "encoder") and hasattr(base.encoder, "layer"):
        return list(base.encoder.layer)
    if hasattr(base, "transformer") and hasattr(base.transformer, "layer"):
        return list(base.transformer.layer)
    raise ValueError(f"don't know the layers of {type(base).__name__}")


def _length_grouped_batches(lengths: np.ndarray, batch_size: int, gen: np.random.Generator) -> list[np.ndarray]:
    """Shuffled batches of similar token length (less padding): shuffle, sort within
    windows of 16 batches by length, cut into batches, shuffle the batch order."""
    order = gen.permutation(len(lengths))
    window = batch_size * 16
    batches = []
    for w in range(0, len(order), window):
        chunk = order[w : w + window]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in gen.permutation(len(batches))]


def _logits(tok, model, texts: list[str], max_length: int, batch_size: int = 64) -> np.ndarray:
    import torch

    out = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            enc = tok(texts[i : i + batch_size], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            out.append(model(**enc).logits.float().numpy())
    return np.concatenate(out) if out else np.zeros((0, model.config.num_labels))


def _save(tok, model, meta: ClassifierMeta, out_dir: Path) -> Path:
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    meta.save(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def _split(rows, split, limit=0):
    r = [x for x in rows if x["split"] == split]
    return r[:limit] if limit else r


def train_urgency(out_dir: Path | None = None, cfg: TrainConfig | None = None, encoder: str | None = None,
                  progress: ProgressFn | None = None) -> ClassifierMeta:
    cfg = cfg or TrainConfig()
    out_dir = Path(out_dir or default_model_dir("urgency"))
    enc_dir = resolve_encoder(encoder)
    rows = load_corpus()
    tr, va, te = _split(rows, "train", cfg.limit), _split(rows, "validation"), _split(rows, "test")
    t0 = time.time()
    tok, model, _ = _fine_tune([r["text"] for r in tr], [r["level"] - 1 for r in tr], 5, enc_dir, cfg, progress)
    train_s = time.time() - t0
    if progress:
        progress("calibrate", 0, 2)
    va_texts, va_gold = [r["text"] for r in va], [r["level"] for r in va]
    va_logits = _logits(tok, model, va_texts, cfg.max_length)
    temperature = fit_temperature(va_logits, np.asarray(va_gold) - 1)
    va_probs = softmax(va_logits, temperature)
    threshold, table = choose_escalate_below(va_probs, va_texts, va_gold)
    if progress:
        progress("calibrate", 1, 2)
    te_texts, te_gold = [r["text"] for r in te], [r["level"] for r in te]
    te_logits = _logits(tok, model, te_texts, cfg.max_length)
    te_probs = softmax(te_logits, temperature)
    metrics = {
        "validation": urgency_report(va_gold, [d.level for d in decide_many(va_probs, va_texts, threshold)]),
        "validation_ece_before": expected_calibration_error(softmax(va_logits, 1.0), np.asarray(va_gold) - 1),
        "validation_ece_after": expected_calibration_error(va_probs, np.asarray(va_gold) - 1),
        "test": urgency_report(te_gold, [d.level for d in decide_many(te_probs, te_texts, threshold)]),
        "test_model_only": urgency_report(te_gold, list(te_probs.argmax(1) + 1)),
        "escalate_below_table": table,
    }
    if progress:
        progress("calibrate", 2, 2)
    meta = ClassifierMeta(kind="urgency", labels=[1, 2, 3, 4, 5], encoder=str(enc_dir), max_length=cfg.max_length,
                          temperature=temperature, escalate_below=threshold,
                          train_info={**cfg.__dict__, "recipe": RECIPE, "n_train": len(tr), "train_seconds": round(train_s, 1),
                                      "corpus_sha256_16": _sha(corpus_path())},
                          metrics=metrics)
    _save(tok, model, meta, out_dir)
    return meta


WITHIN_ONE_TARGET = 0.90   # the share of answers whose bucket the head must get right or adjacent
FAR_COSTS = tuple(round(1.0 + 0.05 * i, 2) for i in range(61))   # 1.0 (the argmax) .. 4.0


def choose_far_cost(probs: np.ndarray, gold: np.ndarray, target: float = WITHIN_ONE_TARGET) -> float:
    """The cost of a far miss for `ordinal_bucket`, chosen on the validation split: the
    smallest in `FAR_COSTS` (so the most argmax-like, the most exact) whose within-one
    share reaches `target`; without one, the one with the highest within-one share."""
    best, best_w = FAR_COSTS[0], -1.0
    for c in FAR_COSTS:
        w = float((np.abs(ordinal_bucket(probs, c) - gold) <= 1).mean()) if len(gold) else 1.0
        if w >= target:
            return c
        if w > best_w:
            best, best_w = c, w
    return best


def quantile_edges(tokens, k: int) -> list[int]:
    """Edges for `k` buckets of about equal mass: the i/k quantiles (i = 1..k-1) of the
    output lengths, rounded to whole tokens (duplicates dropped: ties at the cap)."""
    if k < 2:
        raise ValueError("need at least 2 buckets")
    q = np.quantile(np.asarray(tokens, dtype=float), [i / k for i in range(1, k)], method="higher")
    return sorted({int(round(x)) for x in q if x > 0})


def parse_edges(spec, train_tokens=None) -> list[int]:
    """`spec`: edges in tokens ("96,160,256" or a sequence), or "q<k>" for `k` quantile
    buckets of the training split's labels (`quantile_edges`)."""
    if isinstance(spec, str) and spec.strip().lower().startswith("q"):
        if train_tokens is None:
            train_tokens = [n for r, n in _train_label_tokens()]
        return quantile_edges(train_tokens, int(spec.strip()[1:]))
    edges = [int(e) for e in (spec.split(",") if isinstance(spec, str) else spec)]
    if sorted(edges) != edges or len(set(edges)) != len(edges):
        raise ValueError(f"bucket edges must be strictly increasing, got {edges}")
    return edges


def _train_label_tokens():
    labels = load_length_labels()
    return [(r, labels[r["id"]]) for r in _split(load_corpus(), "train") if r["id"] in labels]


def length_targets(rows, labels: dict[str, int], edges) -> tuple[list[dict], list[int]]:
    kept = [r for r in rows if r["id"] in labels]
    return kept, [bucket_of(labels[r["id"]], edges) for r in kept]


def train_length(out_dir: Path | None = None, cfg: TrainConfig | None = None, base: Path | None = None,
                 edges=DEFAULT_LENGTH_EDGES, progress: ProgressFn | None = None) -> ClassifierMeta:
    """The length-bucket classifier is a head (pooler + classifier) trained on the frozen
    encoder of the urgency model at `base` (default: the "urgency" folder beside
    `out_dir`), so at inference one encoder pass serves both predictors
    (`predictors.model.shares_encoder`)."""
    out_dir = Path(out_dir or default_model_dir("length"))
    base = Path(base or out_dir.parent / "urgency")
    if not (base / META_FILE).exists():
        raise ModelMissing(f"the length head is trained on the urgency model's encoder, and there is none at {base}: "
                           "run `triage train urgency` first")
    base_meta = ClassifierMeta.load(base)
    cfg = replace(cfg or TrainConfig.length_head(), train_layers=0, max_length=base_meta.max_length)
    labels = load_length_labels()
    rows = load_corpus()
    edges_spec = edges if isinstance(edges, str) else None
    edges = parse_edges(edges, [labels[r["id"]] for r in _split(rows, "train", cfg.limit) if r["id"] in labels])
    tr, ytr = length_targets(_split(rows, "train", cfg.limit), labels, edges)
    va, yva = length_targets(_split(rows, "validation"), labels, edges)
    te, yte = length_targets(_split(rows, "test"), labels, edges)
    if len(tr) < 10 or len(va) < 5:
        raise RuntimeError(f"too few length labels ({len(tr)} train, {len(va)} validation) in {length_labels_path()}")
    n = len(edges) + 1
    t0 = time.time()
    tok, model, info = _fine_tune([r["text"] for r in tr], ytr, n, base, cfg, progress, new_head=True,
                                  val=([r["text"] for r in va], yva))
    train_s = time.time() - t0
    if progress:
        progress("calibrate", 0, 1)
    va_logits = _logits(tok, model, [r["text"] for r in va], cfg.max_length)
    temperature = fit_temperature(va_logits, np.asarray(yva))
    va_probs = softmax(va_logits, temperature)
    far_cost = choose_far_cost(va_probs, np.asarray(yva))
    te_pred = (ordinal_bucket(softmax(_logits(tok, model, [r["text"] for r in te], cfg.max_length), temperature), far_cost)
               if te else np.zeros(0, int))
    tokens_tr = np.array([labels[r["id"]] for r in tr])
    btr = np.array(ytr)
    bucket_tokens = [int(np.median(tokens_tr[btr == b])) if (btr == b).any() else int((([0] + edges)[b] + (edges + [edges[-1] * 2])[b]) / 2)
                     for b in range(n)]
    majority = int(np.bincount(btr, minlength=n).argmax())
    label_rows, label_meta = load_length_label_rows(), length_labels_meta()
    capped_all = round(float(np.mean([r["finish_reason"] == "length" for r in label_rows.values()])), 4)
    capped_train = round(float(np.mean([label_rows[r["id"]]["finish_reason"] == "length" for r in tr])), 4)
    metrics = {
        "validation": bucket_report(yva, list(ordinal_bucket(va_probs, far_cost)), n),
        "validation_argmax": bucket_report(yva, list(va_logits.argmax(1)), n),
        "test": bucket_report(yte, list(te_pred), n),
        "test_majority_baseline": bucket_report(yte, [majority] * len(yte), n),
        "train_bucket_counts": np.bincount(btr, minlength=n).tolist(),
    }
    if progress:
        progress("calibrate", 1, 1)
    meta = ClassifierMeta(kind="length", labels=list(range(n)), encoder=base_meta.encoder, max_length=cfg.max_length,
                          temperature=temperature, bucket_edges=edges, bucket_tokens=bucket_tokens, far_cost=far_cost,
                          train_info={**cfg.__dict__, "recipe": RECIPE, "n_train": len(tr), "train_seconds": round(train_s, 1),
                                      "corpus_sha256_16": _sha(corpus_path()), "labels_sha256_16": _sha(length_labels_path()),
                                      "label_sampling": label_meta.get("label_sampling"), "capped_fraction": capped_all,
                                      "capped_fraction_train": capped_train, "edges_spec": edges_spec,
                                      "encoder_of": str(base), **info},
                          metrics=metrics)
    _save(tok, model, meta, out_dir)
    return meta
