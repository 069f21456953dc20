"""The project's triage corpus (data/triage/): size, levels, splits, labelling invariants,
and that the committed file is exactly what its generator writes."""
from __future__ import annotations

import importlib.util
from collections import Counter

from predictors.corpus import corpus_path, load_corpus, load_length_labels
from predictors.vitals import parse_vitals, safety_floor


def test_size_levels_and_splits_as_the_issue_asks():
    rows = load_corpus()
    assert len(rows) >= 2000
    assert len({r["id"] for r in rows}) == len(rows)
    per_level = Counter(r["level"] for r in rows)
    assert set(per_level) == {1, 2, 3, 4, 5} and min(per_level.values()) >= 150, per_level
    for split in ("train", "validation", "test"):
        levels = Counter(r["level"] for r in rows if r["split"] == split)
        assert set(levels) == {1, 2, 3, 4, 5} and min(levels.values()) >= 20, (split, levels)
    assert {r["style"] for r in rows} == {"nurse", "lay", "dispatch", "nonnative", "typo"}


def test_every_danger_zone_label_shows_its_reading():
    """Revision 3: a message labelled 2 by ESI decision point D shows the vital sign that
    puts it there (the explicit floors, run on the text as written, make a level-3
    candidate a 2); before, 17 such rows had the reading left out of their vitals line."""
    d_rows = [r for r in load_corpus() if r["rule"].startswith("D:")]
    assert len(d_rows) >= 150
    hidden = [r["id"] for r in d_rows if safety_floor(parse_vitals(r["text"]), 3).level > 2]
    assert hidden == []
    assert all(r["level"] == 2 for r in d_rows)


def test_committed_corpus_is_what_the_generator_writes():
    spec = importlib.util.spec_from_file_location("build_corpus", corpus_path().parent / "build_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.corpus_rows() == load_corpus()


def test_length_labels_belong_to_corpus_rows():
    ids = {r["id"] for r in load_corpus()}
    labels = load_length_labels()
    assert len(labels) >= 1000 and set(labels) <= ids
    assert all(0 < n <= 512 for n in labels.values())
