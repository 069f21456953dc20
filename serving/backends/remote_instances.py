"""Remote engine instances as the router sees them: health, polled load, and the front
end's own ledger of what it sent (optimistic state).

Each `RemoteInstance` is an `InstanceLoad` (triage.routing.base) for the very router
objects the simulator uses. Its numbers come from three places, newest first:

1. the ledger: every request this front end has on the instance (added at dispatch,
   marked at first token, removed at finish). A request the last snapshot does not
   list yet counts as waiting (before its first token) or decoding (after);
2. the instance's snapshot, `GET /triage/load` (our scheduler class: every queued and
   running request with level, slack and predicted remaining tokens, free KV blocks,
   the estimator's coefficients and online beta), polled every `poll_s` while this
   front end is routing (a dispatch in the last `busy_s`; the first dispatch after a
   quiet spell polls at once), every `idle_poll_s` otherwise: a snapshot only informs
   routing decisions, and between a burst's last arrival and its last token there are
   none to make, while each poll costs the instance's engine a control call between two
   steps and both processes CPU on the engines' cores (a 196-call burst on two instances:
   ~45 polls each instead of ~145);
3. where the instance runs without our scheduler class: vLLM's own `/metrics`
   (`vllm:num_requests_waiting`, `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`
   with `vllm:cache_config_info`'s block count).

Staleness is bounded: a snapshot older than `max_stale_s` (default 2 s) is ignored and
the ledger alone speaks (with a single front end in front of the instance it knows
every request there; what it cannot know then is the engine's own order and its free
blocks). A fresh snapshot is at most `poll_s` plus one engine step old (the scheduler
answers between two steps).

Health: `GET /health` (vLLM's, answered by its API process without waiting for the
engine step) every `health_s`, unless a load poll was answered within `health_s` (an
answer to `/triage/load` comes from the engine itself, between two steps; `/metrics` from
the same API process as `/health`): while calls are routed, the polls every `poll_s` stand
in for it. Measured on a 2-core VM (py-spy, GIL samples over one 196-call burst on two
instances): the health loop's own GETs were ~10 % of the front end's Python time, taken
from the engines' cores. An instance is out of rotation at once when a connection
to it is refused or breaks (twice in a row: a server closing an idle keep-alive
connection breaks one request, measured in `bench cluster`), and when it has not answered
/health for `down_after_s` (default 1.5 s: within the 2 s the issue asks); a single slow
answer (a timeout) does not take it out: on a saturated 2-core host both instances once
missed a 1 s connect timeout in the same instant and the front end held every call, ESI-1
included, for up to 17 s. It rejoins after two good answers.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp
import numpy as np

from triage.estimators import LatencyEstimator
from triage.request import Request

log = logging.getLogger(__name__)

UP, DOWN, REFUSED = "up", "down", "refused"
TRIAGE_SCHEDULER = "TriageScheduler"
CLIENT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)   # unreachable, refused, broken, timed out


async def get(client: aiohttp.ClientSession, url: str, timeout_s: float) -> tuple[int, str, str]:
    """GET `url`: (status, content type, body text); a `CLIENT_ERRORS` where none came. The
    timeout bounds the connect and each read, not the whole answer: a saturated host that
    answers slowly but steadily is slow, not gone."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
    async with client.get(url, timeout=timeout) as r:
        return r.status, r.content_type, await r.text()


_METRIC = re.compile(r'^(vllm:[a-z_]+)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$')


@dataclass
class Sent:
    """A request this front end has on an instance."""

    req: Request
    at: float                   # time.time() when sent
    first: float | None = None  # first token came back
    tokens: int = 0


@dataclass
class Timing:
    poll_s: float = 0.25
    idle_poll_s: float = 1.0      # no dispatch for busy_s: poll this often (fresh within max_stale_s)
    busy_s: float = 1.0
    health_s: float = 0.5
    down_after_s: float = 1.5
    max_stale_s: float = 2.0
    timeout_s: float = 1.0
    full_backoff_s: float = 0.5   # after a 503 (vLLM's --max-num-queued-reqs): try others first


