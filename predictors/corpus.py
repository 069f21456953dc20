"""The project's own triage corpus (`data/triage/corpus.jsonl`) and its length labels."""
from __future__ import annotations

import json
from pathlib import Path

from triage.paths import data_dir

LEVELS = (1, 2, 3, 4, 5)
SPLITS = ("train", "validation", "test")


def corpus_path() -> Path:
    return data_dir() / "triage" / "corpus.jsonl"


def length_labels_path() -> Path:
    return data_dir() / "triage" / "length_labels.jsonl"


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_corpus(split: str | None = None) -> list[dict]:
    """Rows `{"id", "text", "level", "split", "style", "rule", "kind"}`, optionally one split.
    `kind` is "dispatch" or "non_dispatch" (revision 4: chat, writing, code, trivia,
    paperwork and health questions that describe no emergency; labelled 5)."""
    path = corpus_path()
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python data/triage/build_corpus.py`")
    rows = _read_jsonl(path)
    if split is not None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        rows = [r for r in rows if r["split"] == split]
    return rows


def load_length_label_rows() -> dict[str, dict]:
    """Corpus id -> `{"id", "prompt_tokens", "output_tokens", "finish_reason"}`."""
    path = length_labels_path()
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m predictors.length_labels`")
    return {r["id"]: r for r in _read_jsonl(path)}


def load_length_labels() -> dict[str, int]:
    """Corpus id -> output tokens of the served model (see `predictors.length_labels`)."""
    return {k: int(r["output_tokens"]) for k, r in load_length_label_rows().items()}


def length_labels_meta() -> dict:
    """The label file's sidecar (`length_labels.meta.json`): how the labels were generated
    (`label_sampling`), how many, and the fraction that hit the token cap. Empty if absent."""
    path = length_labels_path().with_name("length_labels.meta.json")
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
