"""A site adapter: a calibrated head on the general model's frozen features
(`predictors.site_features`), fitted on a site's relabels, with a cost-sensitive decision
rule and the general model as its safety floor. Deciding needs numpy only.

Heads: "logistic" (multinomial, L2), "mlp" (one hidden layer, torch at fit time), and
"auto": the logistic head, gradient-boosted trees (`predictors.site_trees`, scikit-learn at
fit time) and their blend (the mean of the two calibrated log-probabilities), whichever has
the least inner-fold log-loss (trees only with scikit-learn and >= `TREE_MIN_ROWS` rows).

Fitting (`fit_adapter`, training rows only; nothing here sees held-out rows):
1. Standardise the features; each head's settings (L2 from `L2_GRID`, trees from
   `TREE_GRID`, ...) chosen by inner k-fold log-loss, and for "auto" the head too.
2. Out-of-fold logits of the inner folds -> temperature (`calibration.fit_temperature`):
   the adapter's probabilities are calibrated on rows its weights never saw.
3. Decision rule: the level j minimising the expected cost sum_g P(g) C[g, j], where an
   error costs 1 and sending a gold level 1-2 to a less urgent level costs `under_weight`.
   `under_weight` is chosen on the out-of-fold probabilities: the most accurate weight whose
   under-triage of levels 1-2 stays within `budget` (default: the general model's own
   under-triage on the same rows, so the adapter is not allowed to be less safe).
4. Safety floor: where the general model is confident of level 1-2 (calibrated
   P(1)+P(2) >= `floor_confidence`, or its vital-sign rule A fired) the request gets the
   more urgent of the two levels.
5. The weights are refitted on all training rows.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

import numpy as np

from predictors.calibration import expected_calibration_error, fit_temperature
from predictors.metrics import urgency_report
from predictors.model import softmax
from predictors.site_features import FEATURE_VERSION, VITALS_NAMES
from predictors.site_trees import TREE_GRID, TREE_MIN_ROWS, TreeHead, fit_trees
from predictors.site_trees import available as trees_available

L2_GRID = (0.003, 0.01, 0.03, 0.1)
# the MLP head (`head="mlp"`): input dropout 0.2 -> 64 ReLU units -> dropout 0.5 -> 5 logits,
# AdamW (lr 3e-3, full batch, seeded); weight decay and epochs chosen by inner log-loss
MLP_HIDDEN = 64
MLP_GRID = ((0.01, 150), (0.1, 150), (0.01, 300), (0.1, 300))
HEADS = ("logistic", "mlp", "auto")
# 41 weights, 1 to 48 in equal ratios (~10 % apart): fine enough to land near the budget
UNDER_WEIGHTS = tuple(float(w) for w in np.round(np.geomspace(1.0, 48.0, 41), 3))
FLOOR_CONFIDENCE = 0.9
ADAPTER_FILE, ADAPTER_META = "adapter.npz", "adapter.json"

ProgressFn = Callable[[str, int, int], None]


class AdaptError(ValueError):
    """The relabel log cannot support an adapter (too few rows per level, one class, ...)."""


# --- the logistic head ----------------------------------------------------------------------
def _loss_grad(params: np.ndarray, X: np.ndarray, Y: np.ndarray, l2: float) -> tuple[float, np.ndarray]:
    d, k = X.shape[1], Y.shape[1]
    W, b = params[: d * k].reshape(d, k), params[d * k:]
    z = X @ W + b
    z -= z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    n = len(X)
    loss = -float((Y * logp).sum()) / n + 0.5 * l2 * float((W * W).sum())
    g = (np.exp(logp) - Y) / n
    gW = X.T @ g + l2 * W
    return loss, np.concatenate([gW.ravel(), g.sum(axis=0)])


def _lbfgs(f, x0: np.ndarray, iters: int = 300, m: int = 10, tol: float = 1e-5) -> np.ndarray:
    """Minimise a smooth convex `f(x) -> (value, gradient)` (L-BFGS, Armijo backtracking)."""
    x = x0.copy()
    fx, g = f(x)
    S: list[np.ndarray] = []
    Yk: list[np.ndarray] = []
    for _ in range(iters):
        q = g.copy()
        alphas = []
        for s, y in zip(reversed(S), reversed(Yk)):
            a = (s @ q) / (y @ s)
            alphas.append(a)
            q -= a * y
        if S:
            q *= (S[-1] @ Yk[-1]) / (Yk[-1] @ Yk[-1])
        for (s, y), a in zip(zip(S, Yk), reversed(alphas)):
            q += s * (a - (y @ q) / (y @ s))
        step, direction = 1.0, -q
        slope = g @ direction
        if slope >= 0:  # not a descent direction: restart from the gradient
            S.clear(), Yk.clear()
            direction, slope = -g, -(g @ g)
        while True:
            xn = x + step * direction
            fn, gn = f(xn)
            if fn <= fx + 1e-4 * step * slope or step < 1e-10:
                break
            step *= 0.5
        s, y = xn - x, gn - g
        if y @ s > 1e-12:
            S.append(s)
            Yk.append(y)
            if len(S) > m:
                S.pop(0), Yk.pop(0)
        x, g, done = xn, gn, abs(fx - fn) <= tol * max(1.0, abs(fx))
        fx = fn
        if done or np.abs(g).max() < 1e-7:
            break
    return x


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float, k: int = 5, start: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial logistic regression on standardised X; y in 0..k-1. Returns (W, b).
    `start`: (W, b) to start from (e.g. the solution for a stronger L2), else zero weights
    and the class prior."""
    Y = np.eye(k)[y]
    d = X.shape[1]
    if start is not None:
        x0 = np.concatenate([np.asarray(start[0]).ravel(), np.asarray(start[1])])
    else:
        x0 = np.concatenate([np.zeros(d * k), np.log((np.bincount(y, minlength=k) + 1.0) / (len(y) + k))])
    p = _lbfgs(lambda w: _loss_grad(w, X, Y, l2), x0)
    return p[: d * k].reshape(d, k), p[d * k:]


