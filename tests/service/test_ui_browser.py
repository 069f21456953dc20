"""The operator page in a real browser (Debian's headless Chromium through chromedriver):
an operator enters their key, sees the waiting requests by level, moves one to level 2
with a reason, and the page, the API and the audit trail all show it.

Needs /usr/bin/chromium and /usr/bin/chromedriver (scripts/setup.sh installs them where it
can). Skipped without them, unless TRIAGE_REQUIRE_BROWSER=1 (CI), where it fails instead.
"""
from __future__ import annotations

import os
import shutil
import threading
import time

import httpx
import pytest

from tests.service.conftest import Server, make_keys, make_settings

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
MODEL = "smollm2-135m-instruct"


def _browser():
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        if os.environ.get("TRIAGE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"TRIAGE_REQUIRE_BROWSER=1 but {CHROMIUM} or {DRIVER} is missing (run scripts/setup.sh)")
        pytest.skip("Chromium and chromedriver are not installed (scripts/setup.sh installs them)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager look for a driver online
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1200,900"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def _post(url: str, key: str, text: str, priority: int, max_tokens: int, out: list) -> None:
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": text}],
                                                 "priority": priority, "max_tokens": max_tokens})
        out.append(r.status_code)


def _wait(cond, timeout: float = 20.0, what: str = "condition"):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_operator_relabels_a_waiting_request_from_the_page(tmp_path, predictors_dir):
    from selenium.webdriver.common.by import By

    url_db = f"sqlite:///{tmp_path / 'ui.db'}"
    keys = make_keys(url_db)
    settings = make_settings(url_db, tmp_path, predictors_dir, max_inflight=1)
    driver = _browser()
    codes: list[int] = []
    try:
        with Server(settings) as srv:
            driver.get(srv.url + "/ui")
            driver.find_element(By.ID, "key").send_keys(keys["operator"])
            driver.find_element(By.ID, "save").click()
            _wait(lambda: "waiting" in driver.find_element(By.ID, "qsum").text, what="the page reading the queue")

            # one long level-5 answer occupies the engine; three level-4 requests wait behind it
            # (an operator key may set the level with `priority`; a client's is predicted)
            threads = [threading.Thread(target=_post, args=(srv.url, keys["operator"], "long routine question", 5, 400, codes))]
            threads += [threading.Thread(target=_post, args=(srv.url, keys["operator"], f"routine {i}", 4, 4, codes))
                        for i in range(3)]
            threads[0].start()
            time.sleep(0.3)
            for t in threads[1:]:
                t.start()

            def level4_rows():
                rows = driver.find_elements(By.CSS_SELECTOR, "#queue tbody tr.lv4")
                return rows if len(rows) == 3 else None

            try:
                rows = _wait(level4_rows, what="three waiting level-4 rows on the page")
            except AssertionError:
                with httpx.Client(base_url=srv.url, timeout=30) as c:
                    q = c.get("/admin/queue", headers={"Authorization": f"Bearer {keys['operator']}"}).json()
                raise AssertionError(f"page status {driver.find_element(By.ID, 'status').text!r}, "
                                     f"qsum {driver.find_element(By.ID, 'qsum').text!r}, queue {q}, codes {codes}")
            assert "waiting" in driver.find_element(By.ID, "qsum").text
            target = rows[-1].get_attribute("data-id")
            # the last in line gets moved to level 2; the page asks for a reason in a prompt
            driver.find_element(By.CSS_SELECTOR, f'#queue tr[data-id="{target}"] button[data-level="2"]').click()
            alert = _wait(lambda: _alert(driver), what="the reason prompt")
            alert.send_keys("caller reports chest pain")
            alert.accept()

            moved = _wait(lambda: driver.find_elements(By.CSS_SELECTOR, f'#queue tr.lv2[data-id="{target}"]'),
                          what="the relabelled row under level 2")
            cells = [td.text for td in moved[0].find_elements(By.TAG_NAME, "td")]
            # level, position (first in line now), the model's predicted level, the override
            assert cells[0] == "2" and cells[1] == "0" and cells[3] in "12345" and cells[4] == "2"
            assert driver.find_element(By.ID, "status").text == ""
            driver.save_screenshot(str(tmp_path / "ui.png"))

            with httpx.Client(base_url=srv.url, timeout=30) as c:
                q = c.get("/admin/queue", headers={"Authorization": f"Bearer {keys['operator']}"}).json()
                assert [x["request_id"] for x in q["by_level"]["2"]] == [target]
                for t in threads:
                    t.join(120)
                rec = c.get(f"/audit/requests/{target}", headers={"Authorization": f"Bearer {keys['auditor']}"}).json()
            assert rec["request"]["override_level"] == 2
            assert rec["relabels"][0]["reason"] == "caller reports chest pain"
    finally:
        driver.quit()
    assert codes == [200] * 4


def _alert(driver):
    from selenium.common.exceptions import NoAlertPresentException

    try:
        a = driver.switch_to.alert
        a.text  # noqa: B018  (raises when no dialog is open)
        return a
    except NoAlertPresentException:
        return None
