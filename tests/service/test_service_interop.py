"""The ecosystem's priority and objective headers on the way in (serving/api/interop.py),
on the simulated backend: vLLM's X-Vllm-Priority (operator keys only, like the body's
`priority`), llm-d's x-llm-d-slo-ttft-ms / x-llm-d-slo-tpot-ms (the audit row keeps them),
the body winning over a header, and a clear 400 for a header that is not a number."""
from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import create_engine, text

from conftest import Server, make_keys, make_settings

MODEL = "smollm2-135m-instruct"
MSG = "mild sore throat since yesterday, no fever"


@pytest.fixture(scope="module")
def svc(tmp_path_factory, predictors_dir):
    tmp = tmp_path_factory.mktemp("interop")
    url = f"sqlite:///{tmp / 'audit.db'}"
    keys = make_keys(url)
    with Server(make_settings(url, tmp, predictors_dir)) as srv:
        srv.keys, srv.db_url = keys, url
        yield srv


def _post(svc, role, headers=None, **body):
    h = {"Authorization": f"Bearer {svc.keys[role]}", **(headers or {})}
    return httpx.post(svc.url + "/v1/chat/completions", headers=h, timeout=60,
                      json={"model": MODEL, "messages": [{"role": "user", "content": MSG}], "max_tokens": 2, **body})


def _row(svc, rid):
    eng = create_engine(svc.db_url)
    try:
        for _ in range(50):
            with eng.connect() as c:
                r = c.execute(text("SELECT effective_level, ttft_slo, tpot_slo FROM requests WHERE id = :i"),
                              {"i": rid}).first()
            if r is not None:
                return r
            time.sleep(0.1)
    finally:
        eng.dispose()
    raise AssertionError(f"no audit row for {rid}")


def test_vllm_priority_header_for_operators_only(svc):
    op = _post(svc, "operator", {"X-Vllm-Priority": "1"}).json()
    assert op["triage"]["level"] == 1
    cl = _post(svc, "client", {"X-Vllm-Priority": "1"}).json()
    assert cl["triage"]["level"] == cl["triage"]["predicted_level"]
    both = _post(svc, "operator", {"X-Vllm-Priority": "1"}, priority=3).json()
    assert both["triage"]["level"] == 3, "the body's priority wins over the header"


def test_llm_d_slo_headers_become_the_calls_slos(svc):
    r = _post(svc, "client", {"x-llm-d-slo-ttft-ms": "750", "x-llm-d-slo-tpot-ms": "90"})
    assert r.status_code == 200, r.text
    row = _row(svc, r.json()["id"])
    assert (row.ttft_slo, row.tpot_slo) == (0.75, 0.09)
    r = _post(svc, "client", {"x-llm-d-slo-ttft-ms": "750"}, slo={"ttft_ms": 400})
    assert _row(svc, r.json()["id"]).ttft_slo == 0.4, "the body's slo wins over the header"


@pytest.mark.parametrize("name,value", [("X-Vllm-Priority", "urgent"), ("x-llm-d-slo-ttft-ms", "-5"),
                                        ("x-llm-d-slo-tpot-ms", "nan")])
def test_bad_header_is_a_clear_400(svc, name, value):
    r = _post(svc, "client", {name: value})
    assert r.status_code == 400
    assert name.lower() in r.json()["error"]["message"].lower()
