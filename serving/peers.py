"""vLLM's own scheduler beside ours, on the same request stream, without a model.

`bench peers` drives three schedulers through one trace:

    vllm-fcfs      vllm.v1.core.sched.scheduler.Scheduler, policy "fcfs"
    vllm-priority  the same, policy "priority" (priority = ESI level, lower runs first)
    triage         serving.vllm_scheduler.TriageScheduler (our policy inside vLLM)

Each is a real vLLM `Scheduler` on a hand-made `KVCacheConfig` (no weights, no
tokenizer). A model-runner stand-in answers every `SchedulerOutput` with one sampled
token per request whose computed tokens reached its known tokens, and a virtual clock
advances by the profile's batch time for the step (ProServe form, the profile's
`noise_cv` as seeded lognormal noise). `update_from_output` is vLLM's own, so stops,
frees and preemptions are vLLM's bookkeeping in all three rows.

`--scenario burst` drives them through `bench serve`'s burst instead (the same calls:
gold levels, each text's measured answer length, the engine sizes of `bench serve`), so
the rows say what each scheduler costs per engine step where the live comparison runs:
`cpu_s` is the wall time spent in `schedule()` and `update_from_output()` over the run.

Long requests: the trace's prompts reach ~8k tokens but the CPU engine serves
`max_model_len` (2048) tokens. Every scheduler sees the same clipped stream
(`triage.sim.traces.clip_lengths`: a request longer than max_model_len keeps at most
half of it for output, the prompt gets the rest).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

SCHEDULERS = ("vllm-fcfs", "vllm-priority", "triage")
SAMPLED_TOKEN = 7  # the stand-in's sampled token (never EOS: requests run to max_tokens)


def _env() -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tiny_model_dir() -> str:
    """A directory with a tiny Llama config.json: enough for vLLM's ModelConfig."""
    d = Path(tempfile.gettempdir()) / "triage-tiny-llama"
    cfg = d / "config.json"
    if not cfg.exists():
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"config.{os.getpid()}.json"
        tmp.write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1,
            "intermediate_size": 64, "vocab_size": 1000, "max_position_embeddings": 32768,
        }))
        tmp.replace(cfg)
    return str(d)


def build_scheduler(kind: str = "triage", *, num_blocks: int = 1000, block_size: int = 16,
                    max_num_seqs: int = 32, max_num_batched_tokens: int = 512, max_model_len: int = 2048,
                    triage: dict | None = None, enable_prefix_caching: bool = False):
    """A vLLM `Scheduler` (kind vllm-fcfs / vllm-priority) or our `TriageScheduler`
    (kind triage) over `num_blocks` usable KV blocks (plus vLLM's null block)."""
    _env()
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    if kind not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {kind!r}; known: {', '.join(SCHEDULERS)}")
    policy = "fcfs" if kind == "vllm-fcfs" else "priority"
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         max_model_len=max_model_len, long_prefill_token_threshold=0,
                         enable_chunked_prefill=True, policy=policy, is_encoder_decoder=False)
    mc = ModelConfig(model=tiny_model_dir(), skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len)
    cc = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    extra = {"triage": dict(triage or {})} if kind == "triage" else {}
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, additional_config=extra)
    total = num_blocks + 1  # the block pool keeps one null block
    kv = KVCacheConfig(num_blocks=total, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    cc.num_gpu_blocks = total
    if kind == "triage":
        from serving.vllm_scheduler import TriageScheduler as cls
    else:
        cls = Scheduler
    return cls(vllm_config=vc, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(vc),
               block_size=block_size, log_stats=False)


def make_vllm_request(rid: str, prompt_len: int, max_tokens: int, *, priority: int = 0, arrival: float | None = None,
                      extra: dict | None = None, block_size: int = 16, token: int | None = None,
                      prefix: list[int] | None = None):
    """A vLLM engine-core `Request` with a synthetic prompt (distinct per request). With
    `prefix`, the prompt starts with those tokens and carries block hashes as the engine
    core gives them under prefix caching, so requests sharing it hit the cache."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args={"triage": extra} if extra else None)
    base = (hash(rid) % 900) + 10 if token is None else token
    hasher = None
    if prefix is not None:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        fn = get_hash_fn_by_name("sha256")
        init_none_hash(fn)
        hasher = get_request_block_hasher(block_size, fn)
    ids = list(prefix or []) + [base] * (prompt_len - len(prefix or []))
    return Request(request_id=rid, prompt_token_ids=ids, sampling_params=sp, pooling_params=None,
                   arrival_time=arrival, priority=priority, block_hasher=hasher)


def stand_in_output(sched, out):
    """The model runner's answer: one sampled token per request that reached its known tokens."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests.get(rid)
        sampled.append([SAMPLED_TOKEN] if req is not None and req.num_computed_tokens >= req.num_tokens else [])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled)


