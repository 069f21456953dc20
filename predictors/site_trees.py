"""Gradient-boosted trees for a site adapter: the non-linear head on the adapter's features
that a linear head cannot be (KTAS grades a vital sign or a pain score differently by age
and complaint; a tree splits on the interaction).

Input: [low-rank projection of the pooled vector (its top `k` principal directions on the
training rows) | log P_general | vitals block], the raw features (trees do not need them
standardised). Fitted with scikit-learn's `HistGradientBoostingClassifier` (multinomial,
fixed learning rate and iterations, no early stopping, seeded), then exported to plain
arrays (`TreeHead.arrays`): a stored adapter is read and evaluated with numpy alone, with no
pickled object. The export reads the fitted model's tree tables (`_predictors`,
`_baseline_prediction`): a scikit-learn internal, used at fit time only and checked against
`predict_proba` by the tests.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# (principal directions of the pooled vector, tree depth); chosen by inner log-loss
TREE_GRID = ((32, 3), (64, 3))
TREE_LR, TREE_ITERS, TREE_MIN_LEAF = 0.03, 300, 20
TREE_MIN_ROWS = 200  # fewer training relabels: the trees are not tried (a linear head only)


def available() -> bool:
    try:
        import sklearn.ensemble  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class TreeHead:
    mean: np.ndarray       # (hidden,) pooled-vector mean
    proj: np.ndarray       # (hidden, k) principal directions
    baseline: np.ndarray   # (5,) raw score before any tree
    feature: np.ndarray    # (trees, nodes) int: feature split on
    threshold: np.ndarray  # (trees, nodes) float: go left when x <= threshold
    left: np.ndarray       # (trees, nodes) int
    right: np.ndarray      # (trees, nodes) int
    leaf: np.ndarray       # (trees, nodes) bool
    value: np.ndarray      # (trees, nodes) float
    cls: np.ndarray        # (trees,) int: the class each tree scores
    hidden: int

    def inputs(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        return np.hstack([(X[:, :self.hidden] - self.mean) @ self.proj, X[:, self.hidden:]])

    def logits(self, X: np.ndarray) -> np.ndarray:
        F = self.inputs(X)
        n, t = len(F), len(self.cls)
        node = np.zeros((n, t), dtype=np.int64)
        cols = np.arange(t)[None, :]
        for _ in range(self.feature.shape[1]):  # at most one step per node
            leaf = self.leaf[cols, node]
            if leaf.all():
                break
            x = np.take_along_axis(F, self.feature[cols, node], axis=1)
            nxt = np.where(x <= self.threshold[cols, node], self.left[cols, node], self.right[cols, node])
            node = np.where(leaf, node, nxt)
        vals = self.value[cols, node]
        out = np.tile(self.baseline, (n, 1))
        for c in range(len(self.baseline)):
            out[:, c] += vals[:, self.cls == c].sum(axis=1)
        return out

    def arrays(self, prefix: str = "tree_") -> dict[str, np.ndarray]:
        names = ("mean", "proj", "baseline", "feature", "threshold", "left", "right", "leaf", "value", "cls")
        return {prefix + k: getattr(self, k) for k in names}

    @classmethod
    def from_arrays(cls, arrays: dict, hidden: int, prefix: str = "tree_") -> "TreeHead":
        names = ("mean", "proj", "baseline", "feature", "threshold", "left", "right", "leaf", "value", "cls")
        return cls(**{k: np.asarray(arrays[prefix + k]) for k in names}, hidden=hidden)


def fit_trees(X: np.ndarray, y: np.ndarray, hidden: int, k: int, depth: int, seed: int = 0) -> TreeHead:
    """Fit on raw feature rows `X` (y in 0..4) and export. `k` is clamped to the rows available."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=int)
    pooled = X[:, :hidden]
    mean = pooled.mean(axis=0)
    k = max(1, min(k, len(X) - 1, hidden))
    _, _, vt = np.linalg.svd(pooled - mean, full_matrices=False)
    proj = vt[:k].T.copy()
    F = np.hstack([(pooled - mean) @ proj, X[:, hidden:]])
    from threadpoolctl import threadpool_limits

    model = HistGradientBoostingClassifier(learning_rate=TREE_LR, max_iter=TREE_ITERS, min_samples_leaf=TREE_MIN_LEAF,
                                           max_depth=depth, early_stopping=False, random_state=seed)
    with threadpool_limits(limits=1):  # one core: a fit beside a serving front end must not take them all
        model.fit(F, y)
    if list(model.classes_) != list(range(5)):
        raise ValueError(f"trees need every level in the training rows, got {list(model.classes_)}")
    trees = [(c, p.nodes) for it in model._predictors for c, p in enumerate(it)]
    width = max(len(nodes) for _, nodes in trees)

    def pad(field: str, dtype, fill=0):
        out = np.full((len(trees), width), fill, dtype=dtype)
        for i, (_, nodes) in enumerate(trees):
            out[i, :len(nodes)] = nodes[field]
        return out

    return TreeHead(mean=mean, proj=proj, baseline=np.asarray(model._baseline_prediction, dtype=np.float64).ravel(),
                    feature=pad("feature_idx", np.int64), threshold=pad("num_threshold", np.float64),
                    left=pad("left", np.int64), right=pad("right", np.int64), leaf=pad("is_leaf", bool, True),
                    value=pad("value", np.float64), cls=np.array([c for c, _ in trees], dtype=np.int64), hidden=hidden)
