"""Labelled text pools for the HTTP benchmarks: each text carries its *gold* level, so
latency is reported per true urgency, whatever the classifier said.

    pool = load_pool("corpus-test")          # dispatch texts with gold ESI levels
    chat = load_chat()                       # ordinary chat prompts (gold 5, kind "chat")
    levels = classify([t.text for t in pool]) # our classifier's levels, computed once
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from triage.paths import data_dir

POOLS = ("corpus-test", "ktas")


class PoolError(ValueError):
    pass


@dataclass(frozen=True)
class Text:
    text: str
    gold: int
    kind: str = "dispatch"     # dispatch | chat


def _non_dispatch(row: dict) -> bool:
    return "non_dispatch" in str(row.get("kind", "")) + str(row.get("source", ""))


def load_pool(name: str) -> list[Text]:
    """`corpus-test` (our corpus's test split, dispatch texts only), `ktas` (the KTAS
    evaluation set, expert levels: evaluation only, never training), or a JSONL file of
    `{"text", "level"}` rows."""
    if name == "corpus-test":
        from predictors.corpus import load_corpus

        return [Text(r["text"], int(r["level"])) for r in load_corpus("test") if not _non_dispatch(r)]
    if name == "ktas":
        from predictors.evaluate import load_ktas

        texts, gold, _ = load_ktas()
        return [Text(t, int(g)) for t, g in zip(texts, gold)]
    if name == "semigran":
        raise PoolError("semigran has three advice classes, not ESI levels: use corpus-test, ktas or a JSONL file")
    path = Path(name)
    if not path.is_file():
        raise PoolError(f"unknown --texts {name!r}: use one of {', '.join(POOLS)} or a JSONL file of "
                        "{\"text\", \"level\"} rows")
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(Text(str(row["text"]), int(row["level"]), str(row.get("kind", "dispatch"))))
        except (ValueError, KeyError, TypeError) as e:
            raise PoolError(f"{path}:{i}: expected a JSON object with 'text' and 'level' ({e})") from None
    if not out:
        raise PoolError(f"{path} holds no texts")
    bad = sorted({t.gold for t in out} - {1, 2, 3, 4, 5})
    if bad:
        raise PoolError(f"{path}: levels must be 1-5, found {bad}")
    return out


def load_chat() -> list[Text]:
    """The ordinary chat prompts of `data/bench/chat_prompts.txt` (gold level 5)."""
    lines = (data_dir() / "bench" / "chat_prompts.txt").read_text(encoding="utf-8").splitlines()
    return [Text(x.strip(), 5, "chat") for x in lines if x.strip() and not x.startswith("#")]


def classify(texts: list[str]) -> list[int]:
    """Our classifier's levels (the shipped predictors, run once, in this process)."""
    from predictors.service import Predictor

    p = Predictor()
    out: list[int] = []
    for i in range(0, len(texts), 32):
        out.extend(p.levels(texts[i:i + 32]))
    return out