@dataclass
class PeerRun:
    scheduler: str
    requests: list          # triage Requests with token_times
    steps: int
    sim_time: float
    overheads_s: list[float]
    preemptions: int
    stats: dict | None = None
    update_s: list[float] | None = None   # update_from_output's wall time, step by step

    def cpu_s(self) -> float:
        """The scheduler's own time over the run: schedule() and update_from_output()."""
        return float(sum(self.overheads_s) + sum(self.update_s or ()))


def run_peer(kind: str, trace, profile, classes, *, seed: int = 0, max_num_seqs: int | None = None,
             max_num_batched_tokens: int | None = None, max_model_len: int | None = None,
             num_blocks: int | None = None, block_size: int | None = None, sched=None,
             progress: Callable[[int], None] | None = None, policy_params: dict | None = None) -> PeerRun:
    """Replay `trace` (TraceRequests) through one scheduler with the stand-in runner."""
    from triage.estimators import Work
    from triage.request import Request
    from triage.sim.traces import clip_lengths

    lim = profile.limits
    max_num_seqs = max_num_seqs or lim.max_num_seqs
    max_num_batched_tokens = max_num_batched_tokens or lim.max_num_batched_tokens
    max_model_len = max_model_len or lim.max_model_len
    num_blocks = num_blocks or profile.num_blocks
    block_size = block_size or profile.block_size
    if sched is None:
        sched = build_scheduler(kind, num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                                max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                                triage={"profile": profile.name, "classes": classes.to_dict(), "learn": True,
                                        "policy_params": dict(policy_params or {})})
    truth = profile.estimator("proserve")
    rng = np.random.default_rng(seed)
    cv = profile.noise_cv
    sigma = math.sqrt(math.log1p(cv * cv)) if cv > 0 else 0.0
    clock = {"now": 0.0}
    if kind == "triage":
        sched.clock = lambda: clock["now"]
    pending = sorted(enumerate(trace), key=lambda it: (it[1].arrival, it[0]))
    mine: dict[str, Request] = {}
    done: list[Request] = []
    overheads: list[float] = []
    updates: list[float] = []
    steps = 0
    preempted = 0
    i = 0
    n = len(pending)
    while i < n or sched.has_requests():
        now = clock["now"]
        while i < n and pending[i][1].arrival <= now:
            idx, t = pending[i]
            p, o = clip_lengths(t.prompt_len, t.output_len, max_model_len)
            c = classes.get(t.level)
            rid = f"r{idx}"
            mine[rid] = Request(id=rid, arrival=t.arrival, prompt_len=p, predicted_level=t.level, ttft_slo=c.ttft,
                                tpot_slo=c.tpot, weight=c.weight, predicted_output_len=o, output_len=o, seq=idx)
            extra = {"level": t.level, "predicted_output_len": o}
            sched.add_request(make_vllm_request(rid, p, o, priority=t.level if kind != "vllm-fcfs" else 0,
                                                arrival=t.arrival, extra=extra, block_size=block_size,
                                                token=10 + idx % 900))
            i += 1
        computed_before = {}
        t0 = time.perf_counter()
        out = sched.schedule()
        overheads.append(time.perf_counter() - t0)
        sched_tokens = out.num_scheduled_tokens
        if not sched_tokens:
            if out.preempted_req_ids:
                preempted += len(out.preempted_req_ids)
            answer = stand_in_output(sched, out)
            t0 = time.perf_counter()
            sched.update_from_output(out, answer)
            updates.append(time.perf_counter() - t0)
            if i < n:
                clock["now"] = max(now, pending[i][1].arrival)
                continue
            if sched.has_requests():
                raise RuntimeError(f"{kind}: stalled with {len(sched.requests)} requests at t={now:.3f}")
            break
        preempted += len(out.preempted_req_ids)
        works = []
        for rid, k in sched_tokens.items():
            req = sched.requests[rid]
            computed_before[rid] = req.num_computed_tokens - k
            works.append(Work(k, req.num_computed_tokens - k))
        dt = truth._batch_time(works)
        if sigma:
            dt *= float(rng.lognormal(-sigma * sigma / 2, sigma))
        clock["now"] = now + dt
        steps += 1
        answer = stand_in_output(sched, out)
        t0 = time.perf_counter()
        outputs = sched.update_from_output(out, answer)
        updates.append(time.perf_counter() - t0)
        t_end = clock["now"]
        for eco in outputs.values():
            for o in eco.outputs:
                r = mine.get(o.request_id)
                if r is None:
                    continue
                for _ in o.new_token_ids:
                    r.token_times.append(t_end)
                    r.generated += 1
                if o.finish_reason is not None:
                    r.finish_time = t_end
                    done.append(r)
                    if progress and len(done) % 200 == 0:
                        progress(len(done))
    stats = sched.triage_stats() if hasattr(sched, "triage_stats") else None
    return PeerRun(kind, sorted(mine.values(), key=lambda r: r.seq), steps, clock["now"], overheads, preempted, stats,
                   updates)


