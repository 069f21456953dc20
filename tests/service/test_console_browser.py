"""The operator console in real Chromium (Debian's chromium + chromedriver through Selenium),
against a live service (simulated backend: the engine is not the point here), its real
predictors and a real SQLite audit database seeded with synthetic finished requests.

Skipped without Chromium, unless TRIAGE_REQUIRE_BROWSER=1 (CI), where it fails instead.
One service and one browser serve the whole module; the tests run in file order.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.service.conftest import Server, make_keys, make_settings

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# operator-set levels keep the queue deterministic; each text carries a word found nowhere else
BLOCKER = "Zanzibarquokka blocker: long routine summary of the depot rota for next month"
WAITING = [f"Marmalade{i}ferret asks about the parking permit renewal at the north depot" for i in range(3)]
MARKERS = ["Zanzibarquokka"] + [f"Marmalade{i}ferret" for i in range(3)]
SEED_HOURS_AGO = 3.0


def _browser(width=1280, height=720):
    from serving.bench.ui import BrowserMissing, chrome

    try:
        return chrome(width, height)
    except BrowserMissing as e:
        if os.environ.get("TRIAGE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"TRIAGE_REQUIRE_BROWSER=1 but {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def driver():
    d = _browser()
    yield d
    d.quit()


@pytest.fixture(scope="module")
def console(tmp_path_factory, predictors_dir):
    from serving.bench.ui import live_calls, seed_audit, synthetic_rows

    tmp = tmp_path_factory.mktemp("console")
    url_db = f"sqlite:///{tmp / 'console.db'}"
    seeded = synthetic_rows(time.time() - SEED_HOURS_AGO * 3600, hours=1.0, n=240, seed=7, prefix="seed")
    seed_audit(url_db, seeded, tmp / "seed-spool.jsonl")
    keys = make_keys(url_db)
    # one seat, 50x slower than the modelled GPU: the blocker runs for the whole module
    settings = make_settings(url_db, tmp, predictors_dir, max_inflight=1, sim_speed=0.02)
    with Server(settings) as srv:
        srv.keys, srv.seeded = keys, seeded
        live_calls(srv.url, keys["operator"], [BLOCKER], max_tokens=1500)
        _wait(lambda: _queue(srv, "operator")["running"], what="the blocker running")
        for t in WAITING:
            _post_async(srv, t, priority=4)
        _wait(lambda: len(_queue(srv, "operator")["waiting"]) == 3, what="three waiting calls")
        yield srv


def _post_async(srv, text, priority):
    import threading

    from serving.bench.ui import _call

    threading.Thread(target=_call, args=(srv.url, srv.keys["operator"], text, 8, [], priority), daemon=True).start()


def _queue(srv, role) -> dict:
    with srv.client(srv.keys[role]) as c:
        return c.get("/ui/api/queue").json()


def _wait(cond, timeout: float = 20.0, what: str = "condition"):
    from serving.bench.ui import wait

    return wait(cond, timeout=timeout, what=what)


def _sign_in(driver, srv, role, page=None):
    from serving.bench.ui import sign_in

    sign_in(driver, srv.url, srv.keys[role], page)


def _focused(driver, attr: str):
    """An attribute of the focused element. The queue redraws every poll and gives the focus
    to the new copy of the same control (`data-focus-key`), so the element read may be gone
    by the time its attribute is asked for: read the focused element again."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(20):
        try:
            return driver.switch_to.active_element.get_attribute(attr)
        except StaleElementReferenceException:
            time.sleep(0.05)
    raise AssertionError("the focused element went stale 20 times in a row")


def _css(driver, sel):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, sel)


def _first_history_entry(driver, attr: str) -> tuple[str | None, str]:
    """(`attr`, text) of the history page's first entry, found and read in one try."""
    def read():
        tr = _css(driver, "#history-rows tbody tr")[0]
        return tr.get_attribute(attr), tr.text

    return _wait(read, what="the first history entry")


