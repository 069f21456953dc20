"""Workload traces: loaders for the shared datasets and synthetic generators.

Every loader returns `TraceRequest`s sorted by arrival, with arrival times in seconds
from the first request, divided by `rate_scale` (a scale of 2 doubles the load).
Levels come from a `level` column when the file has one; otherwise they are drawn from
a seeded mix, by default the KTAS expert distribution (2/17/38/36/6 % for ESI 1-5).

A `TraceRequest` is the truth: its `level` is the *gold* urgency (what every report is
grouped by) and `output_len` the tokens the simulated engine produces. What the
scheduler is told may differ (`seen_level`, `seen_output`: set by `triage.sim.inputs`
for `--levels/--lengths predicted|noisy:E`); None means it is told the truth (oracle).
"""
from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

KTAS_MIX = (0.02, 0.17, 0.38, 0.36, 0.06)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    arrival: float
    prompt_len: int
    output_len: int
    level: int                         # gold level
    text: str | None = None
    seen_level: int | None = None      # the level the scheduler sees (None: gold, the oracle)
    seen_output: int | None = None     # the output length the scheduler sees (None: the true one)
    max_tokens: int | None = None      # the client's cap: the engine never predicts beyond it
    kind: str = "dispatch"             # dispatch | chat (burst scenario)

    @property
    def scheduler_level(self) -> int:
        return self.level if self.seen_level is None else self.seen_level

    @property
    def scheduler_output(self) -> int:
        """What the scheduler sees as predicted_output_len (capped by max_tokens, as the
        live engine caps the length head's estimate)."""
        o = self.output_len if self.seen_output is None else self.seen_output
        return max(1, min(o, self.max_tokens)) if self.max_tokens else max(1, o)


def _open(path: Path) -> io.TextIOBase:
    return gzip.open(path, "rt") if str(path).endswith(".gz") else open(path, newline="")


def _parse_azure_ts(s: str) -> float:
    # "2023-11-16 18:15:46.6805900": 7 fractional digits, more than fromisoformat takes
    head, _, frac = s.partition(".")
    return datetime.fromisoformat(head).timestamp() + (float("0." + frac) if frac else 0.0)


def draw_levels(n: int, seed: int, mix: tuple[float, ...] = KTAS_MIX) -> np.ndarray:
    p = np.asarray(mix, dtype=float)
    if (p < 0).any() or p.sum() <= 0:
        raise ValueError(f"invalid level mix {mix}")
    rng = np.random.default_rng(seed)
    return rng.choice(np.arange(1, len(p) + 1), size=n, p=p / p.sum())


