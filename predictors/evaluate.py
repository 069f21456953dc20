"""Evaluate the urgency predictor on the corpus test split and on the real evaluation sets.

KTAS (Moon et al. 2019, 1,267 Korean ED visits, expert gold KTAS 1-5) and the Semigran
vignettes (45, em/ne/sc) are read in place from `triage.paths.shared_datasets_dir()`;
they are evaluation data only: nothing here fits or tunes anything.

KTAS text, built from the triage-time fields only (never the diagnosis or disposition):
    "<chief complaint>, age <Age>, SBP <SBP> DBP <DBP> HR <HR> RR <RR> BT <BT> SpO2 <Sat>,
     NRS <NRS_pain>, mental: <alert|verbal|pain|unresponsive>"
Missing fields (blank, `??`, `#BOÞ!`) are left out; NRS is given when Pain = 1 (the ESI
"severe pain/distress" input, recorded at triage). KTAS and ESI are both five-level
triage scales with level 1 most urgent; levels are compared one to one.

Semigran mapping (three classes to the five ESI levels): em (emergent care) = level <= 2,
ne (non-emergent care reasonable) = levels 3-4, sc (self-care reasonable) = level 5.
A prediction is correct when it falls in the gold range; the confusion matrix has rows
em/ne/sc and columns predicted levels 1-5; macro-F1 is over the three classes;
under_triage_1_2 is the share of em vignettes predicted 3-5; level1_recall is null.

Corpus test split: the report adds `by_kind`: the dispatch rows' own report (level-1
recall of real callers) and, for the texts that are not dispatch requests (chat, writing,
code, trivia, paperwork, health questions; gold 5), how many were predicted 1-2, 3 and 4-5.
"""
from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np

from predictors.corpus import load_corpus, load_length_label_rows, length_labels_meta
from predictors.metrics import macro_f1, urgency_report
from triage.paths import shared_datasets_dir

DATASETS = ("ktas", "semigran", "corpus-test")
KTAS_FILE = "ktas_triage_korea_ed.csv.gz"
SEMIGRAN_FILE = "semigran2015_triage_vignettes.csv.gz"
_MENTAL = {"1": "alert", "2": "verbal", "3": "pain", "4": "unresponsive"}
SEMIGRAN_RANGES = {"em": (1, 2), "ne": (3, 4), "sc": (5, 5)}


def _num(v: str) -> str | None:
    v = (v or "").strip()
    try:
        float(v)
    except ValueError:
        return None
    return v


def ktas_text(row: dict) -> str:
    """The triage-time text for one KTAS record (see module docstring)."""
    cc = (row.get("Chief_complain") or "").strip()
    parts = [cc if set(cc) - set("? ") else "chief complaint not recorded"]
    if _num(row.get("Age", "")):
        parts.append(f"age {row['Age'].strip()}")
    vit = []
    for col, name in (("SBP", "SBP"), ("DBP", "DBP"), ("HR", "HR"), ("RR", "RR"), ("BT", "BT"), ("Saturation", "SpO2")):
        v = _num(row.get(col, ""))
        if v is not None:
            vit.append(f"{name} {v}")
    if vit:
        parts.append(" ".join(vit))
    if (row.get("Pain") or "").strip() == "1" and _num(row.get("NRS_pain", "")):
        parts.append(f"NRS {row['NRS_pain'].strip()}")
    mental = _MENTAL.get((row.get("Mental") or "").strip())
    if mental:
        parts.append(f"mental: {mental}")
    return ", ".join(parts)


_ARRIVAL = {"1": "walk-in", "2": "public ambulance", "3": "private vehicle", "4": "private ambulance"}


def ktas_site_fields(row: dict) -> str:
    """The triage-time fields of a KTAS record that `ktas_text` leaves out, as a site's request
    would state them: ", arrival: <walk-in|public ambulance|private vehicle|private ambulance|
    other>, injury: <yes|no>". Appended for the site adapter's structured block only (see
    `predictors.site_eval`); the general model reads `ktas_text` alone, so zero-shot figures
    do not depend on it."""
    parts = []
    mode = (row.get("Arrival mode") or "").strip()
    if mode:
        parts.append(f"arrival: {_ARRIVAL.get(mode, 'other')}")
    inj = (row.get("Injury") or "").strip()
    if inj in ("1", "2"):
        parts.append(f"injury: {'yes' if inj == '2' else 'no'}")
    return "".join(", " + p for p in parts)


