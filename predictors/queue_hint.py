"""The classifier queue's order under a backlog: the probably-urgent texts first.

The urgency classifier is the front end's costliest step per call, and in a mass-casualty
spike the calls arrive faster than it classifies them on cores it shares with the engine.
Its queue was first come, first served, so an ESI-1 call waited behind every chat prompt
that came before it, only to learn afterwards that it was urgent (measured on a 2-core
AVX2 VM, 196 calls within 3 s to two instances: every level waited 1.3-1.6 s p50 in the
front end before its level was known; docs/measurements/cluster.md).

`QueueHint` is a cascade's cheap first stage: a word uni/bigram TF-IDF and a logistic
regression on the corpus's train split (`data/triage/corpus.jsonl`, never KTAS or
Semigran), ~0.1 ms a text in a batch against the classifier's milliseconds. The
`PredictorService` worker asks it only when more texts wait than one batch takes, and
then classifies the backlog in the order `rank`, arrival: rank 0 when P(ESI 1) >= 0.2,
1 when P(ESI 1-2) >= 0.5, else 2 (corpus test split: 0.99 of gold level-1 texts at rank 0,
1.7 % of the others). The hint decides nothing but that order: every text still gets its
level from the classifier, and a text it misjudges waits as it would have without it
(behind the backlog that came first, and the few texts it ranked above).

Opt-in (setting `predictor_queue_hint`, off by default): on real ED texts (KTAS) it ranks
0.81 of gold level-1 visits first against 1-3 % of levels 3-5, but on lay vignettes
(Semigran) it is no guide (emergencies 0.07 at rank 0, self-care 0.20), and live on a slow
2-core VM it moved ESI-1's first token by less than the run-to-run spread: with batches of 4
it cut ESI-1's wait in the front end from ~1.1 s to ~0.2 s p50, but there the ESI-1 prompts
then queued in the engines instead (docs/predictors.md, 2026-11-29).

The fitted model is cached beside the urgency model (`queue_hint.pkl`, keyed by the
corpus's hash; refitted in ~1 s when missing or stale).
"""
from __future__ import annotations

import hashlib
import logging
import pickle
from pathlib import Path
from typing import Sequence

import numpy as np

from predictors.corpus import corpus_path, load_corpus

log = logging.getLogger(__name__)

P1_RANK0 = 0.2     # P(ESI 1) from which a text goes first
P12_RANK1 = 0.5    # P(ESI 1-2) from which it goes before the rest
CACHE_NAME = "queue_hint.pkl"


class QueueHint:
    """`rank(texts)`: 0 (probably ESI 1), 1 (probably ESI 1-2) or 2 for each text."""

    def __init__(self, model, corpus_sha: str) -> None:
        self.model = model
        self.corpus_sha = corpus_sha
        self._col1 = list(model.classes_).index(1)
        self._col2 = list(model.classes_).index(2)

    @classmethod
    def fit(cls, corpus_sha: str) -> "QueueHint":
        """Fit on the corpus's train split (`predictors.corpus`), whose file hash is `corpus_sha`."""
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline

        train = load_corpus("train")
        if not train:
            raise ValueError("the corpus has no train split")
        model = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True),
                              LogisticRegression(C=4.0, max_iter=2000))
        model.fit([r["text"] for r in train], [int(r["level"]) for r in train])
        return cls(model, corpus_sha)

    @classmethod
    def load_or_fit(cls, cache_dir: Path | None) -> "QueueHint | None":
        """The cached hint when it was fitted on this corpus, else a fresh fit (cached when
        `cache_dir` is writable). None when it cannot be built (no corpus, no scikit-learn):
        the queue then stays first come, first served."""
        try:
            sha = hashlib.sha256(corpus_path().read_bytes()).hexdigest()
        except OSError as e:
            log.warning("queue hint off: %s", e)
            return None
        path = cache_dir / CACHE_NAME if cache_dir is not None else None
        if path is not None and path.exists():
            try:
                with open(path, "rb") as f:
                    hint = pickle.load(f)
                if isinstance(hint, cls) and hint.corpus_sha == sha:
                    return hint
            except Exception as e:   # a cache from another library version: refit
                log.info("queue hint cache %s not usable (%s): refitting", path, type(e).__name__)
        try:
            hint = cls.fit(sha)
        except (ImportError, ValueError, OSError) as e:
            log.warning("queue hint off: %s", e)
            return None
        if path is not None:
            try:
                tmp = path.with_suffix(".tmp")
                with open(tmp, "wb") as f:
                    pickle.dump(hint, f)
                tmp.replace(path)
            except OSError:
                pass
        return hint

    def rank(self, texts: Sequence[str]) -> list[int]:
        p = self.model.predict_proba(list(texts))
        p1 = p[:, self._col1]
        p12 = p1 + p[:, self._col2]
        return np.where(p1 >= P1_RANK0, 0, np.where(p12 >= P12_RANK1, 1, 2)).tolist()
