"""The remote backend: several `triage instance` servers (stock vLLM API servers with our
scheduler class) behind the router the simulator uses.

    triage serve --backend remote --instances http://h1:8001,http://h2:8001 [--router gorouting]

For each admitted request: the router (`triage.routing`: gorouting by default, min_load,
pab, round_robin; the very class `simulate --instances` runs) picks one of the
instances in rotation from their live state (`remote_instances`); the request is
streamed from that instance's `/v1/completions` with

    "priority": level                     (vLLM's own field: stock priority scheduling agrees)
    "vllm_xargs": {"triage_level", "triage_ttft_slo", "triage_tpot_slo",
                   "triage_predicted_output_len", "triage_waited_s", "triage_id"}
    headers  X-Vllm-Priority, x-llm-d-slo-ttft-ms, x-llm-d-slo-tpot-ms, X-Triage-Level

and the router hears `on_dispatch`, `on_first_token`, `on_finish` as in the simulator.
The front end renders chat prompts and counts tokens with the served model's tokenizer,
read locally (the same files the instances serve: `--model` or the prepared default).

Faults: a request whose instance refuses the connection, breaks, or answers 503 (vLLM's
`--max-num-queued-reqs`) before any token came back is routed again among the others
(at most `2 x instances` tries, each avoiding the instances it already failed on). A
refused connection takes the instance out of rotation at once; a connect timeout or a
broken connection before any token does not by itself (the health checks decide, as for
their own GETs): once in `bench cluster` the front end's event loop was held for 19.6 s
outside any Python code (the VM's doing), and on waking it saw a connect timeout on one
instance and a reset keep-alive connection on the other, took both out and failed a call
with a 503 while both served. One that breaks after tokens were streamed is *resumed* on
another instance: the front end holds the prompt's token ids (vLLM returns them with
the first chunk, `return_token_ids`) and every output token id it passed on, and sends
`prompt_ids + output_ids` with the remaining `max_tokens` (and `min_tokens`), so the
client's stream goes on where it stopped: token for token the same under greedy
decoding, a fresh sample of the rest under temperature > 0 (at most `RESUME_MAX` times
a request; the audit row names the last instance). What cannot be resumed (no instance
left in rotation within `NO_INSTANCE_WAIT_S`, or a stream whose ids are incomplete) ends
with an `InstanceLost` error (the client sees an error event naming the instance and the
tokens it got; the audit row says outcome `error`). Text an instance's detokenizer held
back when it died (the first bytes of a multi-byte character, a possible stop-string
prefix) is lost, and a stop string spanning the break is not matched. When every
instance in rotation refuses with 503, the least urgent are shed: a request below the
most urgent level fails with `InstancesFull` (HTTP 503 to the client), a most-urgent
one keeps trying for up to `URGENT_WAIT_S`. While no instance at all is in rotation, a
request that has not started waits up to `NO_INSTANCE_WAIT_S` (from when it found none,
not from its arrival) for one to rejoin, then fails with `InstancesUnavailable` naming
every instance and why.

Moves (`remote_steal`, not a fault): a call that has waited on one instance without starting
while another has a free seat and nothing queued is taken off the first (its stream closed)
and sent to the second, once (`rebalance_once`; triage.routing.rebalance decides).

The streams and polls go through aiohttp, not httpx: in a burst the front end holds a stream
per call in flight (196 at once in `bench cluster`'s), and httpx's connection pool and
pure-Python HTTP parsing cost more CPU a call the more streams are open (encode/httpx#3215). With
two stand-in instances the front end's CPU went from 13.7-13.9 to 11.6-13.4 CPU-ms a call
(docs/measurements/cluster.md, 2026-12-05): CPU taken from the engines wherever they share the
front end's cores.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

import aiohttp

from serving.backends.base import BackendRefused, GenRequest, TokenEvent
from serving.backends.remote_instances import CLIENT_ERRORS, REFUSED, UP, Dispatch, RemoteInstance, Timing
from serving.instance.fields import wire_xargs
from triage.classes import PriorityClasses
from triage.request import Request
from triage.routing import make_router

log = logging.getLogger(__name__)

URGENT_WAIT_S = 30.0
NO_INSTANCE_WAIT_S = 10.0   # a request not yet started waits this long for an instance to rejoin
RESUME_MAX = 2              # mid-stream resumptions of one request on another instance


class VLLMClientError(ValueError):
    """Named like vLLM's request-validation error: the API answers it with a 400."""

    def __init__(self, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


class InstanceRejected(VLLMClientError):
    """An instance refused the request's parameters (HTTP 400 from vLLM), relayed."""


class InstanceLost(RuntimeError):
    """The instance streaming a request failed after tokens had been sent."""

    client_message = True   # the API shows the message (no prompt text in it)


class InstancesUnavailable(RuntimeError):
    """No instance is in rotation."""

    client_message = True   # the API shows the message (no prompt text in it)


class InstancesFull(RuntimeError):
    """Every instance in rotation refused with 503 (queue full): the request was shed."""

    client_message = True   # the API shows the message (no prompt text in it)


# a relayed stream: no overall or read timeout (an answer streams for as long as it takes), 2 s to connect
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=2.0)