def compare(trace_path: str, *, rate_scale: float, profile_name: str, limit: int | None = None, seed: int = 0,
            schedulers: tuple[str, ...] = SCHEDULERS, progress: Callable[[str, int], None] | None = None,
            policy_params: dict | None = None) -> dict:
    """The `bench peers` table: one row per scheduler on the same stream."""
    from triage.profiles import load_profile
    from triage.sim.traces import load_trace

    profile = load_profile(profile_name)
    trace = load_trace(trace_path, limit=limit, rate_scale=rate_scale, seed=seed)  # run_peer clips
    out = _table(trace, profile, seed=seed, schedulers=schedulers, progress=progress, policy_params=policy_params)
    return {"scenario": "trace", "trace": str(trace_path), "rate_scale": rate_scale, "limit": limit, **out}


def compare_burst(texts: str, requests: int, spread: float, *, profile_name: str, seed: int = 0,
                  schedulers: tuple[str, ...] = SCHEDULERS, progress: Callable[[str, int], None] | None = None,
                  policy_params: dict | None = None) -> dict:
    """The `bench peers` table on `bench serve`'s burst: its calls (gold levels, measured
    answer lengths, its max_tokens) on its engine sizes."""
    from serving.bench.systems import EngineSizes
    from serving.cli.sim_inputs import burst_trace
    from triage.profiles import load_profile
    from triage.sim.simulator import with_limits

    sizes = EngineSizes()
    profile = with_limits(load_profile(profile_name), max_num_seqs=sizes.max_num_seqs,
                          max_num_batched_tokens=sizes.max_num_batched_tokens)
    trace, *_ = burst_trace(texts, requests, spread, seed=seed, predict=False)
    out = _table(trace, profile, seed=seed, schedulers=schedulers, progress=progress, policy_params=policy_params)
    return {"scenario": "burst", "trace": None, "rate_scale": None, "limit": None,
            "burst": {"texts": texts, "requests": requests, "spread_s": spread, "levels": "gold",
                      "output": f"each text's measured answer length, max_tokens {trace[0].max_tokens}"}, **out}


def _table(trace, profile, *, seed: int, schedulers: tuple[str, ...], progress, policy_params) -> dict:
    from triage.classes import load_classes
    from triage.sim.metrics import summarize

    classes = load_classes().scaled(profile.slo_scale)
    rows = []
    for kind in schedulers:
        run = run_peer(kind, trace, profile, classes, seed=seed, policy_params=policy_params,
                       progress=(lambda k: progress(kind, k)) if progress else None)
        s = summarize(run.requests, classes, policy=kind)
        ov = np.array(run.overheads_s) * 1e6
        cpu = run.cpu_s()
        row = {
            "scheduler": kind,
            "tdg_ratio": s["tdg_ratio"],
            "slo_attainment": s["slo_attainment"],
            "per_class": s["per_class"],
            "step_overhead_p50_us": float(np.percentile(ov, 50)) if len(ov) else None,
            "step_overhead_p99_us": float(np.percentile(ov, 99)) if len(ov) else None,
            "steps": run.steps,
            "sim_time_s": run.sim_time,
            "preemptions": run.preemptions,
            "cpu_s": cpu,
            "cpu_ms_per_step": 1000 * cpu / run.steps if run.steps else None,
        }
        if run.stats:
            row["plan_mismatches"] = run.stats["plan_mismatches"]
            row["plan_repairs"] = run.stats["plan_repairs"]
        rows.append(row)
    lim = profile.limits
    return {
        "profile": profile.name, "seed": seed, "requests": len(trace),
        "engine": {"max_num_seqs": lim.max_num_seqs, "max_num_batched_tokens": lim.max_num_batched_tokens,
                   "max_model_len": lim.max_model_len, "num_blocks": profile.num_blocks,
                   "block_size": profile.block_size},
        "clip": "longer than max_model_len: output = min(output, max_model_len // 2), prompt = the rest",
        "rows": rows,
    }


