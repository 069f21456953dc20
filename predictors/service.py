"""The predictor service: urgency + output-length prediction for async code.

    service = PredictorService(strategy="immediate", threads=2)
    await service.start()                       # loads both models (raises ModelMissing if untrained)
    p = await service.classify("abd pain, SBP 85")  # Prediction(level=2, predicted_level=3, ...)
    await service.close()

Both predictions come from one encoder pass when the length head was trained on the
urgency model's encoder (the default; `Predictor.shared_encoder`), under ONNX Runtime
(`runtime="auto"`; see `Classifier.set_runtime`).

Inference never runs on the event loop: one worker thread owns the models and takes
requests off a queue in micro-batches, with the two strategies of seed 004 (Sec. 4.1,
"Scheduling Strategies for Predictors"):

* "immediate": the worker runs as soon as a request is waiting, on everything queued at
  that moment (up to `max_batch`); no request waits for others.
* "full": the worker waits until `max_batch` requests are queued or the oldest has waited
  `max_wait_ms`, then runs them together (fewer, larger batches).

With `queue_hint` (opt-in: setting `predictor_queue_hint`), when more texts wait than
one batch takes (a spike), the worker classifies them probably-urgent first
(`predictors.queue_hint`: a cheap TF-IDF first stage ranks the backlog), so an ESI-1 call
need not wait for every earlier chat prompt to be classified before its level is known.

Texts are never logged.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from predictors import graph_classifier
from predictors.embedding import PooledHead
from predictors.model import Classifier, default_model_dir, ordinal_bucket, shares_encoder, softmax
from predictors.site_features import site_features
from predictors.site_slot import SiteSlot
from predictors.urgency import decide

log = logging.getLogger(__name__)
STRATEGIES = ("immediate", "full")


@dataclass(frozen=True)
class Prediction:
    level: int  # effective ESI level (1 most urgent) after escalate_below and the ESI vital-sign floors
    predicted_level: int  # the urgency classifier's own most probable level, before escalation
    probs: tuple[float, ...]  # calibrated P(level 1..5)
    length_bucket: int  # index into the length buckets (0 = shortest)
    length_tokens_estimate: int  # expected output tokens: Σ P(bucket)·(median tokens of the bucket)
    reasons: tuple[str, ...] = ()  # why level differs from predicted_level (empty when it does not)
    general_level: int | None = None  # the general model's decision (= level unless a site adapter is live)
    site_version: int | None = None  # the promoted site adapter that decided `level` (predictors.site_slot)
    shadow_level: int | None = None  # the shadow candidate's decision, beside (never used)
    features: np.ndarray | None = field(default=None, repr=False, compare=False)  # site_features row (relabel examples)

    def to_json(self) -> dict:
        out = {"level": self.level, "predicted_level": self.predicted_level, "probs": [round(p, 4) for p in self.probs],
               "length_bucket": self.length_bucket, "length_tokens_estimate": self.length_tokens_estimate,
               "reasons": list(self.reasons)}
        if self.site_version is not None:
            out.update(general_level=self.general_level, site_version=self.site_version)
        return out


class Predictor:
    """Synchronous batch prediction with both trained models (use from one thread)."""

    def __init__(self, urgency_dir: str | Path | None = None, length_dir: str | Path | None = None, threads: int | None = 2,
                 runtime: str = "auto", escalate_below: float | None | str = "trained", use_vitals: bool = True):
        urgency_dir = Path(urgency_dir or default_model_dir("urgency"))
        length_dir = Path(length_dir or default_model_dir("length"))
        graph = graph_classifier.load(urgency_dir, length_dir, threads, runtime)
        if graph is not None:   # the graph made at an earlier start, for these weights: no torch
            (self.urgency, self.length), self.shared_encoder = graph, True
        else:
            self._load_full(urgency_dir, length_dir, threads, runtime)
        self.site = SiteSlot()  # promoted / shadow site adapters, swapped live (serving.adapt)
        self.escalate_below = self.urgency.meta.escalate_below if escalate_below == "trained" else escalate_below
        self.use_vitals = use_vitals

    def _load_full(self, urgency_dir: Path, length_dir: Path, threads: int | None, runtime: str) -> None:
        """Both models in PyTorch, then the runtime chosen (the ONNX graph made and checked)."""
        self.urgency = Classifier(urgency_dir, threads=threads)
        self.length = Classifier(length_dir, threads=threads)
        # the length head is trained on the urgency model's frozen encoder: one encoder pass serves both
        self.shared_encoder = shares_encoder(self.urgency, self.length)
        pooled = PooledHead(self.urgency)  # the site adapters' input, from the same pass
        if self.shared_encoder:
            self.urgency.set_runtime(runtime, also=(self.length, pooled))
        else:
            self.urgency.set_runtime(runtime, also=(pooled,))
            self.length.set_runtime(runtime)

    @property
    def bucket_edges(self) -> list[int]:
        return list(self.length.meta.bucket_edges)

    def predict(self, texts: list[str]) -> list[Prediction]:
        if not texts:
            return []
        logits = self.urgency.all_logits(texts)   # [urgency, (length,) pooled vector]
        up, pooled = softmax(logits[0], self.urgency.meta.temperature), logits[-1]
        lp = softmax(logits[1], self.length.meta.temperature) if self.shared_encoder else self.length.probs(texts)
        decisions = [decide(p, text, self.escalate_below, self.use_vitals) for text, p in zip(texts, up)]
        feats = site_features(pooled, up, texts)
        levels, version, shadow, _ = self.site.apply(feats, [d.level for d in decisions])
        out = []
        tokens = self.length.meta.bucket_tokens
        buckets = ordinal_bucket(lp, self.length.meta.far_cost)
        for i, (p, q, d) in enumerate(zip(up, lp, decisions)):
            b = int(buckets[i])
            # the scheduler gets the expectation, not the chosen bucket's median: it wants a mean
            est = int(round(float(np.dot(q, tokens))))
            reasons = d.reasons if version is None else (*d.reasons, f"site_adapter:v{version}")
            out.append(Prediction(int(levels[i]), d.predicted_level, tuple(float(x) for x in p), b, max(1, est), reasons,
                                  general_level=d.level, site_version=version,
                                  shadow_level=None if shadow is None else int(shadow[i]), features=feats[i]))
        return out

    def levels(self, texts: list[str]) -> list[int]:
        return [p.level for p in self.predict(texts)]


# Texts a batch takes. The int8 graph runs one text per pass, so a batch saves only the
# per-call Python around the passes (~0.3 ms a text at 32 against 4 on a slow 2-core VM),
# while every text of it learns its level when the last is done: on that VM, with the
# engines on the same cores, a batch of 32 took 0.6-0.9 s in a spike (docs/predictors.md).
DEFAULT_MAX_BATCH = 4


@dataclass
class _Item:
    text: str
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float
    rank: int | None = None   # the queue hint's rank, set once the backlog exceeds a batch


@dataclass
class ServiceStats:
    batches: int = 0
    requests: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    reordered: int = 0      # batches taken out of arrival order by the queue hint


_STOP = object()


class PredictorService:
    """Micro-batching front of a `Predictor`, safe to call from any number of coroutines."""

    def __init__(self, predictor: Predictor | None = None, *, strategy: str = "immediate", max_batch: int = DEFAULT_MAX_BATCH,
                 max_wait_ms: float = 10.0, threads: int = 2, runtime: str = "auto",
                 urgency_dir: str | Path | None = None, length_dir: str | Path | None = None,
                 queue_hint: bool = False):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError("max_batch must be >= 1 and max_wait_ms >= 0")
        self.strategy, self.max_batch, self.max_wait_s = strategy, int(max_batch), float(max_wait_ms) / 1000.0
        self._predictor = predictor
        self._model_args = dict(urgency_dir=urgency_dir, length_dir=length_dir, threads=threads, runtime=runtime)
        self._q: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.stats = ServiceStats()
        self.queue_hint = queue_hint
        self.hint = None        # predictors.queue_hint.QueueHint, built by the worker at start

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> "PredictorService":
        """Start the worker thread and load the models there (awaits until they are ready)."""
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name="triage-predictor", daemon=True)
        self._thread.start()
        await asyncio.get_running_loop().run_in_executor(None, self._ready.wait)
        if self._error is not None:
            self._thread.join()
            self._thread = None
            raise self._error
        return self

    async def close(self) -> None:
        if self._thread is None:
            return
        self._q.put(_STOP)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        self._thread = None

    async def __aenter__(self) -> "PredictorService":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def predictor(self) -> Predictor:
        if self._predictor is None:
            raise RuntimeError("service not started")
        return self._predictor

    # -- requests --------------------------------------------------------------------------
    async def classify(self, text: str) -> Prediction:
        """Predict one request's level and length bucket (never blocks the event loop)."""
        if self._thread is None:
            raise RuntimeError("PredictorService.start() has not been awaited")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._q.put(_Item(text if isinstance(text, str) else str(text), fut, loop, time.perf_counter()))
        return await fut

    async def classify_many(self, texts: list[str]) -> list[Prediction]:
        return list(await asyncio.gather(*(self.classify(t) for t in texts)))

    # -- worker ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._predictor is None:
                self._predictor = Predictor(**self._model_args)
            self._predictor.predict(["warm-up"])  # first call pays one-off allocation costs
            if self.queue_hint:
                from predictors.model import predictors_dir
                from predictors.queue_hint import QueueHint

                u = self._model_args["urgency_dir"]
                self.hint = QueueHint.load_or_fit(Path(u).parent if u else predictors_dir())
        except BaseException as e:  # surfaced by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        backlog: list[_Item] = []
        stop = False
        while not stop:
            if not backlog:
                first = self._q.get()
                if first is _STOP:
                    break
                backlog.append(first)
            stop = self._take_queued(backlog)
            if not stop and self.strategy == "full":
                # full: wait up to max_wait (from the oldest) for a whole batch
                deadline = min(b.enqueued for b in backlog) + self.max_wait_s
                while len(backlog) < self.max_batch and not stop:
                    remaining = deadline - time.perf_counter()
                    if remaining <= 0:
                        break
                    try:
                        item = self._q.get(timeout=remaining)
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stop = True
                    else:
                        backlog.append(item)
            n = self._order(backlog) if len(backlog) > self.max_batch and self.hint is not None else self.max_batch
            batch, backlog = backlog[:n], backlog[n:]
            self._process(batch)
        # fail whatever is still queued
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                backlog.append(item)
        for item in backlog:
            item.loop.call_soon_threadsafe(_set_exc, item.future, RuntimeError("predictor service closed"))

    def _take_queued(self, backlog: list[_Item]) -> bool:
        """Move everything queued now into `backlog`; True when a stop was among it."""
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            backlog.append(item)

    def _order(self, backlog: list[_Item]) -> int:
        """Sort a backlog longer than a batch by (queue hint rank, arrival), in place, and
        say how many to classify now: the probable ESI-1 texts alone when there are any
        (a small batch, so their levels are known at once), else a whole batch."""
        fresh = [b for b in backlog if b.rank is None]
        try:
            for b, r in zip(fresh, self.hint.rank([b.text for b in fresh]) if fresh else ()):
                b.rank = r
        except Exception:   # a broken hint must not stop classification: arrival order
            log.exception("queue hint failed; classifying in arrival order")
            self.hint = None
            return self.max_batch
        before = [id(b) for b in backlog[: self.max_batch]]
        backlog.sort(key=lambda b: (b.rank, b.enqueued))
        n = sum(1 for b in backlog[: self.max_batch] if b.rank == 0) or self.max_batch
        if [id(b) for b in backlog[:n]] != before[:n]:
            self.stats.reordered += 1
        return n

    def _process(self, batch: list[_Item]) -> None:
        self.stats.batches += 1
        self.stats.requests += len(batch)
        self.stats.batch_sizes.append(len(batch))
        try:
            preds = self.predictor.predict([b.text for b in batch])
        except Exception as e:  # one bad batch must not kill the worker
            log.exception("predictor batch of %d failed", len(batch))
            for b in batch:
                b.loop.call_soon_threadsafe(_set_exc, b.future, e)
            return
        for b, p in zip(batch, preds):
            b.loop.call_soon_threadsafe(_set_result, b.future, p)


def _set_result(fut: asyncio.Future, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exc(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