async def sse_lines(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The lines of a streamed response, of any length (aiohttp's own line reader refuses a
    line longer than its buffer; a first chunk carries the prompt's token ids)."""
    buf = bytearray()
    async for chunk in resp.content.iter_any():
        buf += chunk
        if b"\n" not in chunk:
            continue
        *lines, rest = bytes(buf).split(b"\n")
        buf = bytearray(rest)
        for line in lines:
            yield line.rstrip(b"\r").decode()
    if buf:
        yield bytes(buf).rstrip(b"\r").decode()


class _Retry(Exception):
    def __init__(self, why: str, full: bool = False, moved: bool = False, down: bool = True) -> None:
        super().__init__(why)
        self.full = full
        self.moved = moved      # taken off the instance it waited on, for a free seat elsewhere (rebalance)
        self.down = down        # the failure takes the instance out of rotation (else health decides)


@dataclass
class _Progress:
    """What one request has streamed so far, over all its attempts: what a resumption on
    another instance needs."""

    prompt_ids: list[int] | None = None   # the prompt as the first instance tokenized it
    out_ids: list[int] = field(default_factory=list)   # every output token id passed on
    n_out: int = 0                        # output tokens passed on (the instances' count)
    prompt_tokens: int = 0
    resumed: int = 0
    failed_on: set[int] = field(default_factory=set)   # instances it failed on (its next try avoids them)

    @property
    def resumable(self) -> bool:
        return self.prompt_ids is not None and self.n_out > 0 and len(self.out_ids) == self.n_out


def _load_tokenizer(d: Path):
    """The served model's tokenizer. Where it ships a `tokenizer.json`, transformers' fast
    tokenizer reads it directly (for SmolLM2 the class `AutoTokenizer` picks too; the same
    chat template, special tokens and ids): `AutoTokenizer` would import torch (~5 s and
    ~500 MB in a front end that runs no model) only to choose the class."""
    if (d / "tokenizer.json").exists():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(d))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(d))


def parse_instances(value: str | list[str] | None) -> list[str]:
    """Comma-separated (or a list of) http(s) URLs, each once; a clear error otherwise."""
    items = value if isinstance(value, list) else [x for x in (value or "").split(",")]
    urls: list[str] = []
    for x in (i.strip().rstrip("/") for i in items):
        if not x:
            continue
        if not (x.startswith("http://") or x.startswith("https://")) or len(x.split("://", 1)[1]) == 0:
            raise ValueError(f"instance URL {x!r} must start with http:// or https://")
        if x in urls:
            raise ValueError(f"instance URL {x!r} is given twice")
        urls.append(x)
    if not urls:
        raise ValueError("the remote backend needs at least one instance URL (--instances / TRIAGE_INSTANCES)")
    return urls


