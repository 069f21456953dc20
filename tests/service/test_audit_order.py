"""GET /audit/order and `triage db order`: was the most urgent call served first? Read off the
audit trail, and able to tell our scheduler from an FCFS engine on the same burst."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from typer.testing import CliRunner

from serving.cli import app

from conftest import Server, chat, make_keys, make_settings

SEATS_FULL = 40      # the CPU engine profile's 32 seats, and 8 calls waiting for one


def burst_then_urgent(srv) -> None:
    """40 level-5 calls at once (answers of 16-55 tokens: the seats free one at a time), then
    3 ESI-1 calls 0.5 s later, while 8 level-5 calls wait for a seat."""
    with srv.client(srv.keys["operator"]) as c, ThreadPoolExecutor(SEATS_FULL + 3) as pool:
        def post(level, n):
            r = chat(c, "what are the opening hours of the pharmacy", priority=level, max_tokens=n, ignore_eos=True)
            assert r.status_code == 200, r.text
        low = [pool.submit(post, 5, 16 + i) for i in range(SEATS_FULL)]
        time.sleep(0.5)
        urgent = [pool.submit(post, 1, 16) for _ in range(3)]
        for f in low + urgent:
            f.result()


@pytest.mark.parametrize("policy", ["triage", "fcfs"])
def test_the_order_check_shows_esi1_served_first_by_triage_and_overtaken_under_fcfs(db_url, tmp_path, predictors_dir,
                                                                                    policy):
    keys = make_keys(db_url)
    s = make_settings(db_url, tmp_path, predictors_dir, profile="vllm-cpu-smollm2", policy=policy,
                      max_inflight=512, sim_speed=2.0)
    with Server(s) as srv:
        srv.keys = keys
        burst_then_urgent(srv)
        with srv.client(keys["auditor"]) as a:
            rep = a.get("/audit/order", params={"tolerance_s": 0.3}).json()
            assert a.get("/audit/order", params={"tolerance_s": -1}).status_code in (400, 422)
            assert a.get("/audit/order", params={"since": "yesterday"}).status_code == 400
        with srv.client(keys["client"]) as c:
            assert c.get("/audit/order").status_code == 403
    # the same check offline on the database (exit 1 when an ESI-1 call was overtaken)
    cli = CliRunner().invoke(app, ["db", "order", "--db", db_url, "--tolerance", "0.3", "--json"])
    assert cli.exit_code == (0 if rep["ok"] else 1), cli.output
    offline = json.loads(cli.output.strip().splitlines()[-1])
    assert {k: offline[k] for k in ("calls", "inversions", "per_level")} == {k: rep[k] for k in ("calls", "inversions", "per_level")}
    assert rep["calls"] == SEATS_FULL + 3 and rep["esi1"]["calls"] == 3 and rep["truncated"] is False
    if policy == "triage":   # each ESI-1 call takes a seat from a level-5 call at once
        assert rep["ok"] is True and rep["inversions"] == 0, rep["worst"][:3]
    else:                    # FCFS starts the 8 level-5 calls that were waiting first, one a step
        assert rep["ok"] is False and rep["esi1"]["overtaken"] == 3
        # ... by calls that were there first: FCFS keeps the arrival order, it ignores urgency
        assert rep["esi1"]["overtaken_by_later"] == 0 and rep["inversions_by_later"] == 0
        # each at least by those 8 (by more where the front end was still classifying the burst)
        by = rep["per_level"]["1"]["overtaken_by_levels"]
        assert set(by) == {"5"} and by["5"] >= 3 * (SEATS_FULL - 32)
        w = rep["worst"][0]
        assert w["level"] == 1 and w["first_overtaker"]["level"] == 5 and w["waited_after_s"] > 0


def test_db_order_refuses_what_it_cannot_read(tmp_path):
    run = CliRunner().invoke
    r = run(app, ["db", "order", "--db", f"sqlite:///{tmp_path / 'none.db'}"])
    assert r.exit_code == 2 and "no database at" in r.output
    r = run(app, ["db", "order", "--db", f"sqlite:///{tmp_path / 'none.db'}", "--since", "yesterday"])
    assert r.exit_code == 2 and "ISO 8601 or UNIX seconds" in r.output
