"""Seed 002 (FairBatching), Tables 3-5 style: peak effective RPS and P99 TPOT of
FairBatching-PAB against vLLM-sarathi (and vLLM-vanilla, FB-vanilla) on a cluster of 4,
and the single-node breakdown of §5.4.1 (FB-FB, FB-TB, FB-vanilla, FB-PAB).

Effective RPS (§5.1) = offered requests per second × the fraction that meets both TTFT
and TPOT SLOs, a request turned away by FB-PAB's admission control counting as a miss.
SLO met: §2.2's TPOT_{i,j} = (OutputTime_{i,j} − TTFT_i)/(j − 1), worst over j (§5.1),
with the TTFT term read as the TTFT SLO, i.e. every token inside its envelope deadline
arrival + TTFT_slo + (j − 1)·TPOT_slo (§3.1) — the reading under which Table 4 shows
FairBatching's P99 TPOT at exactly the 50 ms SLO. The same runs are also scored with
TTFT < SLO and mean TPOT < SLO (`effective_rps_mean_tpot`). The peak is taken over a sweep of
load. vLLM-sarathi's token budget is "best tuned" (§5.1): the sweep is run at each
candidate budget and the best peak kept.
"""
from __future__ import annotations

from triage.sim.reproduce.common import AZURE_CONV, Progress, System, envelope_met, row, run, uniform_classes
from triage.sim.traces import load_trace

PROFILE = "a100-qwen1.5-7b-analytic"   # roofline A100-80GB/7B (the published a100 profile's quadratic
                                       # prefill term prices a 2k-token chunk at 2.1 s: no 50 ms TPOT fits)
TTFT, TPOT = 2.0, 0.05           # Table 2, AzureTrace
BIG = 8192                       # §3.2: the token budget is kept large on purpose (CUDA-graph size only)
SARATHI_BUDGETS = (128, 256, 512)


def systems(sarathi_budget: int) -> list[System]:
    return [
        System("vllm-vanilla", "fcfs-prefill-first", router="min_load", max_num_batched_tokens=BIG),
        System("vllm-sarathi", "sarathi-fcfs", router="min_load", max_num_batched_tokens=sarathi_budget),
        System("fb-vanilla", "fairbatching", router="min_load", max_num_batched_tokens=BIG),
        System("fb-pab", "fairbatching", router="pab", router_params={"reject": True}, max_num_batched_tokens=BIG),
    ]


def breakdown(sarathi_budget: int) -> list[System]:
    """§5.4.1 / Fig. 7, one instance: each step adds one FairBatching component."""
    return [
        System("vllm-s", "sarathi-fcfs", max_num_batched_tokens=sarathi_budget),
        System("vllm-v", "fcfs-prefill-first", max_num_batched_tokens=BIG),
        System("fb-fb", "fairbatching", {"budget": "fixed"}, max_num_batched_tokens=sarathi_budget),
        System("fb-tb", "fairbatching", {"budget": "tokens"}, max_num_batched_tokens=BIG),
        System("fb-v", "fairbatching", max_num_batched_tokens=BIG),
        System("fb-pab", "fairbatching", router="pab", router_params={"reject": True}, max_num_batched_tokens=BIG),
    ]


def sweep(sysm: System, scales, *, limit: int, instances: int, classes, progress=None, tick=None) -> list[dict]:
    pts = []
    for sc in scales:
        trace = load_trace(AZURE_CONV, limit=limit, rate_scale=sc, seed=0, max_len=32768)
        s = run(trace, sysm, PROFILE, classes, instances=instances, tpot_metric="mean")
        env = sum(envelope_met(r, TTFT, TPOT) for r in s["requests_done"]) / s["offered"]
        pts.append({"rate_scale": sc, "rps": s["rps"], "effective_rps": s["rps"] * env, "slo_attainment": env,
                    "effective_rps_mean_tpot": s["effective_rps"], "rejected": s["rejected"],
                    "ttft_p99": _p(s, "ttft_p99"), "tpot_p99": envelope_tpot_p99(s["requests_done"], TTFT)})
        if tick:
            tick()
    return pts


def envelope_tpot_p99(reqs, ttft: float) -> float | None:
    """P99 over requests of max_j (t_j − arrival − TTFT_slo)/(j − 1), j ≥ 2 (§2.2 as read here)."""
    import numpy as np

    vals = [max((t - r.arrival - ttft) / j for j, t in enumerate(r.token_times) if j >= 1)
            for r in reqs if len(r.token_times) > 1]
    return float(np.percentile(vals, 99)) if vals else None


def _p(s: dict, key: str) -> float | None:
    vals = [c[key] for c in s["per_class"].values() if c.get(key) is not None]
    return max(vals) if vals else None   # the worst class (all classes share one SLO here)


