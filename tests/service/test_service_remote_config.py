"""Bad remote configuration is reported at start-up and in /readyz, and the front end
starts anyway (no engine: the misconfigured instances are small stand-in HTTP servers
answering what a vLLM server of another model, or a stock vLLM without our scheduler
class, answers; the unreachable one is a closed port). The real instances' path is
tests/service/test_service_remote.py."""
from __future__ import annotations

import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from conftest import Server, free_port, make_keys, make_settings


def _vllm_like(model: str) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "max_model_len": 2048}]}

    @app.get("/health")
    def health():
        return {}

    @app.get("/triage/load")   # what a stock vLLM answers for an unknown path
    def load():
        return JSONResponse({"detail": "Not Found"}, status_code=404)

    return app


class _Bg:
    def __init__(self, app) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *a):
        self.server.should_exit = True
        self.thread.join(10)


def test_unreachable_wrong_model_and_stock_instances_are_named_in_readyz(tmp_path, predictors_dir):
    with _Bg(_vllm_like("llama-3-8b")) as wrong, _Bg(_vllm_like("smollm2-135m-instruct")) as stock:
        dead = f"http://127.0.0.1:{free_port()}"
        url = f"sqlite:///{tmp_path / 'audit.db'}"
        make_keys(url)
        s = make_settings(url, tmp_path, predictors_dir, backend="remote", instances=f"{dead},{wrong},{stock}",
                          profile=None)
        with Server(s) as srv:
            r = httpx.get(srv.url + "/readyz", timeout=10)
            assert r.status_code == 503, "no instance is usable"
            inst = {i["url"]: i for i in r.json()["instances"]}
            assert inst[dead]["state"] == "down" and "unreachable" in inst[dead]["reason"]
            assert inst[wrong]["state"] == "refused" and "llama-3-8b" in inst[wrong]["reason"]
            assert inst[stock]["state"] == "refused" and "scheduler class" in inst[stock]["reason"]
            assert inst[stock]["triage_scheduler"] is False


@pytest.mark.parametrize("instances,message", [("", "at least one instance"), ("localhost:8001", "http://"),
                                               ("http://a:1,http://a:1", "twice")])
def test_bad_instance_lists_stop_serve_with_the_reason(instances, message):
    from typer.testing import CliRunner

    from serving.cli import app

    r = CliRunner().invoke(app, ["serve", "--backend", "remote", "--instances", instances, "--db",
                                 "sqlite:////tmp/triage-unused.db"])
    assert r.exit_code == 2
    assert message in r.output
