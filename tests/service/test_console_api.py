"""The console's API without a browser: latency series against /audit/latency, class
history and roll-back errors, the history log's search, prompts hidden from auditors.
(The pages themselves: test_console_browser.py, in Chromium.)"""
from __future__ import annotations

import math
import time

import pytest

from tests.service.conftest import Server, chat, make_keys, make_settings


@pytest.fixture(scope="module")
def svc(tmp_path_factory, predictors_dir):
    from serving.bench.ui import seed_audit, synthetic_rows

    tmp = tmp_path_factory.mktemp("console_api")
    url = f"sqlite:///{tmp / 'c.db'}"
    rows = synthetic_rows(time.time() - 7200, hours=1.0, n=120, seed=3, prefix="api")
    seed_audit(url, rows, tmp / "seed-spool.jsonl")
    keys = make_keys(url)
    with Server(make_settings(url, tmp, predictors_dir, store_prompts=True)) as srv:
        srv.keys, srv.rows = keys, rows
        yield srv


def test_each_series_bucket_equals_the_latency_report_of_its_window(svc):
    t0 = min(r["arrival"] for r in svc.rows)
    t1 = max(r["arrival"] for r in svc.rows) + 1
    with svc.client(svc.keys["auditor"]) as c:
        s = c.get("/audit/latency/series", params={"since": t0, "until": t1, "bucket_s": 600}).json()
        assert s["requests"] == len(svc.rows) and len(s["series"]) == math.ceil((t1 - t0) / 600)
        assert sum(g["count"] for b in s["series"] for g in b["groups"]) == len(svc.rows)
        for b in s["series"]:
            rep = c.get("/audit/latency", params={"since": repr(b["start"]), "until": repr(b["end"])}).json()
            assert rep["groups"] == b["groups"]
        shed = sum(r["outcome"] == "shed" for r in svc.rows)
        errored = sum(r["outcome"] == "error" for r in svc.rows)
        assert sum(g["shed"] for b in s["series"] for g in b["groups"]) == shed
        assert sum(g["errored"] for b in s["series"] for g in b["groups"]) == errored
        csv = c.get("/audit/latency/series", params={"since": t0, "until": t1, "bucket_s": 600, "format": "csv"}).text
        assert len(csv.strip().splitlines()) == 1 + sum(len(b["groups"]) for b in s["series"])
        assert c.get("/audit/latency/series", params={"since": t1, "until": t0}).status_code == 400
        assert c.get("/audit/latency/series", params={"since": 0, "until": t1, "bucket_s": 1}).status_code == 400
    with svc.client(svc.keys["operator"]) as c:
        assert c.get("/audit/latency/series").status_code == 403


def test_class_edits_are_validated_versioned_and_rolled_back(svc):
    with svc.client(svc.keys["operator"]) as c:
        cur = c.get("/admin/classes").json()
        assert 0 < cur["escalate_below"] <= 1
        body = {"classes": cur["classes"], "escalate_below": 1.5}
        r = c.put("/admin/classes", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "escalate_below"
        bad = [dict(x) for x in cur["classes"]]
        bad[0]["tpot"] = 0
        assert c.put("/admin/classes", json={"classes": bad}).status_code == 400
        assert c.post("/admin/classes/rollback", json={"version": 999}).status_code == 404
        edited = [dict(x) for x in cur["classes"]]
        edited[1]["weight"] = edited[1]["weight"] * 2
        v = c.put("/admin/classes", json={"classes": edited, "escalate_below": 0.3, "reason": "api test"}).json()
        assert v["version"] == cur["version"] + 1 and v["escalate_below"] == 0.3
        assert svc.state.predictor.predictor.escalate_below == 0.3
        back = c.post("/admin/classes/rollback", json={"version": cur["version"]}).json()
        assert back["version"] == cur["version"] + 2 and back["classes"] == cur["classes"]
        assert back["escalate_below"] == cur["escalate_below"] == svc.state.predictor.predictor.escalate_below
    with svc.client(svc.keys["auditor"]) as c:
        h = c.get("/admin/classes/history").json()
        assert [v["version"] for v in h["versions"][:3]] == [cur["version"] + 2, cur["version"] + 1, cur["version"]]
        assert h["versions"][1]["reason"] == "api test" and h["versions"][1]["actor"].startswith("operator:")
        assert c.put("/admin/classes", json={"classes": cur["classes"]}).status_code == 403   # auditors read only
        log = c.get("/admin/history", params={"q": "api test", "kind": "classes"}).json()
        assert log["count"] == 1 and log["entries"][0]["audit_event_id"] is not None
        assert any(x.startswith("L2 weight") for x in log["entries"][0]["changes"])
        assert c.get("/admin/history", params={"kind": "nope"}).status_code == 400


def test_auditors_never_see_a_stored_prompt(svc):
    with svc.client(svc.keys["operator"]) as c:
        r = chat(c, "Pelicanbrook caller asks where to park", max_tokens=2)
        rid = r.json()["id"]
    svc.state.writer.sync(10)
    with svc.client(svc.keys["auditor"]) as c:
        rec = c.get(f"/audit/requests/{rid}").json()["request"]
        assert rec["prompt"] is None and rec["prompt_redacted"] is True
        assert "Pelicanbrook" not in c.get("/audit/export").text
    with svc.client(svc.keys["admin"]) as c:
        assert "Pelicanbrook" in c.get(f"/audit/requests/{rid}").json()["request"]["prompt"]
