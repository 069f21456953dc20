"""Keep Python's garbage collector off the serving path.

The API process holds ~730,000 objects that live as long as it does (with the in-process
engine: torch, transformers, ONNX Runtime, vLLM's client, SQLAlchemy, FastAPI and the
models' Python wrappers; ~190,000 in a `--backend remote` front end, which loads no torch). A full
(generation-2) collection walks all of them: 0.43 s on a fast 2-core VM, ~1.3 s on a slow
one, during which the event loop, the classifier thread and every stream stop. One comes
every few hundred thousand surviving allocations, i.e. now and then under load: a stall
that no single call causes (the loop watchdog's "the whole front end runs slowly at those
moments", docs/measurements/cluster.md). vLLM's own API server and engine core do what `freeze_heap`
does after start-up (`vllm.utils.gc_utils.freeze_gc_heap`): collect once, then move every
object alive into the permanent generation, which later collections skip. Objects made
afterwards are collected as usual.
"""
from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)
# `gc.get_freeze_count()` walks the whole permanent generation (~10 ns an object, with the
# GIL held): read once a freeze, never per scrape
_frozen = 0


def freeze_heap(why: str) -> None:
    """Collect, then freeze everything alive now out of later collections' scans (the count
    is logged and exported as `triage_gc_frozen_objects`). Call after a start-up phase
    (service start, an engine built), never per request: the collection before the freeze
    scans what is not frozen yet (the whole heap the first time)."""
    global _frozen
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    _frozen = gc.get_freeze_count()
    log.info("%s: %d objects frozen out of the garbage collector's scans (%.0f ms)", why, _frozen,
             1000 * (time.perf_counter() - t0))


class GcPauses:
    """Every garbage collection of this process, timed through `gc.callbacks`, by generation.
    The callback only adds to plain numbers (no lock: a collection can start while the same
    thread holds a metrics lock); `collect()` turns them into Prometheus metrics at scrape
    time: `triage_gc_collections_total`, `triage_gc_pause_seconds_total`,
    `triage_gc_pause_max_seconds` by generation and `triage_gc_frozen_objects`."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.max = [0.0, 0.0, 0.0]
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        g = min(int(info.get("generation", 2)), 2)
        dt = time.perf_counter() - self._t0
        self.count[g] += 1
        self.seconds[g] += dt
        if dt > self.max[g]:
            self.max[g] = dt

    def start(self) -> "GcPauses":
        gc.callbacks.append(self._callback)
        return self

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        n = CounterMetricFamily("triage_gc_collections", "Garbage collections of the API process", labels=["generation"])
        s = CounterMetricFamily("triage_gc_pause_seconds", "Time the API process spent in garbage collections (every "
                                "thread waits meanwhile)", labels=["generation"])
        m = GaugeMetricFamily("triage_gc_pause_max_seconds", "The longest garbage collection since start",
                              labels=["generation"])
        for g in range(3):
            n.add_metric([str(g)], self.count[g])
            s.add_metric([str(g)], self.seconds[g])
            m.add_metric([str(g)], self.max[g])
        yield n
        yield s
        yield m
        yield GaugeMetricFamily("triage_gc_frozen_objects", "Objects frozen out of the collector's scans after "
                                "start-up (serving/gc_heap.py)", value=_frozen)
