"""Quality bars of the shipped predictors (the ones `triage train all` makes in the state dir;
trained here if missing, which takes several minutes on 2 cores)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shipped():
    from predictors.model import META_FILE, default_model_dir
    from predictors.service import Predictor
    from predictors.train import train_length, train_urgency

    if not (default_model_dir("urgency") / META_FILE).exists():
        train_urgency()
    if not (default_model_dir("length") / META_FILE).exists():
        train_length()
    return Predictor()


def test_corpus_test_level1_recall_and_under_triage(shipped):
    from predictors.evaluate import evaluate_urgency

    rep = evaluate_urgency("corpus-test", shipped.levels)
    assert rep["level1_recall"] >= 0.98
    assert rep["critical_to_3plus"] <= 0.05
    # regression guard: the shipped model measured 0.817 on corpus-test (docs/predictors.md)
    assert rep["accuracy"] >= 0.80


@pytest.mark.xfail(strict=True, reason="known gap: 1,024 of 2,810 corpus prompts have SmolLM2 length labels; "
                   "65 % of the answers run to the 512-token cap and the length model predicts the cap "
                   "for every text (= the majority baseline, 0.601); finish `python -m "
                   "predictors.length_labels`, retrain, and this must pass")
def test_length_beats_majority_baseline(shipped):
    m = shipped.length.meta.metrics
    assert m["test"]["accuracy"] > m["test_majority_baseline"]["accuracy"]
    assert m["test"]["within_one_bucket"] >= 0.7
