"""The project's triage corpus (data/triage/): size, levels, splits, labelling invariants,
revision 4's non-dispatch texts, and that the committed file is exactly what its generator
writes."""
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
    assert {r["style"] for r in rows if r["kind"] == "dispatch"} == {"nurse", "lay", "dispatch", "nonnative", "typo", "casual"}
    assert {r["kind"] for r in rows} == {"dispatch", "non_dispatch"}


NON_DISPATCH_STYLES = {"writing", "code", "trivia", "admin", "chat", "metaphor", "health_info"}


def test_revision_4_keeps_every_earlier_row():
    """Revision 4 appends; the 2,810 rows of revision 3 keep id, text, split and style (the
    hash of those fields as committed at revision 3) and gain kind "dispatch"; their level
    and rule are revision 3's (hash of id, text, level, split, style, rule: 004bb47d511872b5
    at revision 4) except where revision 5 relabelled a row 1 (below)."""
    import hashlib
    import json

    rows = load_corpus()[:2810]
    fields = ("id", "text", "split", "style")
    digest = hashlib.sha256(json.dumps([[r[k] for k in fields] for r in rows]).encode()).hexdigest()[:16]
    assert digest == "b10b25e08da8faee"
    assert all(r["kind"] == "dispatch" for r in rows)
    assert Counter(r["rule"] for r in rows if r["rule"].endswith("(rev5)")) == {"A:SpO2<90(rev5)": 13}


def test_revision_5_relabels_level_1_readings_and_adds_awake_level_1_patients():
    """Revision 5: a text whose vitals meet ESI decision point A (SpO2 < 90 since revision 5)
    is labelled 1; 180 level-1 patients who are awake (alert or confused, not the
    unresponsive patients of every earlier level-1 nurse message) are appended in the
    dispatch styles, every style in every split; the non-dispatch rows are untouched."""
    rows = load_corpus()
    assert [r["id"] for r in rows if r["level"] > 1 and safety_floor(parse_vitals(r["text"]), r["level"]).level == 1] == []
    relabelled = [r for r in rows if r["rule"] == "A:SpO2<90(rev5)"]
    assert len(relabelled) == 13 and all(r["level"] == 1 and parse_vitals(r["text"]).spo2 < 90 for r in relabelled)
    awake = rows[3510:]
    assert len(awake) == 180 and all(r["level"] == 1 and r["kind"] == "dispatch" for r in awake)
    assert all(r["rule"] == "A:life-saving-intervention(awake,rev5)" for r in awake)
    for split in ("train", "validation", "test"):
        assert {r["style"] for r in awake if r["split"] == split} == {"nurse", "dispatch", "lay", "nonnative", "typo"}
    nurse = [r for r in awake if r["style"] == "nurse"]
    assert all(parse_vitals(r["text"]).avpu in ("A", "V") for r in nurse)


def test_non_dispatch_texts_are_level_5_in_every_split_and_trip_no_floor():
    rows = load_corpus()
    nd = [r for r in rows if r["kind"] == "non_dispatch"]
    assert len(nd) >= 500
    assert {r["style"] for r in nd} == NON_DISPATCH_STYLES
    assert all(r["level"] == 5 and r["rule"] == "N:non-dispatch" for r in nd)
    for split in ("train", "validation", "test"):
        styles = Counter(r["style"] for r in nd if r["split"] == split)
        assert set(styles) == NON_DISPATCH_STYLES and min(styles.values()) >= 10, (split, styles)
    # the ESI floors read no vital sign in them, whatever level the model says
    assert [r["text"] for r in nd if parse_vitals(r["text"]).any()] == []
    # casual emergencies: real dispatch requests in the same off-topic framing, still 1-2
    casual = [r for r in rows if r["style"] == "casual"]
    assert len(casual) >= 60 and {r["level"] for r in casual} == {1, 2} and all(r["kind"] == "dispatch" for r in casual)
    assert {r["split"] for r in casual} == {"train", "validation", "test"}


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
