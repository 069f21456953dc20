"""The audit writer's journal on its own (serving/db/journal.py): it stays small under
steady traffic, keeps what is open through a compaction, and reads past a torn last line."""
from __future__ import annotations

from serving.db.journal import Journal


def _rec(rid: str) -> dict:
    return {"kind": "request.finished", "at": 1.0, "actor": None, "request_id": rid, "payload": {},
            "table": "requests", "rows": [{"id": rid, "arrival": 1.0, "effective_level": 2}]}


def test_steady_traffic_keeps_the_journal_small_and_what_is_open_survives_compaction(tmp_path):
    path = tmp_path / "j"
    j = Journal(path, compact_bytes=20_000)
    assert j.open() == ([], [])
    for i in range(2000):   # accepted, first token, finished, made durable: over and over
        j.accepted(f"r{i}", float(i), {"id": f"r{i}", "arrival": float(i), "effective_level": 3})
        j.first_token(f"r{i}", i + 0.1)
        j.record(i, _rec(f"r{i}"))
        if i % 50 == 49:
            j.durable(i)
    j.accepted("open-1", 5000.0, {"id": "open-1", "arrival": 5000.0, "effective_level": 1})
    j.first_token("open-1", 5000.5)
    j.record(2000, _rec("r1999-late"))   # handed to the writer, not yet durable
    j.durable(1999)                      # compacts: the file holds what is open
    assert path.stat().st_size < 20_000 + 2_000
    j2 = Journal(path)
    j.close()
    pending, orphans = j2.open()
    assert [r["request_id"] for r in pending] == ["r1999-late"]
    assert [(o.row["id"], o.first_token) for o in orphans] == [("open-1", 5000.5)]
    assert orphans[0].last_seen == 5000.5
    j2.close()


def test_a_line_cut_short_by_the_crash_is_skipped(tmp_path):
    path = tmp_path / "j"
    j = Journal(path)
    j.open()
    j.accepted("a", 1.0, {"id": "a", "arrival": 1.0, "effective_level": 2})
    j.accepted("b", 2.0, {"id": "b", "arrival": 2.0, "effective_level": 4})
    j.close()
    path.write_bytes(path.read_bytes()[:-9])   # the second line torn mid-write
    pending, orphans = Journal(path).open()
    assert pending == [] and [o.row["id"] for o in orphans] == ["a"]


def test_a_clean_stop_leaves_an_empty_journal(tmp_path):
    path = tmp_path / "j"
    j = Journal(path)
    j.open()
    j.accepted("a", 1.0, {"id": "a", "arrival": 1.0, "effective_level": 2})
    j.record(0, _rec("a"))
    j.durable(0)
    j.close()
    assert path.stat().st_size == 0