# --- login and roles -----------------------------------------------------------------------
def test_a_client_key_gets_403(console, driver):
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(console.url + "/ui/login")
    driver.find_element(By.ID, "key").send_keys(console.keys["client"])
    driver.find_element(By.ID, "login").click()
    msg = _wait(lambda: driver.find_element(By.ID, "login-status").text, what="the refusal")
    assert "cannot use the operator console" in msg
    assert "/ui/login" in driver.current_url and not driver.get_cookies()
    with httpx.Client(base_url=console.url, timeout=30) as c:
        assert c.post("/ui/login", json={"key": console.keys["client"]}).status_code == 403
        assert c.post("/ui/login", json={"key": "tri_nope_nope"}).status_code == 401
        h = {"Authorization": f"Bearer {console.keys['client']}"}
        for path in ("/ui/queue", "/ui/api/queue", "/ui/api/me", "/admin/history", "/admin/classes/history"):
            assert c.get(path, headers=h).status_code == 403, path
        # without a session the pages send you to sign in
        r = c.get("/ui/queue", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")


def test_the_session_cookie_is_http_only_and_changes_need_the_csrf_token(console, driver):
    _sign_in(driver, console, "operator")
    [cookie] = [c for c in driver.get_cookies() if c["name"] == "triage_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert driver.execute_script("return document.cookie") == ""    # scripts cannot read it
    rid = _queue(console, "operator")["waiting"][0]["request_id"]
    with httpx.Client(base_url=console.url, timeout=30, cookies={"triage_session": cookie["value"]}) as c:
        assert c.get("/ui/api/me").json()["role"] == "operator"
        r = c.patch(f"/admin/requests/{rid}", json={"level": 3, "reason": "no csrf"})
        assert r.status_code == 403 and "x-triage-csrf" in r.json()["error"]["message"]


# --- live queue ----------------------------------------------------------------------------
def test_operator_sees_the_message_and_relabels_by_keyboard_and_the_row_moves(console, driver):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _sign_in(driver, console, "operator", "queue")
    # the queue redraws on every event of its stream (the blocker's token count moves), so an
    # element found may be replaced before it is read: each read finds and reads in one try
    # (`_wait` tries again on a stale element) and keeps plain values, never the elements

    def level4_rows():
        rows = _css(driver, '#waiting tbody[data-level="4"] tr[data-id]')
        return [(r.get_attribute("data-id"), r.find_element(By.CSS_SELECTOR, 'td[data-col="text"]').text)
                for r in rows] if len(rows) == 3 else None

    rows = _wait(level4_rows, what="three level-4 rows")
    assert sorted(text for _, text in rows) == sorted(WAITING)
    running = _wait(lambda: [r.text for r in _css(driver, "#running tr[data-id]")], what="the running call")
    assert len(running) == 1 and "Zanzibarquokka" in running[0]
    # the columns a dispatcher judges by: age, predicted vs effective, P(1..5), length, slack, instance, tokens
    head = _wait(lambda: [th.text for th in _css(driver, "#waiting thead th")], what="the queue's columns")
    for col in ("Age", "Predicted → effective", "P(level 1–5)", "Predicted length", "Slack to next deadline", "Instance",
                "Tokens so far", "Message"):
        assert col in head, head
    target = rows[-1][0]
    key = f"relabel:{target}"
    for _ in range(80):   # keyboard only: Tab to the row's Relabel button
        ActionChains(driver).send_keys(Keys.TAB).perform()
        if _focused(driver, "data-focus-key") == key:
            break
    else:
        raise AssertionError("Tab never reached the Relabel button")
    ActionChains(driver).send_keys(Keys.ENTER).perform()
    _wait(lambda: driver.find_element(By.ID, "relabel-dialog").get_attribute("open") is not None, what="the dialog")
    assert _focused(driver, "id") == "relabel-level"
    ActionChains(driver).send_keys("L2").perform()
    ActionChains(driver).send_keys(Keys.TAB).send_keys("caller now reports chest pain").perform()
    ActionChains(driver).send_keys(Keys.TAB, Keys.TAB).perform()
    assert _focused(driver, "id") == "relabel-submit"
    t0 = time.monotonic()
    ActionChains(driver).send_keys(Keys.ENTER).perform()
    sel = f'#waiting tbody[data-level="2"] tr[data-id="{target}"]'
    # the row's text is read inside the wait: the table may redraw between finding the row and reading it
    moved = _wait(lambda: "".join(r.text for r in _css(driver, sel)), timeout=5, what="the row under level 2")
    took = time.monotonic() - t0
    assert took < 2.0, f"the row took {took:.2f} s to move"
    assert "#1 in queue" in moved and "override" in moved
    assert "from level 4 to level 2" in driver.find_element(By.ID, "status").text
    # the dialog gave focus back to the same row's button
    assert _focused(driver, "data-focus-key") == key
    q = _queue(console, "operator")
    assert [r["request_id"] for r in q["waiting"] if r["level"] == 2] == [target]
    console.relabelled = target


def test_an_auditor_sees_no_message_text_anywhere(console, driver):
    _sign_in(driver, console, "auditor", "queue")
    _wait(lambda: len(_css(driver, "#waiting tr[data-id]")) == 3, what="the auditor's queue")
    assert not _css(driver, 'td[data-col="text"]')
    assert "Relabel" not in _wait(lambda: driver.find_element("id", "waiting").text, what="the queue")   # read-only
    pages = [a.get_attribute("href") for a in _css(driver, "#nav a")]
    assert [p.rsplit("/", 1)[1] for p in pages] == ["queue", "classes", "history", "latency", "audit", "models"]
    seen = []
    for p in pages + [f"{console.url}/ui/record?id={console.seeded[0]['id']}"]:
        driver.get(p)
        time.sleep(1.0)
        html = driver.page_source
        seen.append(p)
        for m in MARKERS:
            assert m not in html, f"{m} shown to an auditor on {p}"
    q = _queue(console, "auditor")
    assert q["text"] is False and all("text" not in r for r in q["waiting"] + q["running"])
    # the stream carries the same view (it never ends: read one event over a raw connection)
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", console.settings.port, timeout=10)
    conn.request("GET", "/ui/api/queue/stream", headers={"Authorization": f"Bearer {console.keys['auditor']}"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
    buf = b""
    while b"\ndata: " not in buf and len(buf) < 100000:
        buf += resp.read1(4096)
    conn.close()
    assert not any(m.encode() in buf for m in MARKERS)


# --- priority classes ----------------------------------------------------------------------
def _triage_level(srv, text) -> dict:
    with srv.client(srv.keys["operator"]) as c:
        return c.post("/v1/triage", json={"text": text}).json()


def test_a_class_edit_shows_in_the_history_takes_effect_and_rolls_back(console, driver):
    from selenium.webdriver.common.by import By

    mundane = "what time does the canteen open tomorrow morning"
    before = _triage_level(console, mundane)
    assert before["level"] > 2
    _sign_in(driver, console, "operator", "classes")
    v0 = int(_wait(lambda: _css(driver, "#version-rows tbody tr")[0].get_attribute("data-version"),
                   what="the version history"))
    old_ttft = float(driver.find_element(By.ID, "ttft-3").get_attribute("value"))
    # validation: a negative SLO is refused on the page, nothing is sent
    f = driver.find_element(By.ID, "ttft-3")
    f.clear()
    f.send_keys("-1")
    driver.find_element(By.ID, "review").click()
    assert "must be a number above 0" in driver.find_element(By.ID, "class-error").text
    assert f.get_attribute("aria-invalid") == "true"
    new_ttft = round(old_ttft * 0.5, 4)
    f.clear()
    f.send_keys(str(new_ttft))
    esc = driver.find_element(By.ID, "g-escalate_below")
    esc.clear()
    esc.send_keys("0.000001")
    driver.find_element(By.ID, "class-reason").send_keys("night shift: faster level 3")
    driver.find_element(By.ID, "review").click()
    diff = _wait(lambda: _css(driver, "#diff-table tbody tr"), what="the diff")
    cells = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")] for tr in diff]
    l3 = [c for c in cells if c[0] == "L3 TTFT SLO (s)"]
    assert len(l3) == 1 and float(l3[0][1]) == pytest.approx(old_ttft) and float(l3[0][2]) == pytest.approx(new_ttft), cells
    assert any(c[0].startswith("Escalation threshold") for c in cells)
    driver.find_element(By.ID, "save-classes").click()
    _wait(lambda: f"(version {v0 + 1})" in driver.find_element(By.ID, "cur-version").text, what="the new version")
    top = _wait(lambda: next((tr.text for tr in _css(driver, "#version-rows tbody tr")[:1]
                              if tr.get_attribute("data-version") == str(v0 + 1)), None), what="the new version's row")
    assert "operator:" in top and "night shift" in top and "in force" in top
    # it takes effect on the next request: the new SLO and the new threshold
    _post_async(console, "Quillfeather follow-up about the parking permit", priority=3)
    row = _wait(lambda: next((r for r in _queue(console, "operator")["waiting"] if r["level"] == 3), None),
                what="a new level-3 call")
    assert row["ttft_slo"] == pytest.approx(new_ttft)
    after = _triage_level(console, mundane)
    assert after["level"] <= 2 and any("escalate_below" in x for x in after["reasons"]), after
    # the history log shows the edit, searchable
    driver.get(console.url + "/ui/history")
    q = _wait(lambda: driver.find_element(By.ID, "h-q"), what="the search box")
    q.send_keys("night shift")
    driver.find_element(By.ID, "h-search").click()
    _wait(lambda: "1 entry" in driver.find_element(By.ID, "h-count").text, what="one match")
    kind, text = _first_history_entry(driver, "data-kind")
    assert kind == "classes"
    assert f"version {v0} → version {v0 + 1}" in text and "L3 ttft" in text and "event #" in text
    # and the relabel from the queue test, with who, from -> to, why and its audit event
    q = driver.find_element(By.ID, "h-q")
    q.clear()
    q.send_keys("chest pain")
    driver.find_element(By.ID, "h-search").click()
    _wait(lambda: "1 entry" in driver.find_element(By.ID, "h-count").text, what="the relabel")
    rid, text = _first_history_entry(driver, "data-request")
    assert rid == getattr(console, "relabelled", "(no relabel: the queue test above failed or did not run)")
    assert "level 4 → level 2" in text and "operator:" in text and "event #" in text
    # roll back to the version before, from its row
    driver.get(console.url + "/ui/classes")
    _wait(lambda: _css(driver, f'button.rollback[data-version="{v0}"]')[0].click() or True, what="the roll-back button")
    driver.find_element(By.ID, "rb-reason").send_keys("day shift again")
    driver.find_element(By.ID, "rb-submit").click()
    _wait(lambda: f"(version {v0 + 2})" in driver.find_element(By.ID, "cur-version").text, what="the rolled-back version")
    _wait(lambda: _css(driver, f'#version-rows tbody tr[data-version="{v0 + 2}"]'), what="its row")
    assert float(driver.find_element(By.ID, "ttft-3").get_attribute("value")) == pytest.approx(old_ttft)
    assert _triage_level(console, mundane)["level"] == before["level"]
    with console.client(console.keys["auditor"]) as c:
        h = c.get("/admin/classes/history").json()
    assert h["versions"][0]["reason"].startswith(f"roll back to version {v0}")
    assert h["versions"][0]["classes"] == next(v for v in h["versions"] if v["version"] == v0)["classes"]


# --- latency over the shift ----------------------------------------------------------------
def test_the_latency_charts_show_the_audit_figures(console, driver):
    from selenium.webdriver.common.by import By

    seeded = console.seeded
    t0 = min(r["arrival"] for r in seeded) - 1
    t1 = max(r["arrival"] for r in seeded) + 1
    _sign_in(driver, console, "auditor", "latency")
    _wait(lambda: _css(driver, "#charts canvas"), what="the first charts")
    driver.execute_script(
        "const [a, b] = arguments; document.getElementById('range').value = 'custom';"
        "document.getElementById('range').dispatchEvent(new Event('change'));"
        "document.getElementById('since').value = new Date(a * 1000).toISOString().slice(0, 16);"
        "document.getElementById('until').value = new Date(b * 1000).toISOString().slice(0, 16);"
        "document.getElementById('bucket').value = '900';", int(t0) - 60, int(t1) + 60)
    driver.find_element(By.ID, "apply").click()
    rows = _wait(lambda: (lambda r: r if len(r) >= 15 else None)(_css(driver, "#series-rows tbody tr[data-start]")),
                 what="the per-bucket table")
    with console.client(console.keys["auditor"]) as c:
        checked = 0
        for tr in rows:
            start, end, lv = float(tr.get_attribute("data-start")), float(tr.get_attribute("data-end")), int(tr.get_attribute("data-level"))
            rep = c.get("/audit/latency", params={"since": repr(start), "until": repr(end)}).json()
            g = next(x for x in rep["groups"] if x["level"] == lv)
            tds = tr.find_elements(By.TAG_NAME, "td")
            assert [int(td.text) for td in tds[2:7]] == [g["count"], g["served"], g["shed"], g["aborted"], g["errored"]]
            for td in tds[8:]:
                k, v = td.get_attribute("data-k"), td.get_attribute("data-v")
                assert (float(v) if v else None) == (pytest.approx(g[k]) if g[k] is not None else None), (k, start, lv)
            # and independently of the service: numpy on the seeded rows themselves
            mine = [r for r in seeded if start <= r["arrival"] < end and r["effective_level"] == lv]
            ttft = [r["ttft"] for r in mine if r["ttft"] is not None]
            assert len(mine) == g["count"]
            if ttft:
                assert float(tds[9].get_attribute("data-v")) == pytest.approx(np.percentile(ttft, 95), abs=1e-6)
            checked += 1
        assert checked == len(rows)
        # the page's own CSV link (its range: the minute-precise inputs) gives the same rows
        csv_rows = c.get(driver.find_element(By.ID, "csv").get_attribute("href")).text.strip().splitlines()
    assert len(csv_rows) - 1 == len(rows)
    # the charts draw the table's numbers (one series per level) on a non-blank canvas
    charts = driver.execute_script("return window.__triageCharts.map(c => ({metric: c.metric, data: c.data}))")
    ttft_chart = next(ch for ch in charts if ch["metric"] == "ttft_p95")
    table = {(float(tr.get_attribute("data-start")), int(tr.get_attribute("data-level"))):
             tr.find_elements(By.TAG_NAME, "td")[9].get_attribute("data-v") for tr in rows}
    levels = sorted({lv for _, lv in table})
    for i, x in enumerate(ttft_chart["data"][0]):
        for j, lv in enumerate(levels):
            want = table.get((float(x), lv))
            got = ttft_chart["data"][j + 1][i]
            assert (got is None and not want) or got == pytest.approx(float(want)), (x, lv)
    inked = driver.execute_script(
        "const c = document.querySelector('#charts canvas'); const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;")
    assert inked > 500


# --- audit and models ----------------------------------------------------------------------
def test_the_audit_page_verifies_the_chain_and_exports(console, driver):
    from selenium.webdriver.common.by import By

    _sign_in(driver, console, "auditor", "audit")
    state = _wait(lambda: driver.find_element(By.ID, "chain-state").text, what="the chain state")
    assert "Not checked yet" in state or "Verified" in state
    driver.find_element(By.ID, "verify").click()
    _wait(lambda: "Verified" in driver.find_element(By.ID, "chain-state").text, what="a verified chain")
    assert "last checked" in driver.find_element(By.ID, "chain-state").text
    href = driver.find_element(By.ID, "export-events").get_attribute("href")
    with console.client(console.keys["auditor"]) as c:
        lines = c.get(href).text.strip().splitlines()
        n = c.get("/audit/verify").json()["events"]
    assert len(lines) == n and all(json.loads(x)["hash"] for x in lines)
    assert not any(m in "".join(lines) for m in MARKERS)


def test_the_audit_page_lists_the_calls_not_answered_in_full_by_level(console, driver):
    """The seeded hour holds shed and failed calls: the page lists each (newest first, its
    level, how it ended, a link to its record), as the API does, and filters by level."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _sign_in(driver, console, "auditor", "audit")
    outcomes = "interrupted,shed,error,engine_restart,shutdown"
    with console.client(console.keys["auditor"]) as c:
        want = c.get("/audit/requests", params={"outcome": outcomes, "limit": 200}).json()["requests"]
        want1 = c.get("/audit/requests", params={"outcome": outcomes, "level": 1, "limit": 200}).json()["requests"]
    assert want and {x["outcome"] for x in want} <= {"shed", "error"}
    assert 0 < len(want1) < len(want), "the seed has unanswered calls at level 1 and at others"
    rows = lambda: _css(driver, "#unanswered-rows tr[data-id]")  # noqa: E731
    _wait(lambda: len(rows()) == len(want), what="the calls not answered in full")
    assert [r.get_attribute("data-id") for r in rows()] == [x["id"] for x in want]
    first = rows()[0]
    assert f"L{want[0]['effective_level']}" in first.text and want[0]["outcome"] in first.text
    assert first.find_element(By.TAG_NAME, "a").get_attribute("href").endswith(f"/ui/record?id={want[0]['id']}")
    Select(driver.find_element(By.ID, "u-level")).select_by_value("1")
    driver.find_element(By.ID, "u-show").click()
    _wait(lambda: [r.get_attribute("data-id") for r in rows()] == [x["id"] for x in want1]
          and "call" in driver.find_element(By.ID, "u-count").text, what="level 1 alone")


def test_the_audit_page_says_whether_the_most_urgent_calls_were_served_first(console, driver):
    """The order check over all time: the page's verdict and per-level counts are the API's,
    and each of the longest waits links to the overtaken call's record."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _sign_in(driver, console, "auditor", "audit")
    with console.client(console.keys["auditor"]) as c:
        want = c.get("/audit/order", params={"tolerance_s": 1}).json()
    assert want["calls"] >= len(console.seeded)
    Select(driver.find_element(By.ID, "o-window")).select_by_value("")
    driver.find_element(By.ID, "o-check").click()
    _wait(lambda: f"{want['calls']} calls" in driver.find_element(By.ID, "order-state").text, what="the order check, all time")
    state = driver.find_element(By.ID, "order-state").text
    assert ("No ESI-1 call overtaken" in state) == want["ok"] and f"{want['inversions']} inversion" in state
    rows = {r.get_attribute("data-level"): [td.text for td in r.find_elements(By.TAG_NAME, "td")]
            for r in _css(driver, "#order-levels tr[data-level]")}
    assert set(rows) == set(want["per_level"])
    for lv, x in want["per_level"].items():   # level, calls, overtaken, of them by a later call, by levels
        assert f"L{lv}" in rows[lv][0] and rows[lv][1:4] == [str(x["calls"]), str(x["overtaken"]), str(x["overtaken_by_later"])]
    if want["worst"]:
        first = _css(driver, "#order-worst tr[data-id]")[0]
        assert first.get_attribute("data-id") == want["worst"][0]["id"]
        assert first.find_element(By.TAG_NAME, "a").get_attribute("href").endswith(f"/ui/record?id={want['worst'][0]['id']}")


def test_the_models_page_shows_the_predictors_and_degrades_without_adapters(console, driver):
    from selenium.webdriver.common.by import By

    _sign_in(driver, console, "operator", "models")
    dl = _wait(lambda: driver.find_element(By.ID, "model-urgency").text, what="the urgency model")
    assert "runtime" in dl and "escalation threshold (trained)" in dl
    box = _wait(lambda: driver.find_element(By.ID, "adapters").text, what="the adapters section")
    assert box    # a table of adapters where GET /admin/models exists, a plain sentence where not


# --- accessibility -------------------------------------------------------------------------
def test_every_page_passes_axe_and_works_by_keyboard_and_at_tablet_width(console, driver):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from serving.bench.ui import _ready, run_axe, serious, set_viewport

    _sign_in(driver, console, "admin")
    pages = [a.get_attribute("href").rsplit("/", 1)[1] for a in _css(driver, "#nav a")]
    assert pages == ["queue", "classes", "history", "latency", "audit", "models"]
    problems = {}
    for width, height in ((1280, 720), (820, 1180)):
        set_viewport(driver, width, height)
        for p in pages:
            driver.get(f"{console.url}/ui/{p}")
            _ready(driver, p, By)
            # keyboard: on a fresh page the first Tab lands on the skip link, visibly focused
            ActionChains(driver).send_keys(Keys.TAB).perform()
            a = driver.switch_to.active_element
            assert a.get_attribute("class") == "skip", p
            ActionChains(driver).send_keys(Keys.TAB).perform()   # then the first page link
            a = driver.switch_to.active_element
            style = driver.execute_script("const s = getComputedStyle(arguments[0]); return [s.outlineStyle, s.outlineWidth]", a)
            assert a.tag_name == "a" and style[0] != "none" and float(style[1].rstrip("px")) >= 2, (p, style)
            bad = serious(run_axe(driver))
            if bad:
                problems[f"{p}@{width}"] = bad
            over = driver.execute_script("return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert over <= 1, f"{p} scrolls sideways at {width}px ({over}px)"
    set_viewport(driver, 1280, 720)
    assert not problems, json.dumps(problems, indent=1)


# --- the screenshots -----------------------------------------------------------------------
def _png_size(path: Path) -> tuple[int, int]:
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_bench_ui_writes_a_1280x720_png_of_every_page(tmp_path, predictors_dir):
    exe = Path(sys.executable).with_name("triage")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRIAGE_HOME": str(predictors_dir.parent), "PYTHONFAULTHANDLER": "1"}
    _browser().quit()   # skip/fail as the other tests do when Chromium is missing
    out = tmp_path / "shots"
    r = subprocess.run([str(exe), "bench", "ui", "--screenshots", str(out), "--workdir", str(tmp_path / "work"), "--json"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, "\n".join(x for x in r.stderr.splitlines() if "leaked" not in x)[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(res["pages"]) == {"queue", "queue-auditor", "classes", "history", "latency", "audit", "models"}
    for name, path in res["pages"].items():
        assert path == str(out / f"{name}.png")
        assert _png_size(path) == (1280, 720)
    assert not any(res["axe_serious"].values()), res["axe_serious"]
