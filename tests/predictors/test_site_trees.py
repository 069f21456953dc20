"""The site adapter's trees (predictors/site_trees.py) and the "auto" head of
predictors/adapter.py: the numpy export scores exactly as scikit-learn does, the head is
chosen by inner folds, and a stored trees/blend adapter decides the same after loading."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")

import predictors.adapter as adapter_mod  # noqa: E402
import predictors.site_trees as trees_mod  # noqa: E402
from predictors.adapter import SiteAdapter, fit_adapter  # noqa: E402
from predictors.site_features import site_features  # noqa: E402
from predictors.site_trees import fit_trees  # noqa: E402

HIDDEN = 8


def _site(n: int, seed: int = 0):
    """Synthetic relabels whose level is an interaction (XOR) of two pooled dimensions: a
    linear head cannot express it, trees can."""
    rng = np.random.default_rng(seed)
    pooled = rng.normal(size=(n, HIDDEN))
    pooled[:, :3] *= 3.0  # the signal lies along the top principal directions the trees read
    a, b = pooled[:, 0] > 0, pooled[:, 1] > 0
    gold = np.where(a ^ b, 2, 4) + (pooled[:, 2] > 2.4) - (pooled[:, 2] < -2.4)
    gold = np.clip(gold, 1, 5)
    gold[: n // 20] = 1
    gold[n // 20: n // 10] = 5
    general = np.full(n, 3)
    probs = np.full((n, 5), 0.1)
    probs[:, 2] = 0.6
    X = site_features(pooled, probs, ["a call"] * n)
    return X, gold, general


@pytest.fixture()
def fast_trees(monkeypatch):
    monkeypatch.setattr(trees_mod, "TREE_ITERS", 60)
    monkeypatch.setattr(trees_mod, "TREE_LR", 0.1)
    monkeypatch.setattr(adapter_mod, "TREE_GRID", ((4, 3),))


def test_exported_trees_score_like_scikit_learn(fast_trees):
    from sklearn.ensemble import HistGradientBoostingClassifier

    X, gold, _ = _site(300)
    head = fit_trees(X, gold - 1, HIDDEN, k=4, depth=3)
    ref = HistGradientBoostingClassifier(learning_rate=trees_mod.TREE_LR, max_iter=trees_mod.TREE_ITERS,
                                         min_samples_leaf=trees_mod.TREE_MIN_LEAF, max_depth=3, early_stopping=False,
                                         random_state=0).fit(head.inputs(X), gold - 1)
    Xn, _, _ = _site(100, seed=1)
    z = head.logits(Xn)
    p = np.exp(z - z.max(1, keepdims=True))
    np.testing.assert_allclose(p / p.sum(1, keepdims=True), ref.predict_proba(head.inputs(Xn)), atol=1e-9)


def test_auto_head_picks_trees_for_an_interaction_and_survives_save_load(fast_trees, tmp_path):
    X, gold, general = _site(400)
    ad = fit_adapter(X, gold, general, HIDDEN, budget=0.2, head="auto")
    assert ad.head in ("trees", "blend"), ad.info["inner_nll_calibrated"]
    assert set(ad.info["inner_nll_calibrated"]) == {"logistic", "trees", "blend"}
    Xn, _, gn = _site(120, seed=2)
    loaded = SiteAdapter.load(ad.save(tmp_path / "v1"))
    assert loaded.head == ad.head
    np.testing.assert_allclose(loaded.probs(Xn), ad.probs(Xn))
    np.testing.assert_array_equal(loaded.decide(Xn, gn), ad.decide(Xn, gn))


def test_auto_head_with_few_relabels_is_the_logistic_head(fast_trees):
    X, gold, general = _site(120)
    ad = fit_adapter(X, gold, general, HIDDEN, budget=0.2, head="auto")
    assert ad.head == "logistic" and ad.trees is None and set(ad.info["inner_nll_calibrated"]) == {"logistic"}
