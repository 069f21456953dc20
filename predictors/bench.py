"""Open-loop latency benchmark of the predictor service (`triage bench classify`).

Requests arrive as a Poisson process at `rate` per second for `seconds`; each one's latency
is from its arrival to its Prediction (queueing + micro-batch + both models). Texts are the
corpus test split, cycled. One warm-up second is run first and not counted.
"""
from __future__ import annotations

import asyncio
import time

import numpy as np

from predictors.corpus import load_corpus
from predictors.service import DEFAULT_MAX_BATCH, PredictorService


async def run_bench(rate: float, seconds: float, strategy: str = "immediate", max_batch: int = DEFAULT_MAX_BATCH, max_wait_ms: float = 10.0,
                    threads: int = 2, runtime: str = "auto", seed: int = 0, service: PredictorService | None = None) -> dict:
    if rate <= 0 or seconds <= 0:
        raise ValueError("rate and seconds must be positive")
    texts = [r["text"] for r in load_corpus("test")]
    rng = np.random.default_rng(seed)
    own = service is None
    svc = service or PredictorService(strategy=strategy, max_batch=max_batch, max_wait_ms=max_wait_ms, threads=threads, runtime=runtime)
    await svc.start()
    try:
        async def one(text: str, at: float, out: list | None):
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            t0 = time.perf_counter()
            await svc.classify(text)
            if out is not None:
                out.append((time.perf_counter() - t0, t0 - at))

        async def phase(duration: float, out: list | None, offset: int):
            t = time.perf_counter() + 0.05
            arrivals = []
            end = t + duration
            while True:
                t += rng.exponential(1.0 / rate)
                if t > end:
                    break
                arrivals.append(t)
            await asyncio.gather(*(one(texts[(offset + i) % len(texts)], a, out) for i, a in enumerate(arrivals)))
            return len(arrivals)

        await phase(1.0, None, 10_000)
        b0, r0 = svc.stats.batches, svc.stats.requests
        lat: list = []
        wall0, cpu0 = time.perf_counter(), time.process_time()
        n = await phase(seconds, lat, 0)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        ms = np.array([x[0] for x in lat]) * 1000.0
        late = np.array([x[1] for x in lat]) * 1000.0  # event-loop lag at submission (should be ~0)
        batches = svc.stats.batches - b0
        return {
            "rate": rate, "p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "mean_ms": round(float(ms.mean()), 2), "max_ms": round(float(ms.max()), 2), "n": int(n),
            "achieved_rate": round(n / wall, 2),
            # this process's CPU (the classifier's threads and the event loop) per text: what
            # classification takes from an engine on the same cores
            "cpu_ms_per_text": round(1000.0 * cpu / max(n, 1), 2), "seconds": seconds, "strategy": svc.strategy, "max_batch": svc.max_batch,
            "max_wait_ms": svc.max_wait_s * 1000.0, "mean_batch": round((svc.stats.requests - r0) / max(batches, 1), 2),
            "submit_lag_p99_ms": round(float(np.percentile(late, 99)), 2), "threads": threads,
            "runtime": svc.predictor.urgency.runtime, "shared_encoder": svc.predictor.shared_encoder,
        }
    finally:
        if own:
            await svc.close()
