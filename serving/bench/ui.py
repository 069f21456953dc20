"""`triage bench ui`: the operator console in real Chromium, from a seeded live service.

    run_ui_bench(out_dir) -> {"pages": {NAME: "DIR/NAME.png"}, "axe": {NAME: [serious violations]}, ...}

It starts the service (simulated backend: the engine is not the point of a screenshot),
seeds it, signs in per role and saves a 1280x720 PNG of every page, running the vendored
axe-core on each. The seed is labelled as such everywhere:

* the audit database gets one hour of *synthetic* finished requests (`seed-…` ids,
  per-level TTFT/TPOT drawn from fixed distributions with a fixed RNG seed, a few shed
  and errored) through the audit writer, so the hash chain still verifies;
* then real calls go through the live service (corpus test-split texts, classified by the
  real predictors), an operator relabels one and edits the classes once.

Chromium: Debian's `chromium` and `chromedriver` through Selenium (never a downloaded
browser). The browser tests use the same helpers.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

STATIC = Path(__file__).resolve().parent.parent / "static"
AXE = STATIC / "vendor" / "axe-core" / "axe.min.js"
SERIOUS = ("serious", "critical")


class BrowserMissing(RuntimeError):
    pass


def chrome(width: int = 1280, height: int = 720):
    """Headless Debian Chromium through chromedriver; the viewport is exactly width x height."""
    binary = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not (os.path.exists(binary) and os.path.exists(driver)):
        raise BrowserMissing(f"{binary} or {driver} is missing: install Debian's chromium and chromium-driver "
                             "(scripts/setup.sh does with TRIAGE_SETUP_BROWSER=1)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise BrowserMissing("selenium is not installed (pip install -e '.[dev]')") from None
    os.environ.setdefault("SE_OFFLINE", "true")   # never let Selenium Manager fetch anything
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    opts.page_load_strategy = "eager"   # the queue page keeps an event stream open; wait for the DOM only
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--hide-scrollbars",
              "--force-device-scale-factor=1", f"--window-size={width},{height}"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(driver), options=opts)
    set_viewport(d, width, height)
    return d


def set_viewport(driver, width: int, height: int) -> None:
    """Make the page's viewport (not the window) width x height."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


def wait(cond, timeout: float = 15.0, what: str = "condition", step: float = 0.1):
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < timeout:
        try:
            v = cond()
        except Exception as e:   # a stale element mid-redraw: try again
            v, last = None, e
        if v:
            return v
        time.sleep(step)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}" + (f" (last error: {last})" if last else ""))


def sign_in(driver, base: str, key: str, page: str | None = None) -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(base + "/ui/login" + (f"?next=/ui/{page}" if page else ""))
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.ID, "login").click()
    wait(lambda: "/ui/login" not in driver.current_url, what="the console after sign-in")
    wait(lambda: driver.find_elements(By.CSS_SELECTOR, "#nav a"), what="the navigation")


def run_axe(driver) -> list[dict]:
    """axe-core (vendored) on the current page: its violations, each with impact and nodes."""
    driver.execute_script(AXE.read_text(encoding="utf-8"))
    res = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations), e => done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}]));")
    return [{"id": v["id"], "impact": v.get("impact"), "help": v.get("help"),
             "nodes": [n.get("target") for n in v.get("nodes", [])][:5]} for v in res]


def serious(violations: list[dict]) -> list[dict]:
    return [v for v in violations if v.get("impact") in SERIOUS]


