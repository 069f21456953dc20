"""`triage bench reproduce --seed S`: each seed paper's headline experiment, replayed in
the simulator as closely as our traces and profiles allow (simulation results).

    run(seed) -> {"seed", "rows": [{"metric", "paper", "ours", "setup"}, ...], ...per-seed extras}
    plot(result, path) -> PNG

One module per seed (seed000 ... seed004); docs/reproduction.md holds the tables.
"""
from __future__ import annotations

from pathlib import Path

from triage.sim.reproduce import seed000, seed001, seed002, seed003, seed004
from triage.sim.reproduce.common import Progress, strip

SEEDS = {"000": seed000, "001": seed001, "002": seed002, "003": seed003, "004": seed004}


def run(seed: str, *, quick: bool = False, progress: Progress = None) -> dict:
    if seed not in SEEDS:
        raise ValueError(f"unknown seed {seed!r}; seeds: {', '.join(SEEDS)}")
    out = SEEDS[seed].run_seed(quick=quick, progress=progress)
    out["simulated"] = True
    out["quick"] = quick
    return _clean(out)


def _clean(x):
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in strip(x).items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, float):
        return round(x, 6)
    return x


def plot(result: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from triage.sim.figure import save_figure

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    SEEDS[result["seed"]].plot(result, ax)
    return save_figure(fig, path)
