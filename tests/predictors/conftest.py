"""Fixtures for the predictor tests.

`trained_home` is a TRIAGE_HOME holding both predictors: the ones `triage train all`
made in the state dir when present, otherwise small ones trained here (a few hundred
corpus rows, one epoch; about a minute on 2 cores). No file name here may shadow the
`predictors` package, so this folder has no __init__.py and test files are prefixed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _have(home: Path) -> bool:
    return all((home / "predictors" / k / "triage_meta.json").exists() for k in ("urgency", "length"))


@pytest.fixture(scope="session")
def trained_home(tmp_path_factory) -> Path:
    from triage.paths import state_dir

    real = state_dir()
    if _have(real):
        return real
    from predictors.train import TrainConfig, train_length, train_urgency

    home = tmp_path_factory.mktemp("triage_home")
    cfg = TrainConfig(epochs=1, limit=320, seed=0)
    train_urgency(home / "predictors" / "urgency", cfg)
    train_length(home / "predictors" / "length", TrainConfig.length_head(limit=320, seed=0))
    return home


@pytest.fixture(scope="session")
def predictor(trained_home):
    from predictors.service import Predictor

    return Predictor(trained_home / "predictors" / "urgency", trained_home / "predictors" / "length", threads=2)


@pytest.fixture()
def home_env(trained_home, monkeypatch):
    monkeypatch.setenv("TRIAGE_HOME", str(trained_home))
    return trained_home


@pytest.fixture(scope="session")
def shipped():
    """The shipped predictors (what `triage train all` makes in the state dir; trained here
    with the full recipe if missing, which takes several minutes on 2 cores)."""
    from predictors.model import META_FILE, default_model_dir
    from predictors.service import Predictor
    from predictors.train import train_length, train_urgency

    if not (default_model_dir("urgency") / META_FILE).exists():
        train_urgency()
    if not (default_model_dir("length") / META_FILE).exists():
        train_length()
    return Predictor()


@pytest.fixture(scope="session")
def baked_home(trained_home, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A home as training leaves it (the weights, no ONNX graph), after `triage train all
    --if-missing` (the setup script's step, which makes the graph: fp32 and, where it passes
    its check, int8) ran on it: (the home, that run). Made once: making the graph is the
    costliest step of these tests (an export, a quantisation and their checks)."""
    home = tmp_path_factory.mktemp("baked") / "home"
    shutil.copytree(trained_home / "predictors", home / "predictors", ignore=shutil.ignore_patterns("onnx-*"))
    assert not list(home.rglob("onnx-*"))
    return home, train_all_if_missing(home)


def train_all_if_missing(home: Path) -> subprocess.CompletedProcess:
    """`triage train all --if-missing` (the setup script's step) on the predictors' home `home`."""
    from triage.paths import REPO_ROOT

    return subprocess.run([sys.executable, "-m", "serving.cli", "train", "all", "--if-missing"], cwd=REPO_ROOT,
                          env={**os.environ, "TRIAGE_HOME": str(home)}, capture_output=True, text=True, timeout=600)