class RemoteBackend:
    name = "remote"

    def __init__(self, settings, classes: PriorityClasses, metrics=None) -> None:
        from triage.profiles import load_profile
        from serving.backends.vllm_backend import engine_profile

        self.settings = settings
        self.classes = classes
        self.metrics = metrics
        self.urls = parse_instances(settings.instances)
        self.router_name = settings.router
        self.router = make_router(settings.router)
        self.profile = load_profile(engine_profile(settings.profile))
        pol_order = self.profile.raw.get("policy_params", {}).get(settings.policy, {}).get("order")

        class _Local:   # the instances' local scheduler, as GoRouting's view="auto" reads it
            queue_order = "level" if pol_order == "level" or settings.policy in ("triage", "slidebatching") else "arrival"

        self.router.bind_policy(_Local)
        self.timing = timing = Timing(poll_s=settings.remote_poll_s, idle_poll_s=settings.remote_idle_poll_s,
                                      down_after_s=settings.remote_down_after_s,
                                      max_stale_s=settings.remote_max_stale_s)
        self.instances = [RemoteInstance(i, u, self.profile.estimator(), timing) for i, u in enumerate(self.urls)]
        self.instance = "remote"
        self.dispatch = Dispatch()
        self._classes_warned: dict[str, int] = {}
        self._where: dict[str, RemoteInstance] = {}
        self._aborted: set[str] = set()
        self._moving: dict[str, int] = {}   # id -> the instance it is being moved to (rebalance)
        self._moved: set[str] = set()       # ids moved once (they stay where they went)
        self._responses: dict[str, aiohttp.ClientResponse] = {}
        self._client: aiohttp.ClientSession | None = None        # the relayed streams and one-off posts
        self._poll_client: aiohttp.ClientSession | None = None   # health and load polls
        self._tasks: list[asyncio.Task] = []
        self._tokenizer = None
        self._defaults: dict = {}
        self.model_dir: Path | None = None
        self._m = self._register_metrics(metrics)

    def _register_metrics(self, metrics) -> dict:
        """Per-instance series on the service's registry (docs/grafana/triage-cluster.json)."""
        if metrics is None or getattr(metrics, "registry", None) is None:
            return {}
        from prometheus_client import Counter, Gauge

        r = metrics.registry
        up = Gauge("triage_instance_up", "1 while an engine instance is in rotation (0 down, -1 refused)",
                   ["instance"], registry=r)
        inflight = Gauge("triage_instance_in_flight", "Requests this front end has on the instance", ["instance"],
                         registry=r)
        for i in self.instances:
            up.labels(i.url).set_function(lambda i=i: 1.0 if i.state == UP else (-1.0 if i.state == REFUSED else 0.0))
            inflight.labels(i.url).set_function(lambda i=i: float(len(i.sent)))
        return {"routed": Counter("triage_routed_total", "Requests dispatched, by instance and router",
                                  ["instance", "router"], registry=r),
                "rerouted": Counter("triage_rerouted_total", "Requests sent again elsewhere: before any token "
                                    "(queue_full, instance_fault), resumed after tokens (resumed_midstream), or "
                                    "moved from a wait for a seat to a free one (seat_move)",
                                    ["reason"], registry=r),
                "lost": Counter("triage_instance_lost_total", "Streams ended by an instance fault after tokens",
                                ["instance"], registry=r)}

    # --- lifecycle -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return any(i.available for i in self.instances)

    @property
    def max_model_len(self) -> int:
        lens = [i.max_model_len for i in self.instances if i.max_model_len and i.state != REFUSED]
        return min([int(self.settings.max_model_len), *lens])

    @property
    def sampling_defaults(self) -> dict:
        return dict(self._defaults)

    @property
    def vocab_size(self) -> int | None:
        return len(self._tokenizer) if self._tokenizer is not None else None

    async def start(self) -> None:
        from serving.model_prep import default_model_dir, generation_defaults

        d = Path(self.settings.model) if self.settings.model else default_model_dir()
        if not (d / "tokenizer_config.json").exists() and not (d / "tokenizer.json").exists():
            raise RuntimeError(f"the remote backend renders prompts with the served model's tokenizer and finds none "
                               f"in {d}: run `triage models prepare` or give --model DIR (the instances' model)")
        self.model_dir = d
        self._tokenizer = await asyncio.to_thread(_load_tokenizer, d)
        self._defaults = generation_defaults(d)
        self._client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4096, limit_per_host=0),
                                             timeout=STREAM_TIMEOUT)
        # a session of its own: health and load polls never queue behind streams
        self._poll_client = poll = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
        model = self.settings.served_model_name
        await asyncio.gather(*(i.check_config(poll, model, self.settings.remote_require_triage)
                               for i in self.instances))
        for i in self.instances:
            if i.state == UP:
                log.info("instance %s in rotation (%s)", i.url,
                         "our scheduler class" if i.has_triage else "stock vLLM, load from /metrics")
            else:
                log.error("instance %s NOT in rotation: %s", i.url, i.reason)
            self._tasks.append(asyncio.create_task(i.health_loop(poll, model, self.settings.remote_require_triage),
                                                   name=f"health-{i.index}"))
            self._tasks.append(asyncio.create_task(i.load_loop(poll), name=f"load-{i.index}"))
        await self.push_classes()   # this front end's table (the latest version in its database)
        self._tasks.append(asyncio.create_task(self._classes_loop(), name="classes"))
        if self.settings.remote_steal and len(self.instances) > 1:
            self._tasks.append(asyncio.create_task(self._rebalance_loop(), name="rebalance"))
        log.info("remote backend: router %s over %d instances (%d in rotation)", self.router_name,
                 len(self.instances), sum(i.available for i in self.instances))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        for session in (self._client, self._poll_client):
            if session is not None:
                await session.close()

    def set_on_up(self, fn) -> None:
        """`fn()` runs whenever an instance rejoins the rotation (the front end looks at
        its queue again: calls held while none was up go at once)."""
        for i in self.instances:
            i.on_up = fn

    def instances_status(self) -> list[dict]:
        return [i.status() for i in self.instances]

    # --- text ------------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def render_chat(self, messages: list[dict]) -> str:
        return self._tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    # --- routing ---------------------------------------------------------------------------
    def _router_request(self, req: GenRequest) -> Request:
        c = self.classes.get(req.level) if req.level in self.classes.classes else None
        return Request(id=req.request_id, arrival=req.arrival, prompt_len=max(1, req.prompt_tokens),
                       predicted_level=req.level, ttft_slo=req.ttft_slo, tpot_slo=req.tpot_slo,
                       weight=c.weight if c else 1.0, predicted_output_len=max(1, req.predicted_output_len),
                       output_len=req.max_tokens)

    def _pick(self, r: Request, now: float, avoid: set[int] = frozenset(), only: int | None = None) -> RemoteInstance | None:
        pool = [i for i in self.instances if i.available and i.full_until <= now]
        if only is not None and (to := next((i for i in pool if i.index == only), None)) is not None:
            return to               # a move: rebalance chose the instance
        pool = [i for i in pool if i.index not in avoid] or pool   # a resumption goes elsewhere if it can
        if not pool:
            return None
        return pool[self.router.route(r, pool, now)]

    def instance_for(self, request_id: str) -> str | None:
        """The URL of the instance that served (last tried) `request_id`, for its audit
        row; called once when the request finishes, and forgets it."""
        i = self._where.pop(request_id, None)
        return i.url if i is not None else None

    # --- requests --------------------------------------------------------------------------
    async def generate(self, req: GenRequest) -> AsyncIterator[TokenEvent]:
        r = self._router_request(req)
        tries = 0
        started_at = time.time()
        urgent = req.level <= self.classes.most_urgent
        prog = _Progress(prompt_tokens=req.prompt_tokens)
        move_to = None
        none_up_since = None      # when this request found no instance in rotation
        while True:
            now = time.time()
            inst = self._pick(r, now, prog.failed_on, move_to)
            move_to = None
            if inst is None:
                up = [i for i in self.instances if i.available]
                if not up:   # one may rejoin (a slow /health): wait from when none was left, not from arrival
                    none_up_since = none_up_since or now
                    if now - none_up_since < NO_INSTANCE_WAIT_S:
                        await asyncio.sleep(0.2)
                        continue
                    raise InstancesUnavailable(
                        "no engine instance is in rotation: " + "; ".join(f"{i.url}: {i.reason}" for i in self.instances))
                if not urgent:
                    raise InstancesFull("every engine instance refused the request (queue full, HTTP 503); "
                                        f"shed at level {req.level}")
                if now - started_at > URGENT_WAIT_S:
                    raise InstancesFull(f"every engine instance refused for {URGENT_WAIT_S:.0f} s")
                await asyncio.sleep(0.1)
                continue
            tries += 1
            none_up_since = None
            self._where[req.request_id] = inst
            self.router.on_dispatch(r, inst.index, now, inst)
            inst.on_sent(r, now)
            self.dispatch.routed += 1
            self.dispatch.by_instance[inst.url] = self.dispatch.by_instance.get(inst.url, 0) + 1
            if self._m:
                self._m["routed"].labels(inst.url, self.router_name).inc()
            try:
                async for ev in self._stream(inst, req, r, prog):
                    yield ev
                return
            except _Retry as e:
                if req.request_id in self._aborted:
                    yield TokenEvent(req.request_id, "", [], time.time(), True, "abort", req.prompt_tokens, 0)
                    return
                if e.moved:
                    move_to = self._moving.pop(req.request_id, None)   # (it stays in _moved: it moves once)
                    self.dispatch.moved += 1
                    if self._m:
                        self._m["rerouted"].labels("seat_move").inc()
                    continue
                if e.full:
                    inst.full_until = time.time() + inst.timing.full_backoff_s
                    inst.counters["refused_503"] += 1
                    self.dispatch.refused_503 += 1
                else:
                    prog.failed_on.add(inst.index)     # its next try goes elsewhere if it can
                    if e.down:
                        inst.mark_down(str(e))
                    inst.counters["errors"] += 1
                if tries >= 2 * len(self.instances) and not (e.full and urgent):
                    raise InstancesUnavailable(f"request {req.request_id} failed on {tries} tries; last: {e}") from None
                self.dispatch.rerouted += 1
                if self._m:
                    self._m["rerouted"].labels("queue_full" if e.full else "instance_fault").inc()
                log.warning("request %s re-routed (no token sent yet): %s on %s", req.request_id, e, inst.url)
                continue
            except InstanceLost as e:
                inst.counters["errors"] += 1
                prog.failed_on.add(inst.index)
                if prog.prompt_ids is None and prog.n_out and self._tokenizer is not None:
                    prog.prompt_ids = self._tokenizer(req.prompt)["input_ids"]   # as vLLM's completions tokenize
                if prog.resumable and prog.resumed < RESUME_MAX and req.request_id not in self._aborted:
                    prog.resumed += 1
                    self.dispatch.resumed += 1
                    if self._m:
                        self._m["rerouted"].labels("resumed_midstream").inc()
                    log.warning("request %s resumed elsewhere after %d tokens: %s", req.request_id, prog.n_out, e)
                    started_at, tries = time.time(), 0   # it may wait for an instance as a new request does
                    continue
                self.dispatch.lost_midstream += 1
                if self._m:
                    self._m["lost"].labels(inst.url).inc()
                raise
            finally:
                t = time.time()
                inst.on_done(r.id, t)
                self.router.on_finish(r, inst.index, t)
                self._responses.pop(req.request_id, None)
                self._aborted.discard(req.request_id)
                if move_to is None:
                    self._moved.discard(req.request_id)

    def _body(self, req: GenRequest, prog: _Progress) -> dict:
        """The instance's /v1/completions body; with `prog` holding tokens already sent, the
        resumption: prompt ids + output ids, the remaining max_tokens and min_tokens."""
        done = prog.n_out
        sampling = {**self._defaults, **req.sampling}
        prompt = prog.prompt_ids + prog.out_ids if done else req.prompt
        body = {"model": self.settings.served_model_name, "prompt": prompt, "max_tokens": req.max_tokens - done,
                "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                "priority": int(req.level), "return_token_ids": True,
                "vllm_xargs": wire_xargs(request_id=req.request_id, level=req.level, ttft_slo=req.ttft_slo,
                                         tpot_slo=req.tpot_slo, predicted_output_len=max(1, req.predicted_output_len - done),
                                         waited_s=time.time() - req.arrival)}
        if req.stream_interval is not None:
            body["stream_interval"] = req.stream_interval
        for k, v in sampling.items():
            if k == "logit_bias":
                v = {str(t): b for t, b in v.items()}
            elif k == "min_tokens":
                v = max(0, int(v) - done)
            body[k] = v
        return body

    @staticmethod
    def _headers(req: GenRequest) -> dict:
        return {"X-Vllm-Priority": str(int(req.level)), "X-Triage-Level": str(int(req.level)),
                "X-Request-Id": req.request_id, "x-llm-d-slo-ttft-ms": str(round(req.ttft_slo * 1000)),
                "x-llm-d-slo-tpot-ms": str(round(req.tpot_slo * 1000))}

    async def _stream(self, inst: RemoteInstance, req: GenRequest, r: Request,
                      prog: _Progress) -> AsyncIterator[TokenEvent]:
        """One attempt on one instance, from where `prog` stands. Raises `_Retry` while this
        attempt sent no token, `InstanceLost` after, a `VLLMClientError` for the instance's
        400s. Token counts in the events are the request's own (all attempts)."""
        assert self._client is not None
        n_out = 0            # this attempt's tokens
        base = prog.n_out    # sent by earlier attempts
        try:
            async with self._client.post(inst.url + "/v1/completions", json=self._body(req, prog),
                                         headers=self._headers(req)) as resp:
                if resp.status != 200:
                    text = (await resp.read())[:500].decode(errors="replace")
                    if resp.status == 503:
                        raise _Retry(f"HTTP 503 (queue full): {text[:120]}", full=True)
                    if resp.status in (400, 422):
                        try:
                            err = json.loads(text).get("error", {})
                            msg = err.get("message", text) if isinstance(err, dict) else str(err)
                        except ValueError:
                            msg = text
                        raise InstanceRejected(f"the engine refused the request: {msg}")
                    raise _Retry(f"HTTP {resp.status} from {inst.url}: {text[:120]}")
                self._responses[req.request_id] = resp
                async for line in sse_lines(resp):
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if "error" in obj:
                        msg = obj["error"].get("message") if isinstance(obj["error"], dict) else obj["error"]
                        raise _Retry(f"engine error: {msg}") if n_out == 0 else InstanceLost(
                            f"engine instance {inst.url} failed after {n_out} tokens: {msg}")
                    usage = obj.get("usage") or {}
                    if usage.get("prompt_tokens") and not base:
                        prog.prompt_tokens = int(usage["prompt_tokens"])
                    for ch in obj.get("choices") or []:
                        if prog.prompt_ids is None and ch.get("prompt_token_ids"):
                            prog.prompt_ids = list(ch["prompt_token_ids"])
                        ids = list(ch.get("token_ids") or [])
                        text = ch.get("text") or ""
                        fin = ch.get("finish_reason")
                        total = int(usage.get("completion_tokens") or (n_out + len(ids)))
                        now = time.time()
                        if total > n_out and n_out == 0:
                            self.router.on_first_token(r, inst.index, now)
                        n_out = max(n_out, total)
                        r.generated = base + n_out      # the router's remaining-tokens estimate
                        inst.on_token(req.request_id, n_out, now)
                        if not (ids or text or fin):
                            continue
                        prog.out_ids.extend(ids)
                        prog.n_out = base + n_out
                        yield TokenEvent(req.request_id, text, ids, now, fin is not None, fin, prog.prompt_tokens,
                                         prog.n_out)
                        if fin is not None:
                            return
            if req.request_id in self._aborted:
                yield TokenEvent(req.request_id, "", [], time.time(), True, "abort", prog.prompt_tokens, prog.n_out)
                return
            self._was_moved(req.request_id, inst, n_out, prog)
            raise (_Retry("the stream ended without a finish reason") if n_out == 0 else InstanceLost(
                f"engine instance {inst.url} ended the stream after {prog.n_out} tokens without finishing"))
        except CLIENT_ERRORS as e:
            if req.request_id in self._aborted:
                yield TokenEvent(req.request_id, "", [], time.time(), True, "abort", prog.prompt_tokens, prog.n_out)
                return
            self._was_moved(req.request_id, inst, n_out, prog)
            why = f"{type(e).__name__} from {inst.url}"
            if n_out == 0:
                # nothing listens there: out of rotation now. A timeout or a broken connection
                # alone is not a dead instance (a keep-alive connection its server had just
                # closed; this front end's own loop held past the connect timeout): the
                # request goes elsewhere and the health checks decide (remote_instances)
                raise _Retry(why, down=isinstance(e, aiohttp.ClientConnectorError)) from None
            inst.mark_down(why)
            raise InstanceLost(f"engine instance {inst.url} failed after {prog.n_out} tokens ({type(e).__name__})") from None

    def _was_moved(self, rid: str, inst: RemoteInstance, n_out: int, prog: _Progress) -> None:
        """The stream to `inst` was closed by `_rebalance_loop`: go to the free seat (a
        token that came back meanwhile makes it a resumption there)."""
        if rid not in self._moving:
            return
        if n_out == 0:
            raise _Retry(f"moved off {inst.url} to a free seat", moved=True) from None
        self._moving.pop(rid, None)
        raise InstanceLost(f"moved off {inst.url} after {prog.n_out} tokens") from None

    async def _rebalance_loop(self) -> None:
        while True:
            await asyncio.sleep(self.instances[0].timing.poll_s)
            try:
                await self.rebalance_once()
            except Exception:   # a snapshot it cannot read must not end the moves for good
                log.exception("seat stealing failed this round")

    async def rebalance_once(self) -> int:
        """Seat stealing (triage.routing.rebalance), run every poll period: a call that has
        waited on one instance without starting moves to an instance with a free seat and
        nothing queued. The stream to the old instance is closed (vLLM aborts the call, which
        had nothing computed) and `generate` dispatches it to the new one. Returns the moves."""
        from triage.routing.rebalance import seat_moves

        now = time.time()
        pool = [i for i in self.instances if i.available and i.full_until <= now]
        n = 0
        if len(pool) < 2 or not self._responses:   # nothing streaming: nothing to move
            return 0
        for rid, src, dst in seat_moves(pool, now, self._moved):
            resp = self._responses.get(rid)
            if resp is None or rid in self._aborted:
                continue
            self._moved.add(rid)
            self._moving[rid] = dst
            log.info("request %s moves from %s to a free seat on %s", rid, self.instances[src].url,
                     self.instances[dst].url)
            resp.close()
            n += 1
        return n

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)
        resp = self._responses.get(request_id)
        if resp is not None:
            resp.close()   # closing the stream makes vLLM abort the request

    async def relabel(self, request_id: str, level: int) -> None:
        inst = self._where.get(request_id)
        s = inst.sent.get(request_id) if inst is not None else None
        if s is not None:
            s.req.override_level = int(level)
        if inst is None or self._client is None or not inst.has_triage:
            return
        try:
            async with self._client.post(inst.url + "/triage/relabel", json={"id": request_id, "level": int(level)},
                                         timeout=aiohttp.ClientTimeout(total=2.0)) as r:
                if r.status >= 300:
                    raise ValueError(f"answered {r.status}: {(await r.text())[:200]}")
        except (*CLIENT_ERRORS, ValueError) as e:
            log.warning("relabel of %s on %s failed: %s", request_id, inst.url, e)

    async def reset_prefix_cache(self) -> bool:
        """Empty every instance's prefix cache through vLLM's own endpoint (only served by
        an instance started with VLLM_SERVER_DEV_MODE=1); False while one still holds blocks."""
        if self._client is None:
            return False
        done = True
        for i in self.instances:
            if not i.available:
                continue
            try:
                async with self._client.post(i.url + "/reset_prefix_cache", timeout=aiohttp.ClientTimeout(total=30.0)) as r:
                    if r.status == 404:
                        raise BackendRefused(f"instance {i.url} serves no /reset_prefix_cache "
                                             "(vLLM's dev endpoint: start it with VLLM_SERVER_DEV_MODE=1)")
                    done = done and r.status == 200 and bool((await r.json(content_type=None)).get("success", True))
            except (*CLIENT_ERRORS, ValueError) as e:   # unreachable or not JSON: not emptied
                log.warning("prefix cache reset on %s failed: %s", i.url, e)
                done = False
        return done

    async def set_classes(self, classes: PriorityClasses) -> None:
        self.classes = classes
        await self.push_classes()

    async def push_classes(self) -> None:
        """Every instance in rotation that runs our scheduler schedules with this front end's
        class table: sent at each edit, once to each instance that joins or rejoins (it may
        have restarted with the table it started with, or missed an edit while out), and again
        whenever its snapshot shows another version or a push failed. Runs every health period."""
        if self._client is None:
            return
        v, table = self.classes.version, self.classes.to_dict()
        for i in self.instances:
            if not (i.available and i.has_triage) or (i.classes_sent == v and i.classes_version in (None, v)):
                continue
            try:
                async with self._client.post(i.url + "/triage/classes", json=table,
                                             timeout=aiohttp.ClientTimeout(total=2.0)) as r:
                    if r.status >= 300:
                        raise ValueError(f"answered {r.status}")
                i.classes_sent = i.classes_version = v
                log.info("instance %s schedules with class table version %d", i.url, v)
            except (*CLIENT_ERRORS, ValueError) as e:
                first = self._classes_warned.get(i.url) != v   # once per version and instance, then quietly
                self._classes_warned[i.url] = v
                (log.warning if first else log.debug)("class table version %d not taken by %s (%s); tried again "
                                                      "every %.1f s", v, i.url, e, self.timing.health_s)

    async def _classes_loop(self) -> None:
        while True:
            try:
                await self.push_classes()
            except Exception:   # one bad round must not end the syncing for good
                log.exception("class table sync failed this round")
            await asyncio.sleep(self.timing.health_s)

    def step_stats(self) -> dict:
        return {"router": self.router_name, **self.dispatch.as_dict(),
                "instances": [{"url": i.url, "state": i.state, "in_flight": len(i.sent), "source": i.load_source}
                              for i in self.instances]}