def clip_lengths(prompt: int, output: int, max_len: int | None) -> tuple[int, int]:
    """Fit one request into an engine that serves `max_len` tokens (prompt + output), as
    a client of vLLM must (it rejects longer requests): the output keeps at most half,
    the prompt is cut to the rest. Requests that fit are unchanged."""
    if max_len is None or prompt + output <= max_len:
        return prompt, output
    out = max(1, min(output, max_len // 2))
    return max(1, min(prompt, max_len - out)), out


def load_trace(path: str | Path, *, limit: int | None = None, rate_scale: float = 1.0, seed: int = 0,
               mix: tuple[float, ...] = KTAS_MIX, min_output: int = 1, max_len: int | None = None) -> list[TraceRequest]:
    """Azure LLM 2023 (`TIMESTAMP,ContextTokens,GeneratedTokens`), Mooncake
    (`timestamp_ms,input_length,output_length,…`) or a generic CSV
    (`arrival,prompt_tokens,output_tokens[,level]`). With `max_len`, every request is
    clipped to it (`clip_lengths`; pass the profile's `max_request_tokens`)."""
    if rate_scale <= 0:
        raise ValueError("rate_scale must be > 0")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace {path} not found")
    rows: list[tuple[float, int, int, int | None]] = []
    with _open(path) as f:
        reader = csv.DictReader(f)
        cols = set(reader.fieldnames or ())
        for row in reader:
            if limit is not None and len(rows) >= limit:
                break
            if "TIMESTAMP" in cols:
                rows.append((_parse_azure_ts(row["TIMESTAMP"]), int(row["ContextTokens"]), int(row["GeneratedTokens"]), None))
            elif "timestamp_ms" in cols:
                rows.append((float(row["timestamp_ms"]) / 1000.0, int(row["input_length"]), int(row["output_length"]), None))
            elif {"arrival", "prompt_tokens", "output_tokens"} <= cols:
                lvl = row.get("level")
                rows.append((float(row["arrival"]), int(row["prompt_tokens"]), int(row["output_tokens"]), int(lvl) if lvl else None))
            else:
                raise ValueError(f"{path.name}: unknown trace columns {sorted(cols)}")
    if not rows:
        raise ValueError(f"{path.name}: no requests")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    drawn = draw_levels(len(rows), seed, mix)
    return [
        TraceRequest((t - t0) / rate_scale, *clip_lengths(max(1, p), max(min_output, o), max_len),
                     lvl if lvl is not None else int(drawn[i]))
        for i, (t, p, o, lvl) in enumerate(rows)
    ]


def poisson_trace(n: int, rate: float, *, seed: int = 0, prompt: tuple[int, int] = (64, 1024),
                  output: tuple[int, int] = (16, 512), mix: tuple[float, ...] = KTAS_MIX) -> list[TraceRequest]:
    """n requests with exponential inter-arrival times at `rate` req/s and log-uniform lengths."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, size=n))
    t -= t[0]
    lp = np.exp(rng.uniform(np.log(prompt[0]), np.log(prompt[1]), size=n)).astype(int)
    lo = np.exp(rng.uniform(np.log(output[0]), np.log(output[1]), size=n)).astype(int)
    levels = draw_levels(n, seed + 1, mix)
    return [TraceRequest(float(t[i]), int(lp[i]), max(1, int(lo[i])), int(levels[i])) for i in range(n)]


LENGTH_FILES = {
    "sharegpt": "lengths_sharegpt_8k_llama2tok.csv.gz",
    "arxiv": "lengths_arxiv_summarization_llama2tok.csv.gz",
    "bwb": "lengths_bwb_translation_llama2tok.csv.gz",
}


def lengths_trace(name_or_path: str | Path, *, rate: float, limit: int | None = None, seed: int = 0,
                  mix: tuple[float, ...] = KTAS_MIX, max_len: int | None = None,
                  datasets: str | Path | None = None) -> list[TraceRequest]:
    """A token-length table (`num_prefill_tokens,num_decode_tokens,…`: ShareGPT, arXiv
    summarization, BWB translation) replayed with Poisson arrivals at `rate` req/s, as
    seeds 000 (ShareGPT) and 002 do for datasets without timestamps. `name_or_path` is
    sharegpt | arxiv | bwb (read from `datasets`, default the shared datasets beside the
    checkout) or a file. Rows keep the file's order
    (the first `limit`)."""
    if rate <= 0:
        raise ValueError("rate must be > 0 req/s")
    key = str(name_or_path)
    if datasets is None:
        from triage.paths import shared_datasets_dir
        datasets = shared_datasets_dir()
    path = Path(datasets) / LENGTH_FILES[key] if key in LENGTH_FILES else Path(key)
    if not path.exists():
        known = ", ".join(LENGTH_FILES)
        raise FileNotFoundError(f"length table {path} not found (names: {known}, or a file)")
    rows: list[tuple[int, int]] = []
    with _open(path) as f:
        reader = csv.DictReader(f)
        if not {"num_prefill_tokens", "num_decode_tokens"} <= set(reader.fieldnames or ()):
            raise ValueError(f"{path.name}: expected num_prefill_tokens,num_decode_tokens columns")
        for row in reader:
            if limit is not None and len(rows) >= limit:
                break
            rows.append((int(row["num_prefill_tokens"]), int(row["num_decode_tokens"])))
    if not rows:
        raise ValueError(f"{path.name}: no rows")
    rng = np.random.default_rng(seed)
    t = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, size=len(rows) - 1))])
    levels = draw_levels(len(rows), seed, mix)
    return [TraceRequest(float(t[i]), *clip_lengths(max(1, p), max(1, o), max_len), int(levels[i]))
            for i, (p, o) in enumerate(rows)]


def resolve_trace(spec: str | Path, *, rate: float | None = None, rate_scale: float = 1.0, **kw) -> list[TraceRequest]:
    """`lengths:NAME` (Poisson arrivals at `rate` × `rate_scale` req/s) or a trace file
    (`load_trace`, its own arrivals divided by 1/`rate_scale`)."""
    s = str(spec)
    if s.startswith("lengths:"):
        if rate is None:
            raise ValueError("a lengths:NAME trace needs --rate (requests per second)")
        if rate_scale <= 0:
            raise ValueError("rate_scale must be > 0")
        return lengths_trace(s.split(":", 1)[1], rate=rate * rate_scale, **kw)
    return load_trace(spec, rate_scale=rate_scale, **kw)


def concurrent_spikes(*, arrivals: int, max_concurrent: int, gap: float, seed: int = 0,
                      prompt: tuple[int, int] = (32, 256), output: tuple[int, int] = (8, 128),
                      mix: tuple[float, ...] = KTAS_MIX) -> list[TraceRequest]:
    """Seed 004 §4.1's spike workload: an arrival every `gap` seconds, each bringing
    1..`max_concurrent` *simultaneous* requests (uniform; the paper: "each arrival may
    contain up to 100 concurrent requests", 5 outside spikes). Lengths log-uniform in the
    given ranges (the paper's EMS conversations are short and not public), levels from
    `mix`."""
    if arrivals < 1 or max_concurrent < 1 or gap <= 0:
        raise ValueError("arrivals and max_concurrent must be >= 1 and gap > 0")
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, max_concurrent + 1, size=arrivals)
    n = int(counts.sum())
    lp = np.exp(rng.uniform(np.log(prompt[0]), np.log(prompt[1]), size=n)).astype(int)
    lo = np.exp(rng.uniform(np.log(output[0]), np.log(output[1]), size=n)).astype(int)
    levels = draw_levels(n, seed + 1, mix)
    times = np.repeat(np.arange(arrivals) * gap, counts)
    return [TraceRequest(float(times[i]), int(lp[i]), max(1, int(lo[i])), int(levels[i])) for i in range(n)]


def spike_trace(base: list[TraceRequest], *, at: float, count: int, level: int, gap: float = 0.1,
                prompt_len: int = 200, output_len: int = 100) -> list[TraceRequest]:
    """`base` plus a burst of `count` requests of one level, `gap` seconds apart, from `at`
    (seed 004 §4.1's spike experiment)."""
    burst = [TraceRequest(at + i * gap, prompt_len, output_len, level) for i in range(count)]
    return sorted([*base, *burst], key=lambda r: r.arrival)