def fit_mlp(X: np.ndarray, y: np.ndarray, weight_decay: float, epochs: int, k: int = 5, seed: int = 0,
            hidden: int = MLP_HIDDEN) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A one-hidden-layer MLP on standardised X (torch, CPU, seeded, full batch); y in 0..k-1.
    Returns numpy (W1, b1, W, b) for `SiteAdapter.logits`; dropout is training-only."""
    import torch

    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    lin1, lin2 = torch.nn.Linear(X.shape[1], hidden), torch.nn.Linear(hidden, k)
    for lin in (lin1, lin2):  # initialised from the seeded generator, not the global RNG state
        bound = 1.0 / np.sqrt(lin.in_features)
        with torch.no_grad():
            lin.weight.uniform_(-bound, bound, generator=g)
            lin.bias.uniform_(-bound, bound, generator=g)
    net = torch.nn.Sequential(torch.nn.Dropout(0.2), lin1, torch.nn.ReLU(), torch.nn.Dropout(0.5), lin2)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=weight_decay)
    Xt, yt = torch.tensor(X, dtype=torch.float32), torch.tensor(np.asarray(y), dtype=torch.long)
    net.train()
    for _ in range(epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(Xt), yt).backward()
        opt.step()
    f = lambda t: t.detach().double().numpy().copy()  # noqa: E731
    return f(lin1.weight).T, f(lin1.bias), f(lin2.weight).T, f(lin2.bias)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _blend(linear: np.ndarray, trees: np.ndarray, t_linear: float, t_trees: float) -> np.ndarray:
    """The blend head's scores: the mean of the two heads' calibrated log-probabilities."""
    return 0.5 * (_log_softmax(linear / t_linear) + _log_softmax(trees / t_trees))


def _nll(z: np.ndarray, t: np.ndarray) -> float:
    return float(-_log_softmax(z)[np.arange(len(t)), t].mean())


def _mlp_logits(Z: np.ndarray, params: tuple) -> np.ndarray:
    W1, b1, W, b = params
    return np.maximum(Z @ W1 + b1, 0.0) @ W + b


def stratified_folds(y: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Fold index per row, each class spread evenly over the folds (seeded)."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(y), dtype=int)
    offset = 0
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        fold[idx] = (np.arange(len(idx)) + offset) % k
        offset += len(idx)
    return fold


# --- the decision rule ----------------------------------------------------------------------
def cost_matrix(under_weight: float) -> np.ndarray:
    """C[g, j] (0-based levels): 0 when right, `under_weight` when gold 1-2 is sent less urgent, else 1."""
    C = 1.0 - np.eye(5)
    for g in (0, 1):
        C[g, g + 1:] = under_weight
    return C


def general_floor_mask(general_probs: np.ndarray, floor_a: np.ndarray, general_levels: np.ndarray, confidence: float) -> np.ndarray:
    return (general_levels <= 2) & ((general_probs[:, :2].sum(axis=1) >= confidence) | floor_a)


def decide_levels(probs: np.ndarray, under_weight: float, general_levels: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """Levels 1-5: the minimum expected cost level, raised to the general model's where `floor`."""
    levels = (probs @ cost_matrix(under_weight)).argmin(axis=1) + 1
    return np.where(floor, np.minimum(levels, general_levels), levels)