# ------------------------------------------------------------------------------ overhead
def peer_overhead(peer: str, waiting: int, running: int, repeats: int, *, prompt: int = 500,
                  max_num_batched_tokens: int = 8192, seed: int = 0) -> dict:
    """Time `schedule()` of scheduler `peer` at a state of `waiting` queued and `running`
    decoding requests (prompts of ~`prompt` tokens). The state is rebuilt before every
    timed call (a fresh copy is scheduled each time), so every call sees the same state.
    Returns {"p50_us", "p99_us", "mean_us", "repeats"}."""
    rng = np.random.default_rng(seed)
    bs = 16
    lens = rng.integers(max(2, prompt // 2), prompt * 3 // 2, size=waiting + running)
    need = int(sum(math.ceil((int(x) + 64) / bs) for x in lens)) + 64
    sched = build_scheduler(peer, num_blocks=need, block_size=bs, max_num_seqs=max(running + 1, 256),
                            max_num_batched_tokens=max_num_batched_tokens, max_model_len=4096,
                            triage={"profile": "vllm-cpu-smollm2", "learn": False})
    if hasattr(sched, "clock"):
        sched.clock = lambda: 1.0
    # bring `running` requests into decode: admit them in chunks, then sample their first token
    for j in range(running):
        sched.add_request(make_vllm_request(f"run{j}", int(lens[j]), 64, priority=1 + j % 5,
                                            arrival=0.0, extra={"level": 1 + j % 5}))
    guard = 0
    while any(r.num_output_tokens == 0 for r in sched.running) or len(sched.running) < running:
        out = sched.schedule()
        sched.update_from_output(out, stand_in_output(sched, out))
        guard += 1
        if guard > 10_000:
            raise RuntimeError("could not bring the running set into decode")
    for j in range(waiting):
        sched.add_request(make_vllm_request(f"wait{j}", int(lens[running + j]), 64, priority=1 + j % 5,
                                            arrival=0.5, extra={"level": 1 + j % 5}))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = sched.schedule()
        times.append(time.perf_counter() - t0)
        _rewind(sched, out)
    a = np.array(times) * 1e6
    return {"name": peer, "peer": peer, "waiting": waiting, "running": running, "repeats": repeats,
            "p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "mean_us": float(a.mean())}


def _rewind(sched, out) -> None:
    """Undo one `schedule()` so the next call sees the same queues: requests admitted
    this step go back to the head of the waiting queue with their blocks freed, and
    running requests give back the tokens they were scheduled."""
    from vllm.v1.request import RequestStatus

    new_ids = {r.req_id for r in out.scheduled_new_reqs}
    for rid, k in out.num_scheduled_tokens.items():
        req = sched.requests[rid]
        if rid in new_ids:
            sched.running.remove(req)
            sched.kv_cache_manager.free(req)
            req.status = RequestStatus.WAITING
            req.num_computed_tokens = 0
            req.num_in_flight_tokens = 0
            sched.waiting.prepend_request(req)
            if hasattr(sched, "tstate"):
                r = sched.tstate.requests[rid]
                sched.tstate.preempt(rid, 0)
                r.stage = r.stage.__class__.WAITING
                r.preemptions -= 1
        else:
            req.num_computed_tokens -= k
            req.num_in_flight_tokens -= k
            if hasattr(sched, "tstate"):
                sched.tstate.requests[rid].computed = req.num_computed_tokens
    sched.finished_req_ids = set()
    sched.reset_preempted_req_ids = set()
