"""Diagnostic probes behind docs/reproduction.md's "tried and not adopted" figures: single
points of the seed 000 and 001 reproductions with other parameters (simulation results).

    python scripts/seed_probes.py seed000 --rate-scale 0.14 --params '{"decodes": "always", "gamma": 2}' \
        --sim-seed 1 [--only-ours]
    python scripts/seed_probes.py seed001 --tbt 0.05 --rates 0.5,0.8 --requests 400
    python scripts/seed_probes.py seed001-misses --rates 1.0,1.2

seed000: the four Fig. 15 steps (or ours alone) at one rate scale, with extra policy
parameters on every step. seed001: envelope SLO attainment of the five ablation steps
with another TBT SLO. seed001-misses: per step, requests whose first token missed the TTFT
SLO and requests that missed only a later token's deadline.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from triage.profiles import load_profile
from triage.sim.reproduce import seed000, seed001
from triage.sim.reproduce.common import (AZURE_CONV, System, envelope_attainment, mixed_lengths_trace, run,
                                         uniform_classes)
from triage.sim.traces import load_trace


def probe_seed000(rate_scale: float, params: dict, sim_seed: int, only_ours: bool, limit: int = 1000) -> dict:
    prof = load_profile(seed000.PROFILE)
    probe = load_trace(AZURE_CONV, limit=limit, rate_scale=1.0, seed=0, max_len=prof.max_request_tokens)
    ratio = float(np.mean([t.prompt_len for t in probe]) / np.mean([t.output_len for t in probe]))
    classes = uniform_classes(1.0 * prof.slo_scale, 0.1 * prof.slo_scale, weights=(2.0, 1.0), w_first=ratio,
                              w_decode=1.0)
    trace = load_trace(AZURE_CONV, limit=limit, rate_scale=rate_scale, seed=sim_seed, mix=(0.5, 0.5),
                       max_len=prof.max_request_tokens)
    steps = seed000.STEPS[-1:] if only_ours else seed000.STEPS
    out = {}
    for st in steps:
        st = System(st.label, st.policy, {**st.params, **params}, max_num_batched_tokens=st.max_num_batched_tokens)
        out[st.label] = round(run(trace, st, seed000.PROFILE, classes, seed=sim_seed)["tdg_ratio"], 4)
    return out


def probe_seed001(tbt: float, rates: list[float], n: int) -> dict:
    prof = load_profile(seed001.PROFILE)
    seed001.TBT = tbt
    classes = seed001.classes_for(prof, n)
    parts = [("sharegpt", 3 * n // 4, 1), ("arxiv", n // 4, 2)]
    out: dict = {}
    for rate in rates:
        trace = mixed_lengths_trace(parts, rate=rate, seed=0, max_len=prof.max_request_tokens)
        out[rate] = {st.label: round(envelope_attainment(run(trace, st, seed001.PROFILE, classes), classes), 4)
                     for st in seed001.STEPS}
    return out


def probe_seed001_misses(rates: list[float], n: int) -> dict:
    prof = load_profile(seed001.PROFILE)
    classes = seed001.classes_for(prof, n)
    parts = [("sharegpt", 3 * n // 4, 1), ("arxiv", n // 4, 2)]
    out: dict = {}
    for rate in rates:
        trace = mixed_lengths_trace(parts, rate=rate, seed=0, max_len=prof.max_request_tokens)
        out[rate] = {}
        for st in seed001.STEPS:
            first = later = 0
            for r in run(trace, st, seed001.PROFILE, classes)["requests_done"]:
                c = classes.get(r.level)
                tt = r.token_times
                if not tt or tt[0] > r.arrival + c.ttft + 1e-9:
                    first += 1
                elif any(t > r.arrival + c.ttft + j * c.tpot + 1e-9 for j, t in enumerate(tt)):
                    later += 1
            out[rate][st.label] = {"ttft_miss": first, "later_token_miss": later}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probe", choices=("seed000", "seed001", "seed001-misses"))
    ap.add_argument("--rate-scale", type=float, default=0.14)
    ap.add_argument("--params", default="{}", help="JSON policy parameters added to every seed 000 step")
    ap.add_argument("--sim-seed", type=int, default=0)
    ap.add_argument("--only-ours", action="store_true")
    ap.add_argument("--tbt", type=float, default=seed001.TBT)
    ap.add_argument("--rates", default="1.0,1.2")
    ap.add_argument("--requests", type=int, default=800)
    a = ap.parse_args()
    rates = [float(x) for x in a.rates.split(",")]
    if a.probe == "seed000":
        res = probe_seed000(a.rate_scale, json.loads(a.params), a.sim_seed, a.only_ours)
    elif a.probe == "seed001":
        res = probe_seed001(a.tbt, rates, a.requests)
    else:
        res = probe_seed001_misses(rates, a.requests)
    print(json.dumps({"probe": a.probe, "simulated": True, "args": vars(a), "result": res}))


if __name__ == "__main__":
    main()