def under_triage_12(gold: np.ndarray, pred: np.ndarray) -> float:
    crit = gold <= 2
    return float((crit & (pred > gold)).sum() / crit.sum()) if crit.any() else 0.0


def choose_under_weight(probs, gold, general_levels, floor, budget: float) -> tuple[float, list[dict]]:
    """The most accurate weight whose under-triage of 1-2 is within `budget` (ties: the
    smaller weight); if none is, the weight with the least under-triage."""
    table = []
    for w in UNDER_WEIGHTS:
        lv = decide_levels(probs, w, general_levels, floor)
        table.append({"under_weight": w, "accuracy": float((lv == gold).mean()), "under_triage_1_2": under_triage_12(gold, lv)})
    ok = [r for r in table if r["under_triage_1_2"] <= budget + 1e-12]
    best = max(ok, key=lambda r: (r["accuracy"], -r["under_weight"])) if ok else \
        min(table, key=lambda r: (r["under_triage_1_2"], -r["accuracy"]))
    return best["under_weight"], table


# --- the adapter ----------------------------------------------------------------------------
@dataclass
class SiteAdapter:
    mean: np.ndarray
    scale: np.ndarray
    W: np.ndarray
    b: np.ndarray
    temperature: float
    under_weight: float
    hidden: int
    W1: np.ndarray | None = None  # MLP head: first layer (None: logistic head)
    b1: np.ndarray | None = None
    head: str = ""  # "logistic", "mlp", "trees", "blend" ("": an older adapter, logistic or mlp by W1)
    trees: TreeHead | None = None  # "trees" and "blend"
    part_temperatures: list | None = None  # "blend": the logistic's and the trees' own temperatures
    floor_confidence: float = FLOOR_CONFIDENCE
    feature_version: int = FEATURE_VERSION
    general_fingerprint: str = ""
    info: dict = field(default_factory=dict)

    def logits(self, X: np.ndarray) -> np.ndarray:
        """Scores before the adapter's temperature (for "blend": the mean calibrated log-probability)."""
        if self.head == "trees":
            return self.trees.logits(X)
        Z = (np.asarray(X, dtype=np.float64) - self.mean) / self.scale
        if self.W1 is not None:
            Z = np.maximum(Z @ self.W1 + self.b1, 0.0)
        z = Z @ self.W + self.b
        if self.head == "blend":
            tl, tt = self.part_temperatures
            return _blend(z, self.trees.logits(X), tl, tt)
        return z

    def probs(self, X: np.ndarray) -> np.ndarray:
        """Calibrated P(level 1..5)."""
        return softmax(self.logits(X), self.temperature)

    def floor(self, X: np.ndarray, general_levels: np.ndarray) -> np.ndarray:
        X = np.asarray(X)
        gp = np.exp(X[:, self.hidden:self.hidden + 5])
        fa = X[:, self.hidden + 5 + VITALS_NAMES.index("floor_A")] > 0.5
        return general_floor_mask(gp, fa, np.asarray(general_levels), self.floor_confidence)

    def decide(self, X: np.ndarray, general_levels) -> np.ndarray:
        """Effective levels 1-5 for feature rows `X` whose general-model levels are `general_levels`."""
        X = np.asarray(X)
        if len(X) == 0:
            return np.zeros(0, dtype=int)
        gl = np.asarray(general_levels, dtype=int)
        return decide_levels(self.probs(X), self.under_weight, gl, self.floor(X, gl))

    # -- files -------------------------------------------------------------------------------
    def save(self, out_dir: Path) -> Path:
        """Write atomically: a temporary folder renamed into place."""
        out_dir = Path(out_dir)
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        arrays = {"mean": self.mean, "scale": self.scale, "W": self.W, "b": self.b}
        if self.W1 is not None:
            arrays.update(W1=self.W1, b1=self.b1)
        if self.trees is not None:
            arrays.update(self.trees.arrays())
        np.savez(tmp / ADAPTER_FILE, **arrays)
        meta = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("mean", "scale", "W", "b", "W1", "b1", "trees")}
        (tmp / ADAPTER_META).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
        return out_dir

    @classmethod
    def load(cls, path: Path) -> "SiteAdapter":
        path = Path(path)
        meta = json.loads((path / ADAPTER_META).read_text(encoding="utf-8"))
        with np.load(path / ADAPTER_FILE) as z:
            arrays = {k: z[k] for k in ("mean", "scale", "W", "b", "W1", "b1") if k in z.files}
            trees = TreeHead.from_arrays(z, meta["hidden"]) if "tree_mean" in z.files else None
        a = cls(**arrays, **meta, trees=trees)
        if a.head in ("trees", "blend") and (a.trees is None or (a.head == "blend" and not a.part_temperatures)):
            raise ValueError(f"adapter at {path} is malformed (head {a.head} without its trees)")
        d_in = len(a.mean) if a.W1 is None else a.W1.shape[1]
        if a.W.shape != (d_in, 5) or a.b.shape != (5,) or (a.W1 is not None and a.W1.shape[0] != len(a.mean)):
            raise ValueError(f"adapter at {path} is malformed (weights {a.W.shape})")
        return a


