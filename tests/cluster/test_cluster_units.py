"""Scale-out pieces without a model: our fields on the wire (flat vllm_xargs) as the
real vLLM 0.32 scheduler class reads them, the load snapshot it answers, the remote
instance's load view (snapshot + ledger + staleness), vLLM /metrics parsing, instance
URL validation, and one router class shared with the simulator."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import numpy as np
import pytest

from serving.backends.remote import parse_instances
from serving.backends.remote_instances import DOWN, UP, RemoteInstance, Timing, parse_metrics
from serving.instance.fields import request_fields, wire_xargs
from triage.profiles import load_profile
from triage.request import Request

PROFILE = "vllm-cpu-smollm2"


def test_fields_round_trip_flat_and_nested():
    x = wire_xargs(request_id="req-1", level=2, ttft_slo=0.8, tpot_slo=0.12, predicted_output_len=40, waited_s=0.25)
    assert all(isinstance(v, (str, int, float)) for v in x.values()), "vLLM's schema takes flat scalars only"
    f = request_fields(x, arrival_time=1000.0)
    assert f == {"id": "req-1", "level": 2, "ttft_slo": 0.8, "tpot_slo": 0.12, "predicted_output_len": 40,
                 "arrival": 999.75}
    assert request_fields({"triage": {"level": 1, "arrival": 5.0}}) == {"level": 1, "arrival": 5.0}
    assert request_fields({"triage": '{"level": 3}'}) == {"level": 3}
    assert request_fields({"triage_level": "not a number", "triage_tpot_slo": 0.1}) == {"tpot_slo": 0.1}
    assert request_fields(None) == {}


def test_parse_instances_refuses_bad_lists():
    assert parse_instances("http://a:1, http://b:2/") == ["http://a:1", "http://b:2"]
    for bad in ("", "a:1", "http://a:1,http://a:1", "ftp://x"):
        with pytest.raises(ValueError):
            parse_instances(bad)


def test_parse_vllm_metrics():
    text = """# HELP vllm:num_requests_waiting x
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="2000"} 1.0
other_metric 7
"""
    m = parse_metrics(text)
    assert m["vllm:num_requests_waiting"] == 3 and m["vllm:num_requests_running"] == 5
    assert m["num_gpu_blocks"] == 2000
    inst = RemoteInstance(0, "http://x", load_profile(PROFILE).estimator())
    inst.state, inst.has_triage = UP, False
    inst.metrics, inst.metrics_at = m, time.time()
    assert (inst.n_waiting, inst.n_running, inst.free_blocks) == (3, 5, 1500)
    r = Request(id="a", arrival=time.time(), prompt_len=100, predicted_level=1, ttft_slo=1, tpot_slo=0.1)
    inst.on_sent(r, time.time() + 0.01)   # sent after the metrics were read: counts as waiting
    assert inst.n_waiting == 4


def _row(rid, level, stage, need, slack=1.0, computed=0):
    return {"id": rid, "level": level, "stage": stage, "prompt": 64, "computed": computed, "generated": 0,
            "need": need, "remaining": 10, "slack_s": slack, "ttft_slo": 1.0, "tpot_slo": 0.1}


def test_instance_view_snapshot_plus_ledger_and_staleness():
    inst = RemoteInstance(1, "http://x", load_profile(PROFILE).estimator(), Timing(max_stale_s=2.0))
    now = time.time()
    snap = {"waiting": [_row("w1", 3, "waiting", 64)], "running": [_row("d1", 5, "decoding", 1, computed=80)],
            "free_blocks": 100, "block_size": 32, "estimator": {"beta": 1.5, "t_c": 0.05}}
    inst.take_snapshot(snap, now)
    assert inst.estimator.beta == 1.5 and inst.estimator.t_c == 0.05
    assert (inst.n_waiting, inst.n_running, inst.n_decoding) == (1, 1, 1)
    assert inst.prefill_tokens == 64
    # optimistic: a request sent since the snapshot counts at once
    r = Request(id="new", arrival=now, prompt_len=100, predicted_level=1, ttft_slo=1.0, tpot_slo=0.1)
    inst.on_sent(r, now)
    assert inst.n_waiting == 2 and inst.prefill_tokens == 164 and inst.free_blocks == 100 - 4
    slack, ctx, tpot = inst.decodes(now)
    assert len(slack) == 1 and ctx[0] == 80
    # a request that finished since the snapshot no longer counts
    inst.on_done("new", now)
    inst.done_recent["w1"] = now
    assert inst.n_waiting == 0
    # a stale snapshot is ignored: only the ledger speaks
    inst.snap_at = now - 5
    assert inst.load_source == "ledger" and inst.n_running == 0 and inst.free_blocks == 1 << 30


def test_health_marks_down_and_rejoins():
    inst = RemoteInstance(0, "http://x", load_profile(PROFILE).estimator(), Timing(down_after_s=1.5))
    inst.checked, inst.state, inst.last_health = True, UP, time.time()
    inst.check_stale_health(time.time() + 1.0)
    assert inst.state == UP
    inst.check_stale_health(time.time() + 1.6)
    assert inst.state == DOWN and "no answer" in inst.reason
    inst.health_ok()
    assert inst.state == DOWN, "one good answer is not enough"
    inst.health_ok()
    assert inst.state == UP


async def _health_server(delay: list[float]):
    """A real HTTP server answering GET /health after `delay[0]` seconds."""
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(delay[0])
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_a_slow_health_answer_is_not_a_dead_instance():
    """On a saturated host /health can miss its timeout: the instance stays in rotation
    until no answer came for down_after_s (a front end that dropped both instances on one
    slow answer held every call, ESI-1 included, up to 17 s); a refused connection is out
    at once; rejoining tells the front end (on_up), which looks at its queue again."""
    async def run():
        delay = [0.0]
        server = await _health_server(delay)
        port = server.sockets[0].getsockname()[1]
        timing = Timing(health_s=0.05, down_after_s=1.0, timeout_s=0.2)
        inst = RemoteInstance(0, f"http://127.0.0.1:{port}", load_profile(PROFILE).estimator(), timing)
        inst.checked, inst.state, inst.last_health = True, UP, time.time()
        rejoined = []
        inst.on_up = lambda: rejoined.append(time.time())
        async with aiohttp.ClientSession() as client:
            task = asyncio.create_task(inst.health_loop(client, "m", False))
            delay[0] = 0.3                          # one late answer (0.3 s > 0.2 s timeout)
            await asyncio.sleep(0.25)
            delay[0] = 0.0
            await asyncio.sleep(0.4)
            assert inst.state == UP and inst.counters["went_down"] == 0
            delay[0] = 5.0                          # no answer at all: out within down_after_s + a probe
            await asyncio.sleep(1.6)
            assert inst.state == DOWN and "no answer" in inst.reason
            delay[0] = 0.0                          # answers again: two good answers bring it back
            await asyncio.sleep(0.6)
            assert inst.state == UP and rejoined
            server.close()
            await server.wait_closed()              # nothing listens now: out at once
            await asyncio.sleep(0.3)
            assert inst.state == DOWN and "ClientConnectorError" in inst.reason
            task.cancel()

    asyncio.run(run())


async def _instance_server(hits: dict[str, list[float]], load_ok: list[bool]):
    """A real HTTP server answering GET /health and GET /triage/load (an empty snapshot, or
    500 while `load_ok[0]` is False); `hits` gets the time of every request, by path."""
    async def handle(reader, writer):
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        path = head.split()[1]
        hits.setdefault(path, []).append(time.monotonic())
        body = b'{"scheduler": "TriageScheduler", "waiting": [], "running": [], "free_blocks": 100}'
        status = b"200 OK" if path == "/health" or load_ok[0] else b"500 Internal Server Error"
        body = body if path != "/health" else b""
        writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\ncontent-length: "
                     + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_load_is_polled_fast_only_while_the_front_end_routes():
    """A snapshot only informs routing: with no dispatch the instance is polled every
    idle_poll_s, not every poll_s (each poll is a control call between two engine steps);
    the first dispatch after a quiet spell polls at once, and dispatching keeps the fast pace."""
    async def run():
        polls: dict[str, list[float]] = {}
        server = await _instance_server(polls, [True])
        hits = polls.setdefault("/triage/load", [])
        port = server.sockets[0].getsockname()[1]
        timing = Timing(poll_s=0.05, idle_poll_s=0.6, busy_s=0.3)
        inst = RemoteInstance(0, f"http://127.0.0.1:{port}", load_profile(PROFILE).estimator(), timing)
        inst.checked, inst.state, inst.has_triage = True, UP, True
        async with aiohttp.ClientSession() as client:
            task = asyncio.create_task(inst.load_loop(client))
            await asyncio.sleep(1.5)                 # quiet: about one poll per 0.6 s
            quiet = len(hits)
            assert 2 <= quiet <= 4, quiet
            now = time.time()
            t0 = time.monotonic()
            inst.on_sent(Request(id="a", arrival=now, prompt_len=10, predicted_level=1, ttft_slo=1.0, tpot_slo=0.1), now)
            await asyncio.sleep(0.1)
            assert hits[-1] >= t0, "the first dispatch after a quiet spell polls at once"
            for k in range(10):                      # routing: every poll_s
                now = time.time()
                inst.on_sent(Request(id=f"b{k}", arrival=now, prompt_len=10, predicted_level=3, ttft_slo=1.0,
                                     tpot_slo=0.1), now)
                await asyncio.sleep(0.1)
            busy = [h for h in hits if h >= t0]
            assert len(busy) >= 12, len(busy)        # 1.1 s at 0.05 s: ~20
            assert inst.snapshot is not None and inst.load_source == "triage-load"
            task.cancel()
            server.close()

    asyncio.run(run())


def test_load_polls_stand_in_for_health_checks_and_a_dead_instance_still_leaves():
    """While calls are routed the instance answers a load poll every poll_s: the front end
    sends no /health of its own then (each is a request its CPU pays for, on the engines'
    cores); when the polls stop being answered the health checks resume, and an instance
    that stops listening is out of rotation at once as before."""
    async def run():
        hits: dict[str, list[float]] = {}
        load_ok = [True]
        server = await _instance_server(hits, load_ok)
        n = lambda path: len(hits.get(path, []))  # noqa: E731
        port = server.sockets[0].getsockname()[1]
        timing = Timing(poll_s=0.05, idle_poll_s=0.05, health_s=0.2, down_after_s=1.0, timeout_s=0.5)
        inst = RemoteInstance(0, f"http://127.0.0.1:{port}", load_profile(PROFILE).estimator(), timing)
        inst.checked, inst.state, inst.has_triage, inst.last_health = True, UP, True, time.time()
        async with aiohttp.ClientSession() as client:
            tasks = [asyncio.create_task(inst.load_loop(client)),
                     asyncio.create_task(inst.health_loop(client, "m", False))]
            await asyncio.sleep(1.2)
            assert n("/triage/load") >= 10 and n("/health") <= 1, {p: len(h) for p, h in hits.items()}
            assert inst.state == UP
            load_ok[0] = False                       # polls fail (500): /health speaks again
            await asyncio.sleep(0.5)
            assert n("/health") >= 2 and inst.state == UP, {p: len(h) for p, h in hits.items()}
            server.close()
            await server.wait_closed()               # nothing listens: out at once
            await asyncio.sleep(0.4)
            assert inst.state == DOWN and "ClientConnectorError" in inst.reason
            for t in tasks:
                t.cancel()

    asyncio.run(run())


def test_live_and_simulated_routing_share_one_class():
    """The remote backend builds its router with triage.routing.make_router, the very
    function (and classes) simulate_cluster uses; GoRouting runs on RemoteInstance loads."""
    import inspect

    import serving.backends.remote as remote
    import triage.sim.cluster as cluster
    from triage.routing import ROUTERS, make_router
    from triage.routing.gorouting import GoRouting

    assert remote.make_router is make_router is cluster.make_router
    assert ROUTERS["gorouting"] is GoRouting
    src = inspect.getsource(remote)
    assert "class GoRouting" not in src and "def route(" not in src
    est = load_profile(PROFILE).estimator
    insts = [RemoteInstance(i, f"http://x{i}", est()) for i in range(2)]
    for i in insts:
        i.state = UP
    rt = make_router("gorouting")
    now = time.time()
    picks = []
    for k in range(6):
        r = Request(id=f"r{k}", arrival=now, prompt_len=400, predicted_level=1 + k % 2, ttft_slo=1.0, tpot_slo=0.1)
        j = rt.route(r, insts, now)
        rt.on_dispatch(r, insts[j].index, now, insts[j])
        insts[j].on_sent(r, now)
        picks.append(j)
    assert set(picks) == {0, 1}, f"GoRouting should spread prefill work, picked {picks}"
    assert np.isfinite(rt.exec_time(insts[0], now))


def test_a_resumed_request_asks_the_next_instance_for_the_rest_only():
    """A stream broken after tokens goes on elsewhere from the ids already sent: the prompt's
    ids plus the output ids as the prompt, and only what is left of max_tokens and
    min_tokens (the client must not get more tokens than it asked for, nor a restart)."""
    from serving.backends.base import GenRequest
    from serving.backends.remote import RemoteBackend, _Progress
    from serving.settings import Settings
    from triage.classes import load_classes

    b = RemoteBackend(Settings(backend="remote", instances="http://127.0.0.1:1", db_url="sqlite:////tmp/unused.db"),
                      load_classes())
    req = GenRequest("req-1", "Chest pain, sweating.", 40, 1, 0.8, 0.12, 30, time.time() - 2.0, 6,
                     sampling={"temperature": 0.0, "min_tokens": 10, "logit_bias": {7: 1.5}})
    fresh = b._body(req, _Progress(prompt_tokens=6))
    assert fresh["prompt"] == "Chest pain, sweating." and fresh["max_tokens"] == 40 and fresh["min_tokens"] == 10
    prog = _Progress(prompt_ids=[1, 2, 3, 4, 5, 6], out_ids=[9, 8, 7], n_out=3, prompt_tokens=6)
    assert prog.resumable
    body = b._body(req, prog)
    assert body["prompt"] == [1, 2, 3, 4, 5, 6, 9, 8, 7]
    assert body["max_tokens"] == 37 and body["min_tokens"] == 7 and body["logit_bias"] == {"7": 1.5}
    assert body["priority"] == 1 and body["vllm_xargs"]["triage_predicted_output_len"] == 27
    assert body["vllm_xargs"]["triage_waited_s"] >= 2.0   # its deadline still counts from the first arrival
    # ids missing for some of the sent tokens: no resumption (it would repeat or skip text)
    assert not _Progress(prompt_ids=[1], out_ids=[9], n_out=2).resumable
    assert not _Progress(prompt_ids=[1], out_ids=[], n_out=0).resumable


async def _completions_server(seen: list[str], closed: asyncio.Event, tokens: int | None, breaks: int = 0):
    """A real HTTP server for POST /v1/completions: with `tokens`, streams that many SSE
    chunks and [DONE]; with None, holds the call (waiting for a seat) until the client
    closes the connection, then sets `closed` (vLLM aborts such a call). The first `breaks`
    calls get no answer: the connection closes once the body is read."""
    async def handle(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        n = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        seen.append((await reader.readexactly(n)).decode())
        if len(seen) <= breaks:
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        await writer.drain()
        if tokens is None:
            await reader.read()                     # EOF: the front end closed the stream
            closed.set()
        else:
            for k in range(tokens):
                fin = "length" if k == tokens - 1 else None
                chunk = {"choices": [{"text": f"t{k} ", "token_ids": [100 + k], "finish_reason": fin}],
                         "usage": {"prompt_tokens": 6, "completion_tokens": k + 1}}
                writer.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_a_call_waiting_for_a_seat_moves_to_an_instance_with_a_free_one():
    """Instance 0 is seat-bound (1 seat, held) and lists our call as waiting, nothing
    computed, for a second; instance 1 has two free seats and nothing queued. The rebalance closes the
    stream to instance 0 (which sees the abort), the call is sent to instance 1 and the
    client gets its whole answer from there; instance 0 stays in rotation (a move is no
    fault), and the call moves once."""
    from serving.backends.base import GenRequest
    from serving.backends.remote import RemoteBackend
    from serving.settings import Settings
    from triage.classes import load_classes

    async def run():
        seen0, seen1 = [], []
        closed0, closed1 = asyncio.Event(), asyncio.Event()
        s0 = await _completions_server(seen0, closed0, None)
        s1 = await _completions_server(seen1, closed1, 3)
        urls = ",".join(f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in (s0, s1))
        b = RemoteBackend(Settings(backend="remote", instances=urls, db_url="sqlite:////tmp/unused.db"), load_classes())
        b._client = aiohttp.ClientSession()
        i0, i1 = b.instances
        for i in b.instances:
            i.checked, i.has_triage = True, True
        i0.state, i1.state = UP, DOWN                 # the call goes to instance 0 first
        req = GenRequest("call-1", "Sprained ankle, walking fine.", 3, 5, 16.0, 1.0, 3, time.time(), 6)
        events = []

        async def client():
            async for ev in b.generate(req):
                events.append(ev)

        task = asyncio.create_task(client())
        for _ in range(100):
            if seen0:
                break
            await asyncio.sleep(0.02)
        assert seen0 and json.loads(seen0[0])["vllm_xargs"]["triage_id"] == "call-1"
        now = time.time()
        i0.take_snapshot({"max_num_seqs": 1, "waiting": [_row("call-1", 5, "waiting", 6, slack=16.0)],
                          "running": [_row("other", 5, "decoding", 1, computed=40)]}, now)
        i1.state = UP
        i1.take_snapshot({"max_num_seqs": 2, "waiting": [], "running": []}, now)
        assert await b.rebalance_once() == 0          # just sent: instance 0 may admit it at its next step
        i0.sent["call-1"].at -= 1.0                   # ... it has waited there a second
        assert await b.rebalance_once() == 1
        await asyncio.wait_for(task, 5.0)
        await asyncio.wait_for(closed0.wait(), 5.0)
        assert "".join(e.text for e in events) == "t0 t1 t2 " and events[-1].finished
        assert len(seen0) == 1 and len(seen1) == 1
        assert b.dispatch.moved == 1 and i0.state == UP and i0.counters["errors"] == 0
        assert b.instance_for("call-1") == i1.url
        assert await b.rebalance_once() == 0 and not b._moving and "call-1" not in b._moved
        await b._client.close()
        s0.close()
        s1.close()

    asyncio.run(run())


def test_a_connection_broken_before_any_token_reroutes_the_call_and_leaves_the_instance_in():
    """Each instance breaks the call's first attempt on it (no answer: as a keep-alive
    connection its server had just closed, or a front end whose loop was held past the
    connect timeout, looks). The call is routed on, then back, and gets its whole answer;
    both instances stay in rotation, since the health checks, not one broken connection,
    say when an instance is gone. A refused connection (nothing listens) is out at once."""
    from serving.backends.base import GenRequest
    from serving.backends.remote import RemoteBackend
    from serving.settings import Settings
    from triage.classes import load_classes

    async def run():
        seen0, seen1 = [], []
        s0 = await _completions_server(seen0, asyncio.Event(), 3, breaks=1)
        s1 = await _completions_server(seen1, asyncio.Event(), 3, breaks=1)
        urls = ",".join(f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in (s0, s1))
        b = RemoteBackend(Settings(backend="remote", instances=urls, db_url="sqlite:////tmp/unused.db",
                                   router="round_robin"), load_classes())
        b._client = aiohttp.ClientSession()
        for i in b.instances:
            i.checked, i.has_triage, i.state = True, True, UP
        req = GenRequest("call-1", "Chest pain, sweating.", 3, 1, 0.8, 0.12, 3, time.time(), 6)
        events = await _collect(b.generate(req))
        assert "".join(e.text for e in events) == "t0 t1 t2 " and events[-1].finished
        assert len(seen0) + len(seen1) == 3          # broken on one, broken on the other, served
        assert b.dispatch.rerouted == 2
        assert [i.state for i in b.instances] == [UP, UP]
        assert [i.counters["went_down"] for i in b.instances] == [0, 0]
        s0.close()
        await s0.wait_closed()                       # nothing listens on instance 0 now
        for rid in ("call-2", "call-3"):                 # round robin sends one of them to instance 0
            events = await _collect(b.generate(GenRequest(rid, "Sprained ankle.", 3, 5, 16.0, 1.0, 3, time.time(), 6)))
            assert events[-1].finished
        assert b.instances[0].state == DOWN
        assert "ClientConnectorError" in b.instances[0].reason and b.instances[1].state == UP
        await b._client.close()
        s1.close()

    asyncio.run(run())


def test_a_call_waits_for_an_instance_to_rejoin_from_when_none_was_left(monkeypatch):
    """A call that spent longer than NO_INSTANCE_WAIT_S on an attempt (its instance held it,
    then went down) still waits up to NO_INSTANCE_WAIT_S for an instance to rejoin before it
    fails: the wait counts from when none was left, not from its arrival."""
    import serving.backends.remote as remote
    from serving.backends.base import GenRequest
    from serving.settings import Settings
    from triage.classes import load_classes

    monkeypatch.setattr(remote, "NO_INSTANCE_WAIT_S", 1.0)

    async def run():
        seen0, seen1 = [], []
        held = asyncio.Event()

        async def handle(reader, writer):                 # instance 0: holds the call 1.2 s, then breaks
            head = await reader.readuntil(b"\r\n\r\n")
            seen0.append(head)
            held.set()
            await asyncio.sleep(1.2)
            writer.close()

        s0 = await asyncio.start_server(handle, "127.0.0.1", 0)
        s1 = await _completions_server(seen1, asyncio.Event(), 3)
        urls = ",".join(f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in (s0, s1))
        b = remote.RemoteBackend(Settings(backend="remote", instances=urls, db_url="sqlite:////tmp/unused.db"),
                                 load_classes())
        b._client = aiohttp.ClientSession()
        i0, i1 = b.instances
        for i in b.instances:
            i.checked, i.has_triage = True, True
        i0.state, i1.state = UP, DOWN
        req = GenRequest("call-1", "Chest pain, sweating.", 3, 1, 0.8, 0.12, 3, time.time(), 6)
        task = asyncio.create_task(_collect(b.generate(req)))
        await asyncio.wait_for(held.wait(), 5.0)
        i0.mark_down("the health checks lost it")        # while it holds the call
        await asyncio.sleep(1.2 + 0.3)                   # the call has been out 1.5 s, none in rotation 0.3 s
        i1.state = UP                                    # instance 1 rejoins
        events = await asyncio.wait_for(task, 5.0)
        assert "".join(e.text for e in events) == "t0 t1 t2 " and len(seen1) == 1
        await b._client.close()
        s0.close()
        s1.close()

    asyncio.run(run())


async def _collect(gen):
    return [ev async for ev in gen]


def test_every_instance_in_rotation_schedules_with_the_front_ends_class_table():
    """The class table reaches each instance at an edit, and again when one missed it (out of
    rotation at the time), restarted with the table it started with (its snapshot shows
    another version), or refused it (answered 5xx): the front end's and the engines' notion
    of each level's weight and SLOs never part for longer than a health period."""
    from aiohttp import web

    from serving.backends.remote import RemoteBackend
    from serving.settings import Settings
    from triage.classes import PriorityClasses, load_classes

    async def run():
        got: list[list[int]] = [[], []]
        refuse = [1, 0]   # instance 0 refuses its first push

        def app(k):
            async def classes(request):
                body = await request.json()
                if refuse[k]:
                    refuse[k] -= 1
                    return web.json_response({"error": "engine busy"}, status=503)
                got[k].append(body["version"])
                return web.json_response({"ok": True}, status=202)
            a = web.Application()
            a.router.add_post("/triage/classes", classes)
            return a

        runners = [web.AppRunner(app(k)) for k in range(2)]
        ports = []
        for r in runners:
            await r.setup()
            site = web.TCPSite(r, "127.0.0.1", 0)
            await site.start()
            ports.append(site._server.sockets[0].getsockname()[1])
        urls = ",".join(f"http://127.0.0.1:{p}" for p in ports)
        base = load_classes()
        b = RemoteBackend(Settings(backend="remote", instances=urls, db_url="sqlite:////tmp/unused.db"), base)
        b._client = aiohttp.ClientSession()
        i0, i1 = b.instances
        for i in b.instances:
            i.checked, i.has_triage, i.classes_version = True, True, base.version
        i0.state, i1.state = UP, DOWN
        try:
            await b.push_classes()                    # start: instance 0 refuses, 1 is out
            assert got == [[], []]
            await b.push_classes()                    # the next health period: 0 takes it
            assert got == [[base.version], []]
            edited = PriorityClasses(base.classes, base.version + 1, base.w_first, base.w_decode)
            await b.set_classes(edited)               # an edit while 1 is still out
            assert got == [[base.version, edited.version], []]
            i1.state = UP                             # 1 rejoins: it gets the table it missed
            await b.push_classes()
            assert got == [[base.version, edited.version], [edited.version]]
            await b.push_classes()                    # nothing to do: no push repeated
            assert got == [[base.version, edited.version], [edited.version]]
            i0.mark_down("restarted")                 # 0 comes back restarted, at its start-up table
            i0.state = UP
            i0.take_snapshot({"classes_version": base.version}, time.time())
            await b.push_classes()
            assert got[0] == [base.version, edited.version, edited.version] and i0.classes_version == edited.version
        finally:
            await b._client.close()
            for r in runners:
                await r.cleanup()

    asyncio.run(run())