def run_seed(*, quick: bool = False, progress: Progress = None) -> dict:
    classes = uniform_classes(TTFT, TPOT)
    limit = 400 if quick else 1000
    n_inst = 4
    scales = (2.0, 4.0) if quick else (2.0, 4.0, 8.0)
    done = [0]

    def tick():
        done[0] += 1
        if progress:
            progress(done[0])

    out: dict = {"seed": "002", "rows": [], "cluster": {}, "breakdown": {}}
    # vLLM-sarathi, best-tuned token budget
    best_budget, best = None, None
    tuning = {}
    for tb in SARATHI_BUDGETS:
        pts = sweep(systems(tb)[1], scales, limit=limit, instances=n_inst, classes=classes, tick=tick)
        peak = max(p["effective_rps"] for p in pts)
        tuning[tb] = peak
        if best is None or peak > best[0]:
            best_budget, best = tb, (peak, pts)
    out["sarathi_budget_tuning"] = tuning
    out["sarathi_budget"] = best_budget
    for sysm in systems(best_budget):
        pts = best[1] if sysm.label == "vllm-sarathi" else sweep(sysm, scales, limit=limit, instances=n_inst,
                                                                  classes=classes, tick=tick)
        out["cluster"][sysm.label] = pts
    peak = {k: max(p["effective_rps"] for p in v) for k, v in out["cluster"].items()}
    out["effective_rps"] = {"fb-pab": peak["fb-pab"], "vllm-sarathi": peak["vllm-sarathi"],
                            "vllm-vanilla": peak["vllm-vanilla"], "fb-vanilla": peak["fb-vanilla"]}
    setup = (f"simulated; {n_inst} instances, a100-qwen1.5-7b-analytic profile (paper: LLaMA3.1-8B/A800 and 3 more models; ours: roofline A100/7B), "
             f"Azure conv 2023 first {limit} requests (paper: Azure 2024, QwenTrace, BurstGPT), SLO TTFT {TTFT} s / "
             f"TPOT {TPOT * 1000:.0f} ms (Table 2 AzureTrace) on the token envelope; vLLM-sarathi token budget "
             f"tuned over {list(SARATHI_BUDGETS)} -> {best_budget}; others {BIG}")
    out["rows"].append(row("peak effective RPS, FB-PAB / vLLM-sarathi", "1.92x (2.11 vs 1.10, Table 3 overall)",
                           f"{peak['fb-pab'] / peak['vllm-sarathi']:.2f}x ({peak['fb-pab']:.2f} vs "
                           f"{peak['vllm-sarathi']:.2f} req/s)", setup))
    out["rows"].append(row("peak effective RPS, FB-vanilla / vLLM-sarathi", "1.20x (1.32 vs 1.10)",
                           f"{peak['fb-vanilla'] / peak['vllm-sarathi']:.2f}x", setup))
    out["rows"].append(row("peak effective RPS, vLLM-vanilla / vLLM-sarathi", "0.99x (1.09 vs 1.10)",
                           f"{peak['vllm-vanilla'] / peak['vllm-sarathi']:.2f}x", setup))
    # Table 4 style: latency at the load where vLLM-sarathi peaks
    at = max(out["cluster"]["vllm-sarathi"], key=lambda p: p["effective_rps"])["rate_scale"]
    t4 = {k: next(p for p in v if p["rate_scale"] == at) for k, v in out["cluster"].items()}
    out["table4_at_scale"] = at
    out["rows"].append(row(f"P99 TPOT (ms) at rate scale {at}, vLLM-sarathi / FB-PAB", "49 / 50 (Table 4)",
                           f"{_ms(t4['vllm-sarathi']['tpot_p99'])} / {_ms(t4['fb-pab']['tpot_p99'])}", setup))
    out["rows"].append(row(f"P99 TTFT (ms) at rate scale {at}, vLLM-sarathi / FB-PAB", "4585 / 504 (Table 4)",
                           f"{_ms(t4['vllm-sarathi']['ttft_p99'])} / {_ms(t4['fb-pab']['ttft_p99'])}", setup))

    # §5.4.1 breakdown, one instance
    b_scales = (0.5, 1.0) if quick else (0.5, 1.0, 2.0)
    for sysm in breakdown(best_budget):
        pts = sweep(sysm, b_scales, limit=limit // 2, instances=1, classes=classes, tick=tick)
        out["breakdown"][sysm.label] = {"peak_effective_rps": max(p["effective_rps"] for p in pts), "points": pts}
    bd = {k: v["peak_effective_rps"] for k, v in out["breakdown"].items()}
    paper_steps = {"vllm-v": "+9.2% over vllm-s", "fb-fb": "+15.1% over vllm-v", "fb-tb": "+7.9% over fb-fb",
                   "fb-v": "+2.4% over fb-tb", "fb-pab": "+52.1% over fb-v"}
    prev = "vllm-s"
    for k, paper in paper_steps.items():
        out["rows"].append(row(f"breakdown (1 instance): {k} vs {prev}, peak effective RPS", paper,
                               f"{100 * (bd[k] / bd[prev] - 1):+.1f}% ({bd[k]:.2f} vs {bd[prev]:.2f})",
                               f"simulated; one instance, first {limit // 2} Azure conv requests"))
        prev = k
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:.0f}"


def plot(out: dict, ax) -> None:
    for k, pts in out["cluster"].items():
        ax.plot([p["rps"] for p in pts], [p["effective_rps"] for p in pts], marker="o", label=k)
    ax.set_xlabel("offered load (req/s)")
    ax.set_ylabel("effective RPS")
    ax.set_title("seed 002: 4 instances (simulated)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