def _standardise(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = X.mean(axis=0)
    scale = X.std(axis=0)
    return mean, np.where(scale < 1e-3, 1.0, scale)


def check_log(y: np.ndarray, min_per_level: int) -> None:
    """Refuse a relabel log that cannot teach five levels (clear message, nothing fitted)."""
    y = np.asarray(y, dtype=int)
    counts = {lv: int((y == lv).sum()) for lv in range(1, 6)}
    present = [lv for lv, c in counts.items() if c]
    if len(present) <= 1:
        raise AdaptError(f"all {len(y)} relabels are level {present[0] if present else '-'}: an adapter needs examples "
                         "of every level (nothing was changed)")
    few = {lv: c for lv, c in counts.items() if c < min_per_level}
    if few:
        raise AdaptError(f"too few relabels per level: need at least {min_per_level} of each level 1-5, have "
                         + ", ".join(f"level {lv}: {c}" for lv, c in few.items()) + " (nothing was changed)")


def fit_adapter(X: np.ndarray, y: np.ndarray, general_levels: np.ndarray, hidden: int, *, budget: float | None = None,
                folds: int = 5, seed: int = 0, min_per_level: int = 5, general_fingerprint: str = "",
                head: str = "logistic", progress: ProgressFn | None = None) -> SiteAdapter:
    """Fit on training rows only (see module docstring). `y`, `general_levels`: levels 1-5.
    `head`: "logistic" (L2 from `L2_GRID`), "mlp" (weight decay and epochs from `MLP_GRID`)
    or "auto" (logistic, trees or their blend); every setting, and the head for "auto",
    chosen by inner-fold log-loss."""
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, not {head!r}")
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=int)
    gl = np.asarray(general_levels, dtype=int)
    check_log(y, min_per_level)
    mean, scale = _standardise(X)
    Z = (X - mean) / scale
    t = y - 1
    fold = stratified_folds(y, folds, seed)
    use_trees = head == "auto" and len(y) >= TREE_MIN_ROWS and trees_available()
    if head == "mlp":
        grid = [("mlp", g) for g in MLP_GRID]
    else:  # L2: strongest first, each warm-starting the next
        grid = [("logistic", g) for g in sorted(L2_GRID, reverse=True)] + [("trees", g) for g in (TREE_GRID if use_trees else ())]
    oof = {g: np.zeros((len(y), 5)) for g in grid}
    total, done = folds * len(grid) + 1, 0
    for f in range(folds):
        tr, te = fold != f, fold == f
        m, s = _standardise(X[tr])  # inner folds standardise on their own training part
        Ztr, Zte, start = (X[tr] - m) / s, (X[te] - m) / s, None
        for g in grid:
            kind, v = g
            if kind == "logistic":
                W, b = start = fit_logistic(Ztr, t[tr], v, start=start)
                oof[g][te] = Zte @ W + b
            elif kind == "mlp":
                oof[g][te] = _mlp_logits(Zte, fit_mlp(Ztr, t[tr], v[0], v[1], seed=seed))
            else:
                oof[g][te] = fit_trees(X[tr], t[tr], hidden, v[0], v[1], seed=seed).logits(X[te])
            done += 1
            if progress:
                progress("fit adapter", done, total)
    nll = {g: _nll(oof[g], t) for g in grid}
    best = {kind: min((g for g in grid if g[0] == kind), key=lambda g: nll[g]) for kind in {g[0] for g in grid}}
    # candidate heads, compared by inner log-loss after each one's own temperature
    cand = {kind: oof[g] for kind, g in best.items()}
    part_t = None
    if "trees" in best:
        part_t = [fit_temperature(cand["logistic"], t), fit_temperature(cand["trees"], t)]
        cand["blend"] = _blend(cand["logistic"], cand["trees"], *part_t)
    cal_nll = {kind: _nll(z / fit_temperature(z, t), t) for kind, z in cand.items()}
    chosen = min(cal_nll, key=cal_nll.get)
    temperature = fit_temperature(cand[chosen], t)
    probs = softmax(cand[chosen], temperature)
    gp = np.exp(X[:, hidden:hidden + 5])
    fa = X[:, hidden + 5 + VITALS_NAMES.index("floor_A")] > 0.5
    floor = general_floor_mask(gp, fa, gl, FLOOR_CONFIDENCE)
    general_under = under_triage_12(y, gl)
    bud = general_under if budget is None else float(budget)
    w, table = choose_under_weight(probs, y, gl, floor, bud)
    W1 = b1 = trees = None
    W, b = np.zeros((X.shape[1], 5)), np.zeros(5)
    if chosen in ("logistic", "blend"):
        W, b = fit_logistic(Z, t, best["logistic"][1])
    elif chosen == "mlp":
        W1, b1, W, b = fit_mlp(Z, t, best["mlp"][1][0], best["mlp"][1][1], seed=seed)
    if chosen in ("trees", "blend"):
        trees = fit_trees(X, t, hidden, best["trees"][1][0], best["trees"][1][1], seed=seed)
    if progress:
        progress("fit adapter", total, total)
    oof_levels = decide_levels(probs, w, gl, floor)
    mlp_cfg = best["mlp"][1] if "mlp" in best else None
    info = {
        "n_train": int(len(y)), "counts": [int((y == lv).sum()) for lv in range(1, 6)], "head": chosen, "head_asked": head,
        "l2": best["logistic"][1] if "logistic" in best and chosen != "trees" else None,
        "mlp": None if mlp_cfg is None else {"hidden": MLP_HIDDEN, "weight_decay": mlp_cfg[0], "epochs": mlp_cfg[1]},
        "trees": None if chosen not in ("trees", "blend") else {"pca": best["trees"][1][0], "depth": best["trees"][1][1]},
        "inner_folds": folds, "inner_nll": {f"{k}:{v}": round(x, 5) for (k, v), x in nll.items()},
        "inner_nll_calibrated": {k: round(v, 5) for k, v in cal_nll.items()},
        "budget_under_triage_1_2": bud, "budget_from": "general" if budget is None else "given",
        "general_under_triage_1_2_train": general_under, "under_weight_table": table,
        "oof": {"accuracy": float((oof_levels == y).mean()), "under_triage_1_2": under_triage_12(y, oof_levels),
                "ece_uncalibrated": expected_calibration_error(softmax(cand[chosen], 1.0), t),
                "ece": expected_calibration_error(probs, t)},
    }
    return SiteAdapter(mean=mean, scale=scale, W=W, b=b, W1=W1, b1=b1, temperature=float(temperature), under_weight=float(w),
                       hidden=hidden, head=chosen, trees=trees, part_temperatures=None if chosen != "blend" else [float(x) for x in part_t],
                       general_fingerprint=general_fingerprint, info=info)


