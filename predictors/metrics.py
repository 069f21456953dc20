"""Classification metrics for triage: accuracy, macro-F1, confusion, under/over-triage."""
from __future__ import annotations

import numpy as np


def confusion(gold, pred, labels) -> list[list[int]]:
    """Rows = gold label, columns = predicted label, in `labels` order."""
    idx = {l: i for i, l in enumerate(labels)}
    m = np.zeros((len(labels), len(labels)), dtype=int)
    for g, p in zip(gold, pred):
        m[idx[g], idx[p]] += 1
    return m.tolist()


def macro_f1(gold, pred, labels) -> float:
    """Mean F1 over the labels that occur in `gold`."""
    gold, pred = np.asarray(gold), np.asarray(pred)
    f1s = []
    for l in labels:
        if not (gold == l).any():
            continue
        tp = int(((gold == l) & (pred == l)).sum())
        fp = int(((gold != l) & (pred == l)).sum())
        fn = int(((gold == l) & (pred != l)).sum())
        f1s.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(f1s)) if f1s else 0.0


def urgency_report(gold, pred) -> dict:
    """The evaluation JSON for ESI levels 1-5.

    under_triage_1_2: share of gold level 1-2 given a less urgent level than gold (1->2 counts);
    critical_to_3plus: share of gold 1-2 given level 3-5; over_triage / under_triage: share of
    all requests given a more / less urgent level than gold.
    """
    gold, pred = np.asarray(gold, dtype=int), np.asarray(pred, dtype=int)
    n = len(gold)
    crit = gold <= 2
    def share(mask, of):
        return float(mask.sum() / of.sum()) if of.sum() else None
    return {
        "n": int(n),
        "accuracy": float((gold == pred).mean()) if n else None,
        "macro_f1": macro_f1(gold, pred, [1, 2, 3, 4, 5]),
        "under_triage_1_2": share(crit & (pred > gold), crit),
        "level1_recall": share((gold == 1) & (pred == 1), gold == 1),
        "confusion": confusion(gold, pred, [1, 2, 3, 4, 5]),
        "critical_to_3plus": share(crit & (pred >= 3), crit),
        "under_triage": float((pred > gold).mean()) if n else None,
        "over_triage": float((pred < gold).mean()) if n else None,
        "within_one": float((np.abs(pred - gold) <= 1).mean()) if n else None,
    }


def bucket_report(gold, pred, n_buckets: int) -> dict:
    gold, pred = np.asarray(gold, dtype=int), np.asarray(pred, dtype=int)
    n = len(gold)
    return {
        "n": int(n),
        "accuracy": float((gold == pred).mean()) if n else None,
        "within_one_bucket": float((np.abs(gold - pred) <= 1).mean()) if n else None,
        "macro_f1": macro_f1(gold, pred, list(range(n_buckets))),
        "confusion": confusion(gold, pred, list(range(n_buckets))),
    }