# --- the seed ----------------------------------------------------------------------------
def synthetic_rows(now: float, hours: float = 1.0, n: int = 360, seed: int = 0, prefix: str = "seed") -> list[dict]:
    """Finished-request rows spread over [now - hours, now): synthetic, clearly labelled
    by their id prefix. Level-1 calls are faster than level-5 ones, as the scheduler
    intends; about 2 % are shed and 1 % errored."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ttft_med = {1: 0.35, 2: 0.6, 3: 1.2, 4: 2.0, 5: 3.0}
    tpot_med = {1: 0.03, 2: 0.035, 3: 0.045, 4: 0.05, 5: 0.06}
    slo = {1: (1.0, 0.06), 2: (1.5, 0.08), 3: (3.0, 0.1), 4: (5.0, 0.12), 5: (8.0, 0.15)}
    rows = []
    for i in range(n):
        lv = int(rng.choice([1, 2, 3, 4, 5], p=[0.08, 0.17, 0.35, 0.25, 0.15]))
        arrival = now - hours * 3600 + float(rng.uniform(0, hours * 3600))
        u = float(rng.uniform())
        outcome = "shed" if u < 0.02 else ("error" if u < 0.03 else "ok")
        served = outcome == "ok"
        ttft = float(ttft_med[lv] * rng.lognormal(0, 0.45)) if served else None
        tpot = float(tpot_med[lv] * rng.lognormal(0, 0.25)) if served else None
        out_tokens = int(rng.integers(20, 300)) if served else 0
        met = bool(served and ttft <= slo[lv][0] and tpot <= slo[lv][1])
        rows.append({
            "id": f"{prefix}-{seed}-{i:05d}", "client_request_id": None, "api_key_id": None, "endpoint": "chat",
            "model": "synthetic", "classifier_level": lv, "predicted_level": lv, "override_level": None,
            "effective_level": lv, "ttft_slo": slo[lv][0], "tpot_slo": slo[lv][1], "classes_version": 1,
            "arrival": arrival, "dispatched": arrival + 0.01 if served else None,
            "first_token": arrival + ttft if served else None,
            "finish": arrival + ttft + out_tokens * tpot if served else arrival,
            "prompt_tokens": int(rng.integers(30, 200)), "output_tokens": out_tokens, "max_tokens": 512,
            "predicted_output_len": out_tokens or 64, "queue_time": 0.01 if served else None, "ttft": ttft,
            "max_tpot": tpot * 1.8 if served else None, "mean_tpot": tpot, "tdg_gain": None, "tdg_ideal": None,
            "slo_met": met, "preemptions": 0, "instance": "synthetic", "outcome": outcome, "prompt": None,
        })
    return rows


def seed_audit(db_url: str, rows: list[dict], spool: Path) -> None:
    """Write finished-request rows through the audit writer (each sealed by a chained event)."""
    from serving.db.session import make_engine, upgrade
    from serving.db.writer import AuditWriter, Record

    upgrade(db_url)
    eng = make_engine(db_url)
    w = AuditWriter(eng, spool, batch=500, interval_s=0.05).start()
    try:
        for r in sorted(rows, key=lambda r: r["arrival"]):
            w.submit(Record("request.finished", r["finish"], None, r["id"],
                            {"level": r["effective_level"], "outcome": r["outcome"], "synthetic": True}, "requests", [r]))
        w.sync(60.0)
    finally:
        w.stop(30.0)
        eng.dispose()


def _call(url: str, key: str, text: str, max_tokens: int, out: list, priority: int | None = None) -> None:
    import httpx

    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens, "ignore_eos": True}
    if priority is not None:
        body["priority"] = priority
    try:
        with httpx.Client(base_url=url, timeout=600, headers={"Authorization": f"Bearer {key}"}) as c:
            out.append(c.post("/v1/chat/completions", json=body).status_code)
    except Exception as e:   # the service stops while calls still wait: expected at the end
        out.append(type(e).__name__)


def live_calls(url: str, key: str, texts: list[str], max_tokens: int = 1500) -> tuple[list[threading.Thread], list]:
    """Start one long call per text (daemon threads); they stay live while the page is shot."""
    codes: list = []
    threads = [threading.Thread(target=_call, args=(url, key, t, max_tokens, codes), daemon=True) for t in texts]
    for t in threads:
        t.start()
        time.sleep(0.05)
    return threads, codes


def sample_texts(n: int, seed: int = 0) -> list[str]:
    """Dispatch texts from the corpus's test split, a spread of levels."""
    import random

    from serving.bench.texts import load_pool

    pool = load_pool("corpus-test")
    rnd = random.Random(seed)
    by: dict[int, list] = {}
    for t in pool:
        by.setdefault(t.gold, []).append(t.text)
    out = []
    levels = sorted(by)
    while len(out) < n:
        lv = levels[len(out) % len(levels)]
        out.append(rnd.choice(by[lv]))
    return out