def compare(gold, adapted, current, general) -> dict:
    """Held-out figures of the adapted, current and general decisions (levels 1-5)."""
    gold = np.asarray(gold, dtype=int)
    out = {}
    for name, pred in (("adapted", adapted), ("current", current), ("general", general)):
        r = urgency_report(gold, np.asarray(pred, dtype=int))
        out[name] = {k: r[k] for k in ("n", "accuracy", "under_triage_1_2", "level1_recall", "over_triage", "within_one", "confusion")}
    return out


def promotion_verdict(fig: dict) -> tuple[bool, str]:
    """Promote only if the adapted decisions beat the current model's accuracy on the held-out
    rows and do not raise under-triage of levels 1-2 above the general model's."""
    a, c, g = fig["adapted"], fig["current"], fig["general"]
    if a["under_triage_1_2"] is not None and g["under_triage_1_2"] is not None and a["under_triage_1_2"] > g["under_triage_1_2"] + 1e-12:
        return False, (f"refused: under-triage of levels 1-2 on the held-out relabels {a['under_triage_1_2']:.3f} is above "
                       f"the general model's {g['under_triage_1_2']:.3f}")
    if not a["accuracy"] > c["accuracy"]:
        return False, f"refused: held-out accuracy {a['accuracy']:.3f} does not beat the current model's {c['accuracy']:.3f}"
    return True, (f"passes: held-out accuracy {a['accuracy']:.3f} > current {c['accuracy']:.3f}; under-triage of 1-2 "
                  f"{a['under_triage_1_2']:.3f} <= general {g['under_triage_1_2']:.3f}")