def parse_metrics(text: str) -> dict[str, float]:
    """The `vllm:*` gauges of a Prometheus text page (summed over label sets), plus
    `num_gpu_blocks` from `vllm:cache_config_info`'s labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + (0.0 if math.isnan(v) else v)
        if name == "vllm:cache_config_info" and labels:
            b = re.search(r'num_gpu_blocks="(\d+)"', labels)
            if b:
                out["num_gpu_blocks"] = float(b.group(1))
    return out


class RemoteInstance:
    role = "mixed"

    def __init__(self, index: int, url: str, estimator: LatencyEstimator, timing: Timing | None = None) -> None:
        self.index = index
        self.url = url.rstrip("/")
        self.estimator = estimator      # one object per instance, coefficients follow the snapshot
        self.timing = timing or Timing()
        self.state = DOWN
        self.reason: str | None = "not checked yet"
        self.checked = False            # configuration verified (model, scheduler class)
        self.has_triage: bool | None = None
        self.models: list[str] = []
        self.max_model_len: int | None = None
        self.snapshot: dict | None = None
        self.snap_at = 0.0              # time.time() when the snapshot arrived here
        self.classes_version: int | None = None   # the class table the engine schedules with (snapshot)
        self.classes_sent: int | None = None      # the front end's version it took since it joined
        self.metrics: dict[str, float] | None = None
        self.metrics_at = 0.0
        self.sent: dict[str, Sent] = {}
        self.done_recent: dict[str, float] = {}   # finished here since the snapshot was taken
        self.full_until = 0.0
        self.last_sent = 0.0            # time.time() of the last dispatch here (load_loop's pace)
        self._dispatched: asyncio.Event | None = None   # set by on_sent: load_loop polls now
        self.last_health = 0.0
        self._good_in_a_row = 0
        self.counters = {"sent": 0, "errors": 0, "refused_503": 0, "went_down": 0}
        self.on_up: Callable[[], None] | None = None   # told when the instance rejoins the rotation

    # --- health ----------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self.state == UP

    def mark_down(self, why: str) -> None:
        self.classes_sent = None   # it may come back restarted, with the class table it started with
        if self.state == UP:
            self.counters["went_down"] += 1
            log.warning("instance %s out of rotation: %s", self.url, why)
        if self.state != REFUSED:
            self.state = DOWN
            self.reason = why
        self._good_in_a_row = 0

    def refuse(self, why: str) -> None:
        if self.state != REFUSED:
            log.error("instance %s refused: %s", self.url, why)
        self.state = REFUSED
        self.reason = why

    def health_ok(self) -> None:
        self.last_health = time.time()
        self._good_in_a_row += 1
        if self.state == DOWN and self.checked and self._good_in_a_row >= 2:
            log.info("instance %s back in rotation", self.url)
            self._enter_rotation()

    def _enter_rotation(self) -> None:
        self.state, self.reason = UP, None
        if self.on_up is not None:   # calls held while no instance was up go now
            self.on_up()

    def heard_from(self, now: float) -> None:
        """A load poll was answered: the instance is alive, as a /health answer would say."""
        if self.state == UP:
            self.last_health = max(self.last_health, now)

    def check_stale_health(self, now: float) -> None:
        if self.state == UP and now - self.last_health > self.timing.down_after_s:
            self.mark_down(f"no answer to /health for {now - self.last_health:.1f} s")

    def status(self) -> dict:
        age = round(time.time() - self.snap_at, 3) if self.snapshot is not None else None
        return {"url": self.url, "index": self.index, "state": self.state, "reason": self.reason,
                "triage_scheduler": self.has_triage, "models": self.models, "max_model_len": self.max_model_len,
                "in_flight": len(self.sent), "load_source": self.load_source, "snapshot_age_s": age,
                **self.counters}

    @property
    def load_source(self) -> str:
        if self._fresh_snapshot() is not None:
            return "triage-load"
        if self.metrics is not None and time.time() - self.metrics_at <= self.timing.max_stale_s:
            return "vllm-metrics"
        return "ledger"

    # --- ledger ----------------------------------------------------------------------------
    def on_sent(self, r: Request, now: float) -> None:
        self.sent[r.id] = Sent(r, now)
        self.counters["sent"] += 1
        if self._dispatched is not None and now - self.last_sent > self.timing.busy_s:
            self._dispatched.set()      # routing again after a quiet spell: a fresh snapshot now
        self.last_sent = now

    def on_token(self, rid: str, n: int, now: float) -> None:
        s = self.sent.get(rid)
        if s is not None:
            if s.first is None:
                s.first = now
            s.tokens = n

    def on_done(self, rid: str, now: float) -> None:
        if self.sent.pop(rid, None) is not None:
            self.done_recent[rid] = now

    def take_snapshot(self, snap: dict, now: float) -> None:
        self.snapshot = snap
        self.snap_at = now
        if snap.get("classes_version") is not None:
            self.classes_version = int(snap["classes_version"])
        self.done_recent = {k: t for k, t in self.done_recent.items() if t > now - self.timing.poll_s * 4}
        e = snap.get("estimator") or {}
        for k in ("a_p", "b_p", "c_p", "a_d", "b_d", "t_c"):
            if k in e and hasattr(self.estimator, k):
                setattr(self.estimator, k, float(e[k]))
        if "beta" in e:
            self.estimator.beta = float(e["beta"])

    def _fresh_snapshot(self) -> dict | None:
        if self.snapshot is None or time.time() - self.snap_at > self.timing.max_stale_s:
            return None
        return self.snapshot

    def _view(self) -> tuple[list[dict], list[dict], list[Sent]]:
        """(waiting rows, running rows, ledger entries the snapshot does not list)."""
        snap = self._fresh_snapshot()
        if snap is None:
            return [], [], list(self.sent.values())
        gone = self.done_recent
        waiting = [r for r in snap.get("waiting", ()) if r["id"] not in gone]
        running = [r for r in snap.get("running", ()) if r["id"] not in gone]
        seen = {r["id"] for r in waiting} | {r["id"] for r in running}
        return waiting, running, [s for s in self.sent.values() if s.req.id not in seen]

    def _metrics_counts(self) -> tuple[int, int] | None:
        if self.metrics is None or time.time() - self.metrics_at > self.timing.max_stale_s:
            return None
        m = self.metrics
        return int(m.get("vllm:num_requests_waiting", 0)), int(m.get("vllm:num_requests_running", 0))

    # --- InstanceLoad ------------------------------------------------------------------------
    @property
    def seats(self) -> int | None:
        """The instance's max_num_seqs, from its last `/triage/load` (None before one)."""
        n = (self.snapshot or {}).get("max_num_seqs")
        return int(n) if n else None

    @property
    def n_waiting(self) -> int:
        w, _, extra = self._view()
        mc = self._metrics_counts() if self.snapshot is None else None
        if mc is not None:   # stock vLLM: its counts, plus what was sent since they were read
            return mc[0] + sum(1 for s in self.sent.values() if s.at > self.metrics_at and s.first is None)
        return len(w) + sum(1 for s in extra if s.first is None)

    @property
    def n_running(self) -> int:
        _, r, extra = self._view()
        mc = self._metrics_counts() if self.snapshot is None else None
        if mc is not None:
            return mc[1]
        return len(r) + sum(1 for s in extra if s.first is not None)

    @property
    def n_decoding(self) -> int:
        _, r, extra = self._view()
        return sum(1 for x in r if x["stage"] == "decoding") + sum(1 for s in extra if s.first is not None)

    @property
    def free_blocks(self) -> int:
        snap = self._fresh_snapshot()
        bs = 32
        if snap is not None:
            free, bs = int(snap.get("free_blocks", 0)), int(snap.get("block_size", 32))
        elif self.metrics is not None and "num_gpu_blocks" in self.metrics:
            free = int((1.0 - self.metrics.get("vllm:kv_cache_usage_perc", 0.0)) * self.metrics["num_gpu_blocks"])
        else:
            return 1 << 30
        _, _, extra = self._view()
        return max(0, free - sum(math.ceil(s.req.prompt_len / bs) for s in extra if s.first is None))

    @property
    def prefill_tokens(self) -> int:
        w, r, extra = self._view()
        return (sum(x["need"] for x in w) + sum(x["need"] for x in r if x["need"] > 1)
                + sum(s.req.prompt_len for s in extra if s.first is None))

    @property
    def output_tokens_left(self) -> int:
        """Predicted output tokens still to come over the calls here (the snapshot's
        `remaining`, the ledger's for calls it does not list yet)."""
        w, r, extra = self._view()
        return (sum(int(x["remaining"]) for x in w) + sum(int(x["remaining"]) for x in r)
                + sum(max(1, s.req.predicted_output_len - s.tokens) for s in extra))

    def waiting_calls(self, now: float) -> list[tuple[str, int, float, float, int]]:
        """This front end's calls the last snapshot lists as waiting with nothing computed
        and no token back yet: (id, level, first-token slack, seconds since sent here,
        predicted output tokens); triage.routing.rebalance."""
        w, _, _ = self._view()
        age = now - self.snap_at
        return [(x["id"], int(x["level"]), x["slack_s"] - age, now - s.at, int(x["remaining"])) for x in w
                if not x["computed"] and not x["generated"] and (s := self.sent.get(x["id"])) is not None
                and s.first is None]

    def decodes(self, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        _, r, extra = self._view()
        age = now - self.snap_at
        d = [(x["slack_s"] - age, x["computed"], x["tpot_slo"]) for x in r if x["stage"] == "decoding"]
        for s in extra:
            if s.first is not None:
                q = s.req
                d.append((q.arrival + q.ttft_slo + s.tokens * q.tpot_slo - now, q.prompt_len + s.tokens, q.tpot_slo))
        a = np.array(d, dtype=float).reshape(len(d), 3)
        return a[:, 0], a[:, 1], a[:, 2]

    # --- polling -----------------------------------------------------------------------------
    async def check_config(self, client: aiohttp.ClientSession, model: str, require_triage: bool) -> None:
        """Start-up (and rejoin) check: reachable, serves `model`, runs our scheduler."""
        t = self.timing
        try:
            status, _, body = await get(client, self.url + "/v1/models", max(3.0, t.timeout_s))
            if status != 200:
                raise ValueError(f"/v1/models answered {status}")
            data = json.loads(body).get("data") or []
        except (*CLIENT_ERRORS, ValueError) as e:
            self.mark_down(f"unreachable: {type(e).__name__}: {e}".strip())
            return
        self.models = [str(m.get("id")) for m in data]
        lens = [int(m["max_model_len"]) for m in data if m.get("max_model_len")]
        self.max_model_len = min(lens) if lens else None
        if model not in self.models:
            self.refuse(f"serves {self.models}, not {model!r}")
            return
        try:
            status, ctype, text = await get(client, self.url + "/triage/load", max(3.0, t.timeout_s))
            body = json.loads(text) if ctype == "application/json" else {}
        except (*CLIENT_ERRORS, ValueError) as e:
            self.mark_down(f"/triage/load failed: {type(e).__name__}")
            return
        self.has_triage = status == 200 and body.get("scheduler") == TRIAGE_SCHEDULER
        if self.has_triage:
            self.take_snapshot(body, time.time())
        elif require_triage:
            self.refuse("runs without our scheduler class (serving.vllm_scheduler.TriageScheduler): start it with "
                        f"`triage instance` (GET /triage/load answered {status})")
            return
        else:
            log.warning("instance %s runs without our scheduler class: vLLM's own priority scheduling, load "
                        "from its /metrics", self.url)
        self.checked = True
        self.last_health = time.time()
        self._good_in_a_row = 2
        self._enter_rotation()

    async def _health_once(self, client: aiohttp.ClientSession) -> None:
        status, _, _ = await get(client, self.url + "/health", self.timing.timeout_s)
        if status == 200:
            self.health_ok()
        else:
            self.mark_down(f"/health answered {status}")

    async def health_loop(self, client: aiohttp.ClientSession, model: str, require_triage: bool) -> None:
        t = self.timing
        while True:
            if self.state != REFUSED:
                if not self.checked:
                    await self.check_config(client, model, require_triage)
                elif self.state == UP and time.time() - self.last_health < t.health_s:
                    pass   # a load poll answered since the last check (heard_from)
                else:
                    try:
                        await self._health_once(client)
                    except asyncio.TimeoutError as e:
                        # slow, not gone: a saturated host (or this front end's own busy event
                        # loop) answers late; out of rotation when no answer came for down_after_s
                        log.debug("/health of %s: %s", self.url, type(e).__name__)
                    except aiohttp.ClientConnectionError as e:
                        # refused (nothing listens) or broken: one immediate retry tells a dead
                        # instance from a keep-alive connection its server had just closed
                        try:
                            await self._health_once(client)
                        except CLIENT_ERRORS:
                            self.mark_down(f"/health: {type(e).__name__}")
                    except aiohttp.ClientError as e:
                        log.debug("/health of %s: %s", self.url, type(e).__name__)
                    self.check_stale_health(time.time())
            await asyncio.sleep(t.health_s if self.checked else max(t.health_s, 1.0))

    async def load_loop(self, client: aiohttp.ClientSession) -> None:
        t = self.timing
        self._dispatched = asyncio.Event()
        while True:
            t0 = time.monotonic()
            self._dispatched.clear()
            if self.state == UP:
                try:
                    if self.has_triage:
                        status, _, text = await get(client, self.url + "/triage/load", t.max_stale_s)
                        if status == 200:
                            now = time.time()
                            self.take_snapshot(json.loads(text), now)
                            self.heard_from(now)
                    else:
                        status, _, text = await get(client, self.url + "/metrics", t.max_stale_s)
                        if status == 200:
                            self.metrics, self.metrics_at = parse_metrics(text), time.time()
                            self.heard_from(self.metrics_at)
                except (*CLIENT_ERRORS, ValueError) as e:
                    log.debug("load poll of %s failed: %s", self.url, e)
                except Exception as e:   # a snapshot of another shape: the poll goes on, routing on the ledger
                    log.warning("load poll of %s: unreadable snapshot (%s: %s)", self.url, type(e).__name__, e)
            routing = time.time() - self.last_sent <= t.busy_s
            period = t.poll_s if routing else max(t.poll_s, t.idle_poll_s)
            try:   # a dispatch after a quiet spell cuts the idle wait short
                await asyncio.wait_for(self._dispatched.wait(), max(0.0, period - (time.monotonic() - t0)))
            except asyncio.TimeoutError:
                pass


@dataclass
class Dispatch:
    """Counters the remote backend reports (step_stats, /readyz, bench cluster)."""

    routed: int = 0
    rerouted: int = 0        # sent again elsewhere before any token (instance down or full)
    resumed: int = 0         # broke after tokens, went on on another instance
    moved: int = 0           # waited for a seat, moved to a free one (triage.routing.rebalance)
    lost_midstream: int = 0  # ended with an error event after tokens had been sent
    refused_503: int = 0
    by_instance: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"routed": self.routed, "rerouted": self.rerouted, "resumed": self.resumed, "moved": self.moved,
                "lost_midstream": self.lost_midstream,
                "refused_503": self.refused_503, "by_instance": dict(self.by_instance)}