# --- the bench ---------------------------------------------------------------------------
SHOTS = [("queue", "operator"), ("queue-auditor", "auditor"), ("classes", "operator"), ("history", "operator"),
         ("latency", "auditor"), ("audit", "auditor"), ("models", "admin")]


def run_ui_bench(out_dir: Path, *, workdir: Path, predictors_dir: Path | None = None, width: int = 1280,
                 height: int = 720, on_page=None) -> dict:
    import httpx
    import uvicorn
    from selenium.webdriver.common.by import By

    from serving.app import create_app
    from serving.auth import create_key
    from serving.db.session import make_engine
    from serving.settings import Settings

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{workdir / 'ui-bench.db'}"
    now = time.time()
    seed_audit(db_url, synthetic_rows(now), workdir / "seed-spool.jsonl")
    eng = make_engine(db_url)
    keys = {r: create_key(eng, r, "bench ui") for r in ("operator", "auditor", "admin")}
    eng.dispose()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(backend="simulated", db_url=db_url, port=port, spool_path=workdir / "spool.jsonl",
                        predictors_dir=predictors_dir, bootstrap_keys=False, max_inflight=3, max_queue=64,
                        sim_speed=0.05, writer_interval_s=0.05)
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{port}"
    driver = None
    try:
        wait(lambda: server.started, timeout=600, what="the service to start")
        op = {"Authorization": f"Bearer {keys['operator']}"}
        _, _codes = live_calls(url, keys["operator"], sample_texts(9))
        with httpx.Client(base_url=url, timeout=30) as c:
            q = wait(lambda: (lambda v: v if len(v["waiting"]) >= 4 and v["running"] else None)(
                c.get("/ui/api/queue", headers=op).json()), timeout=60, what="live calls in the queue")
            victim = q["waiting"][-1]
            c.patch(f"/admin/requests/{victim['request_id']}", headers=op,
                    json={"level": 1 if victim["level"] > 1 else 2, "reason": "caller reports the patient stopped breathing"})
            cls = c.get("/admin/classes", headers=op).json()
            for k in cls["classes"]:
                if k["level"] == 3:
                    k["ttft"] = round(k["ttft"] * 0.8, 3)
            c.put("/admin/classes", headers=op, json={"classes": cls["classes"], "reason": "tighter level-3 first token for the night shift"})
            c.get("/audit/verify", headers={"Authorization": f"Bearer {keys['auditor']}"})
        pages, axe_out = {}, {}
        for name, role in SHOTS:
            page = name.split("-")[0]
            if driver is not None:   # a fresh browser per page: no stream or session carries over
                driver.quit()
            driver = chrome(width, height)
            sign_in(driver, url, keys[role], page)
            driver.get(f"{url}/ui/{page}")
            _ready(driver, page, By)
            path = out_dir / f"{name}.png"
            driver.save_screenshot(str(path))
            pages[name] = str(path)
            axe_out[name] = serious(run_axe(driver))
            if on_page:
                on_page(name)
        return {"pages": pages, "axe_serious": axe_out, "viewport": [width, height], "url": url,
                "seed": {"synthetic_requests": 360, "live_calls": 9, "relabels": 1, "class_edits": 1}}
    finally:
        if driver is not None:
            driver.quit()
        server.should_exit = True
        th.join(30)


def _ready(driver, page: str, By) -> None:
    """Wait until the page has drawn what it is for."""
    sel = {"queue": "#waiting tbody tr[data-id]", "classes": "#version-rows tbody tr", "history": "#history-rows tbody tr",
           "latency": "#charts canvas", "audit": "#chain-state", "models": "#model-urgency"}[page]
    wait(lambda: driver.find_elements(By.CSS_SELECTOR, sel), timeout=20, what=f"the {page} page")
    time.sleep(0.4)
