"""The simulator's real-world inputs, prepared in the CLI layer (`triage/` imports neither
`serving` nor `predictors`; it gets plain lists):

* `text_pool(name, predict=True)`: a labelled pool (`serving.bench.texts.load_pool`:
  corpus-test, ktas or a JSONL file) as a `triage.sim.inputs.TextPool`, with our
  urgency model's level and the length head's estimate for every text;
* `predict_cached(texts)`: those predictions, computed once per distinct text and kept
  on disk under the state dir (`.triage/cache/sim-predictions-<fingerprint>.json`), keyed
  by a fingerprint of both model directories (file names, sizes and mtimes), so a
  retrained model never reuses stale predictions;
* `burst_trace(...)`: the HTTP benchmark's burst (serving.bench.serve.burst_calls, the
  same seeded calls) as trace rows, prompt tokens counted with the served model's
  tokenizer and chat template.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Callable

import typer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# 0: each call produces what the served model answers to it (`answer_tokens`); a number:
# every call produces that many (issue 20's first runs: 58.5 tokens a call at max_tokens 64,
# before the served system turn and frequency penalty made dispatch answers short)
BURST_OUTPUT_TOKENS = 0


def fail(msg: str, code: int = 2) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def model_fingerprint() -> str:
    from predictors.model import default_model_dir

    h = hashlib.sha256()
    for kind in ("urgency", "length"):
        d = default_model_dir(kind)
        if not (d / "triage_meta.json").exists():
            raise FileNotFoundError(f"the {kind} predictor is not trained ({d}): run `triage train all`")
        for f in sorted(d.iterdir()):
            if f.name.startswith("onnx-") or not f.is_file():
                continue
            st = f.stat()
            h.update(f"{kind}/{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def _key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def predict_cached(texts: list[str], progress: Callable[[str], None] | None = None) -> tuple[list[int], list[int], dict]:
    """(levels, length estimates, cache info) for `texts`; the model runs only on texts
    not cached for the current models."""
    from triage.paths import state_dir

    fp = model_fingerprint()
    path = state_dir() / "cache" / f"sim-predictions-{fp}.json"
    cache: dict = {}
    if path.exists():
        try:
            cache = json.loads(path.read_text(encoding="utf-8"))["predictions"]
        except (ValueError, KeyError):
            cache = {}
    keys = [_key(t) for t in texts]
    missing = sorted({k: t for k, t in zip(keys, texts) if k not in cache}.items())
    if missing:
        from predictors.service import Predictor

        if progress:
            progress(f"classifying {len(missing)} new texts (cached for model {fp})")
        p = Predictor()
        for i in range(0, len(missing), 32):
            chunk = missing[i:i + 32]
            for (k, _), pr in zip(chunk, p.predict([t for _, t in chunk])):
                cache[k] = [int(pr.level), int(pr.length_tokens_estimate)]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"fingerprint": fp, "predictions": cache}), encoding="utf-8")
        tmp.replace(path)
    info = {"model_fingerprint": fp, "cache": str(path), "computed": len(missing), "cached": len(set(keys)) - len(missing)}
    return [cache[k][0] for k in keys], [cache[k][1] for k in keys], info


def text_pool(name: str, *, predict: bool = True, progress: Callable[[str], None] | None = None):
    """The pool as a TextPool (and the raw texts); exits with a clear message on a bad name."""
    from serving.bench.texts import PoolError, load_pool
    from triage.sim.inputs import TextPool

    try:
        pool = load_pool(name)
    except PoolError as e:
        fail(str(e))
    except FileNotFoundError as e:
        fail(f"--texts {name}: {e}")
    texts = [t.text for t in pool]
    levels = lengths = None
    info = {}
    if predict:
        try:
            levels, lengths, info = predict_cached(texts, progress)
        except FileNotFoundError as e:
            fail(str(e))
    return TextPool(name, [t.gold for t in pool], [t.kind for t in pool], levels, lengths), texts, info


def prompt_token_counter() -> Callable[[str], int]:
    """Tokens of one user message under the served model's chat template (generation
    prompt and the service's default system turn included), as the engine sees a chat completion."""
    from serving.model_prep import chat_messages, default_model_dir

    model = default_model_dir()
    if not (model / "tokenizer_config.json").exists():
        fail(f"the served model is not prepared ({model}): run `triage models prepare`")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))

    def count(text: str) -> int:
        ids = tok.apply_chat_template(chat_messages([{"role": "user", "content": text}]), add_generation_prompt=True,
                                      tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return len(ids)

    return count


BENCH_LENGTHS = "answer_lengths.json"   # in data/bench: `scripts/answer_lengths.py --bench`


def text_key(text: str) -> str:
    """A text's key in data/bench/answer_lengths.json (no text is stored there)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def answer_tokens(max_tokens: int) -> Callable[[str], int]:
    """Text -> the output tokens the served model gives it, capped at `max_tokens`:
    measured at bench serve's own sampling (temperature 0 over the served defaults) for
    every text bench serve sends (`data/bench/answer_lengths.json`, up to the cap it was
    measured at); else a corpus text's length label (`data/triage/length_labels.jsonl`,
    the served defaults); else the cap."""
    from predictors.corpus import load_corpus, load_length_labels
    from triage.paths import data_dir

    labels = load_length_labels()
    by_text = {r["text"]: labels[r["id"]] for r in load_corpus() if r["id"] in labels}
    measured: dict[str, int] = {}
    path = data_dir() / "bench" / BENCH_LENGTHS
    if path.is_file():
        doc = json.loads(path.read_text(encoding="utf-8"))
        if max_tokens <= doc["measured_with"]["max_tokens"]:
            measured = doc["lengths"]

    def out(text: str) -> int:
        n = measured.get(text_key(text))
        return max(1, min(n if n is not None else by_text.get(text, max_tokens), max_tokens))
    return out


def burst_trace(texts: str, n: int, spread: float, *, seed: int = 0, max_tokens: int = 64,
                output_tokens: int = BURST_OUTPUT_TOKENS, predict: bool = True,
                progress: Callable[[str], None] | None = None):
    """The HTTP benchmark's burst as trace rows (gold level, kind, prompt tokens, the
    real output length: `answer_tokens` when `output_tokens` is 0, else
    `min(output_tokens, max_tokens)`; max_tokens) plus the TextPool
    of its distinct texts (with predictions) and each row's index into it."""
    from serving.bench.serve import burst_calls
    from serving.bench.texts import PoolError, load_chat, load_pool
    from triage.sim.inputs import TextPool
    from triage.sim.traces import TraceRequest

    try:
        calls = burst_calls(load_pool(texts), load_chat(), n, spread, seed=seed, max_tokens=max_tokens)
    except PoolError as e:
        fail(str(e))
    count = prompt_token_counter()
    uniq = list(dict.fromkeys(c.text for c in calls))
    index = {t: i for i, t in enumerate(uniq)}
    gold = {c.text: c.gold for c in calls}
    kind = {c.text: c.kind for c in calls}
    tokens = {t: count(t) for t in uniq}
    levels = lengths = None
    info: dict = {}
    if predict:
        try:
            levels, lengths, info = predict_cached(uniq, progress)
        except FileNotFoundError as e:
            fail(str(e))
    pool = TextPool(texts, [gold[t] for t in uniq], [kind[t] for t in uniq], levels, lengths)
    out = answer_tokens(max_tokens) if output_tokens == 0 else (lambda _t: min(output_tokens, max_tokens))
    rows = [TraceRequest(c.at, tokens[c.text], out(c.text), c.gold, text=None, max_tokens=max_tokens, kind=c.kind)
            for c in sorted(calls, key=lambda c: (c.at, c.idx))]
    picks = [index[c.text] for c in sorted(calls, key=lambda c: (c.at, c.idx))]
    return rows, pool, picks, info
