"""Quality bars of the shipped predictors (the ones `triage train all` makes in the state dir;
trained here if missing, which takes several minutes on 2 cores)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_corpus_test_level1_recall_and_under_triage(shipped):
    from predictors.evaluate import evaluate_urgency

    rep = evaluate_urgency("corpus-test", shipped.levels)
    assert rep["level1_recall"] >= 0.98
    assert rep["critical_to_3plus"] <= 0.05
    # regression guard: the shipped model measured 0.890 on corpus-test revision 4 (docs/predictors.md)
    assert rep["accuracy"] >= 0.80


def test_length_head_predicts_the_served_answers(shipped):
    """Labels made at the served defaults (brief system turn, frequency penalty) rarely hit
    the cap, and the head's reported bucket beats always answering the most common one.
    Issue 14's bars are accuracy >= 1.3x majority, within one >= 0.90, capped <= 0.10; the
    shipped head measured 1.34x / 0.929 / 0.005 (docs/predictors.md); the guard here leaves
    room for a retrain's seed-to-seed spread."""
    from predictors.evaluate import evaluate_length

    r = evaluate_length(shipped.length)
    assert r["capped_fraction"] <= 0.10
    assert r["accuracy"] >= 1.2 * r["majority_baseline"]
    assert r["within_one"] >= 0.88
    from serving.model_prep import DEFAULT_SYSTEM_PROMPT

    # the labels are answers to the system turn the service serves, not to an older one
    assert r["label_sampling"]["system_prompt"] == DEFAULT_SYSTEM_PROMPT and r["label_sampling"]["frequency_penalty"] > 0


def test_length_estimate_is_never_worse_than_no_prediction(shipped):
    """What a scheduler must be able to rely on is that the length head does not make
    things worse than knowing only the training distribution: on the test split its
    calibrated probabilities are no worse than the training prior (log-loss, 0.05 nats of
    slack) and its expected-token estimate no worse than the training mean (RMSE, 5 %).
    An overfit head (20 epochs without epoch selection) failed the first: +0.08 nats."""
    import numpy as np

    from predictors.corpus import load_corpus, load_length_labels
    from predictors.model import bucket_of

    labels, meta = load_length_labels(), shipped.length.meta
    train = [labels[r["id"]] for r in load_corpus("train") if r["id"] in labels]
    test = [r for r in load_corpus("test") if r["id"] in labels]
    y_tok = np.array([labels[r["id"]] for r in test], dtype=float)
    y = np.array([bucket_of(t, meta.bucket_edges) for t in y_tok])
    prior = np.bincount([bucket_of(t, meta.bucket_edges) for t in train], minlength=len(meta.labels)) / len(train)
    p = shipped.length.probs([r["text"] for r in test])
    rows = np.arange(len(y))
    assert -np.log(p[rows, y]).mean() <= -np.log(prior[y]).mean() + 0.05
    est = p @ np.asarray(meta.bucket_tokens, dtype=float)
    rmse = lambda e: float(np.sqrt(np.mean((e - y_tok) ** 2)))  # noqa: E731
    assert rmse(est) <= 1.05 * rmse(np.full_like(y_tok, np.mean(train)))
    assert meta.metrics["test"]["accuracy"] >= meta.metrics["test_majority_baseline"]["accuracy"] - 0.03