def _read_gz_csv(path: Path) -> list[dict]:
    if not path.exists():
        raise FileNotFoundError(f"{path} not found (shared datasets are read in place; set TRIAGE_DATASETS)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def load_ktas(site_fields: bool = False) -> tuple[list[str], list[int], list[int | None]]:
    """(texts, expert gold levels, triage-nurse levels) for all records; with `site_fields`,
    each text is followed by `ktas_site_fields` (arrival mode, injury)."""
    rows = _read_gz_csv(shared_datasets_dir() / KTAS_FILE)
    nurse = [int(r["KTAS_RN"]) if _num(r.get("KTAS_RN", "")) else None for r in rows]
    texts = [ktas_text(r) + (ktas_site_fields(r) if site_fields else "") for r in rows]
    return texts, [int(r["KTAS_expert"]) for r in rows], nurse


def load_semigran() -> tuple[list[str], list[str]]:
    rows = _read_gz_csv(shared_datasets_dir() / SEMIGRAN_FILE)
    return [r["case_description"] for r in rows], [r["urgency_level"] for r in rows]


def semigran_report(gold: list[str], pred: list[int]) -> dict:
    pred_a = np.asarray(pred, dtype=int)
    ok = np.array([SEMIGRAN_RANGES[g][0] <= p <= SEMIGRAN_RANGES[g][1] for g, p in zip(gold, pred_a)])
    to_cls = lambda p: "em" if p <= 2 else "ne" if p <= 4 else "sc"  # noqa: E731
    em = np.array([g == "em" for g in gold])
    conf = [[int(((np.asarray(gold) == g) & (pred_a == lv)).sum()) for lv in range(1, 6)] for g in ("em", "ne", "sc")]
    return {
        "n": len(gold),
        "accuracy": float(ok.mean()) if len(gold) else None,
        "macro_f1": macro_f1(gold, [to_cls(p) for p in pred_a], ["em", "ne", "sc"]),
        "under_triage_1_2": float((em & (pred_a >= 3)).sum() / em.sum()) if em.any() else None,
        "level1_recall": None,
        "confusion": conf,
        "confusion_rows": ["em", "ne", "sc"],
        "over_triage": float(np.mean([p < SEMIGRAN_RANGES[g][0] for g, p in zip(gold, pred_a)])) if len(gold) else None,
        "mapping": {"em": "level<=2", "ne": "levels 3-4", "sc": "level 5"},
    }


def kind_report(rows: list[dict], pred: list[int]) -> dict:
    """Corpus rows by `kind` (revision 4): dispatch requests get the usual report; texts that
    are not dispatch requests (gold level 5) are counted by predicted level band, overall
    and per style. Rows without a `kind` count as dispatch."""
    pred_a = np.asarray(pred, dtype=int)
    kinds = np.array([r.get("kind", "dispatch") for r in rows])
    out: dict = {}
    disp = kinds == "dispatch"
    if disp.any():
        out["dispatch"] = urgency_report([r["level"] for r, k in zip(rows, disp) if k], list(pred_a[disp]))
    nd = kinds == "non_dispatch"
    if nd.any():
        p = pred_a[nd]
        bands = lambda q: {"level_1_2": int((q <= 2).sum()), "level_3": int((q == 3).sum()), "level_4_5": int((q >= 4).sum())}  # noqa: E731
        styles = np.array([r["style"] for r, k in zip(rows, nd) if k])
        out["non_dispatch"] = {
            "n": int(nd.sum()), **bands(p),
            "share_level_1_2": float((p <= 2).mean()), "share_level_4_5": float((p >= 4).mean()),
            "predicted_counts_1_5": [int((p == lv).sum()) for lv in range(1, 6)],
            "by_style": {st: {"n": int((styles == st).sum()), **bands(p[styles == st])} for st in sorted(set(styles))},
        }
    return out


def evaluate_urgency(dataset: str, predict_levels) -> dict:
    """`predict_levels(texts) -> list[int]` (effective levels). Returns the report dict."""
    if dataset == "ktas":
        texts, gold, nurse = load_ktas()
        rep = urgency_report(gold, predict_levels(texts))
        ok = [i for i, n in enumerate(nurse) if n is not None]
        ref = urgency_report([gold[i] for i in ok], [nurse[i] for i in ok])
        rep["reference_triage_nurse"] = {k: ref[k] for k in ("n", "accuracy", "macro_f1", "under_triage_1_2", "critical_to_3plus", "over_triage")}
        return rep
    if dataset == "semigran":
        texts, gold = load_semigran()
        return semigran_report(gold, predict_levels(texts))
    if dataset == "corpus-test":
        rows = load_corpus("test")
        pred = predict_levels([r["text"] for r in rows])
        rep = urgency_report([r["level"] for r in rows], pred)
        rep["by_kind"] = kind_report(rows, pred)
        return rep
    raise ValueError(f"unknown dataset {dataset!r}; expected one of {DATASETS}")


def evaluate_length(clf, split: str = "test") -> dict:
    """The length head (`clf`, a loaded `Classifier` of kind "length") on a corpus split.

    accuracy / within_one: the reported bucket (least expected cost, `ordinal_bucket`) exact /
    off by at most one bucket;
    majority_baseline: accuracy of always answering the split's most common bucket (the
    stricter form: the training split's majority bucket does no better);
    mae_tokens: mean |estimate - true output tokens| of the estimate the service uses
    (expected tokens, sum over buckets of P(bucket) x the bucket's median in training),
    beside mae_tokens_baseline, the training split's median length for every request;
    capped_fraction: share of the split's labels that hit the generation cap;
    label_sampling: how the labels were generated (the label file's sidecar)."""
    from predictors.metrics import bucket_report
    from predictors.model import bucket_of, ordinal_bucket

    meta = clf.meta
    labels = load_length_label_rows()
    train_tokens = [int(labels[r["id"]]["output_tokens"]) for r in load_corpus("train") if r["id"] in labels]
    rows = [r for r in load_corpus(split) if r["id"] in labels]
    tokens = np.array([int(labels[r["id"]]["output_tokens"]) for r in rows], dtype=float)
    gold = np.array([bucket_of(t, meta.bucket_edges) for t in tokens], dtype=int)
    probs = clf.probs([r["text"] for r in rows])
    pred = ordinal_bucket(probs, meta.far_cost)   # the bucket the service reports (train.choose_far_cost)
    n_buckets = len(meta.labels)
    rep = bucket_report(list(gold), list(pred), n_buckets)
    est = probs @ np.asarray(meta.bucket_tokens, dtype=float)
    majority = np.bincount(gold, minlength=n_buckets).argmax() if len(gold) else 0
    sampling = length_labels_meta().get("label_sampling") or meta.train_info.get("label_sampling")
    return {
        "n": int(len(rows)), "split": split,
        "accuracy": rep["accuracy"], "within_one": rep["within_one_bucket"],
        "majority_baseline": float((gold == majority).mean()) if len(gold) else None,
        "within_one_baseline": float((np.abs(gold - majority) <= 1).mean()) if len(gold) else None,
        "mae_tokens": float(np.abs(est - tokens).mean()) if len(rows) else None,
        "mae_tokens_baseline": float(np.abs(np.median(train_tokens) - tokens).mean()) if len(rows) and train_tokens else None,
        "capped_fraction": float(np.mean([labels[r["id"]]["finish_reason"] == "length" for r in rows])) if rows else None,
        "label_sampling": sampling,
        "bucket_edges": list(meta.bucket_edges), "bucket_tokens": list(meta.bucket_tokens),
        "macro_f1": rep["macro_f1"], "confusion": rep["confusion"],
    }
