"""Where the project's shipped data and its local state live.

`data_dir()` is the committed `data/` folder; `state_dir()` holds what is made on a
machine and never committed (converted models, trained predictors, the SQLite file).
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    return REPO_ROOT / "data"


def state_dir() -> Path:
    """`$TRIAGE_HOME`, else `.triage/` in the checkout (git-ignored)."""
    env = os.environ.get("TRIAGE_HOME")
    return Path(env) if env else REPO_ROOT / ".triage"


def shared_datasets_dir() -> Path:
    """The read-only shared datasets beside the checkout (never copied into the repo)."""
    env = os.environ.get("TRIAGE_DATASETS")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "datasets"
