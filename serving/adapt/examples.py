"""The relabel log as training data for a site adapter.

When an operator (or admin) relabels a live request, the request's site features
(`predictors.site_features`: the general model's pooled vector and probabilities plus the
parsed vital signs; never the text) are stored with the operator's level and the general
model's own decision, in `relabel_examples`, through the audit writer (so a database outage
spools them instead of losing them). Only relabels by keys that are operators or admins
*when the adapter is fitted* (not revoked) are read back: a row from any other role, or from
a key since revoked or demoted, never reaches an adapter.
"""
from __future__ import annotations

import base64
import time
from dataclasses import dataclass

import numpy as np
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from serving.db.models import ApiKeyRow, RelabelExampleRow
from serving.db.writer import Record

TRUSTED_ROLES = ("operator", "admin")


def encode(x: np.ndarray) -> str:
    return base64.b64encode(np.asarray(x, dtype="<f4").tobytes()).decode("ascii")


def decode(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype="<f4").astype(np.float32)


def example_record(request_id: str, features: np.ndarray, level: int, general_level: int, actor_key: str, role: str,
                   fingerprint: str, feature_version: int) -> Record:
    now = time.time()
    row = {"request_id": request_id, "actor": f"{role}:{actor_key}", "key_id": actor_key, "role": role, "at": now,
           "level": int(level), "general_level": int(general_level), "features": encode(features),
           "feature_version": int(feature_version), "general_fingerprint": fingerprint}
    return Record("relabel.example", now, row["actor"], request_id,
                  {"level": int(level), "general_level": int(general_level), "general_fingerprint": fingerprint},
                  "relabel_examples", [row])


@dataclass
class RelabelLog:
    X: np.ndarray
    y: np.ndarray              # the operators' levels 1-5
    general: np.ndarray        # the general model's levels 1-5
    at: np.ndarray
    ids: list[int]
    skipped: dict              # why rows were left out: {"untrusted_key": n, "other_general_model": n, ...}


def load_log(engine: Engine, fingerprint: str, feature_version: int) -> RelabelLog:
    """The trusted relabels for the general model `fingerprint`, oldest first. A request
    relabelled several times counts once, with its last level."""
    with Session(engine) as s:
        keys = {k.id: k for k in s.scalars(select(ApiKeyRow))}
        rows = list(s.scalars(select(RelabelExampleRow).order_by(RelabelExampleRow.at, RelabelExampleRow.id)))
    skipped = {"untrusted_key": 0, "other_general_model": 0, "superseded": 0}
    last: dict[str, RelabelExampleRow] = {}
    for r in rows:
        k = keys.get(r.key_id)
        if r.role not in TRUSTED_ROLES or k is None or k.revoked or k.role not in TRUSTED_ROLES:
            skipped["untrusted_key"] += 1
            continue
        if r.general_fingerprint != fingerprint or r.feature_version != feature_version:
            skipped["other_general_model"] += 1
            continue
        if r.request_id in last:
            skipped["superseded"] += 1
        last[r.request_id] = r
    kept = sorted(last.values(), key=lambda r: (r.at, r.id))
    X = np.stack([decode(r.features) for r in kept]) if kept else np.zeros((0, 0), np.float32)
    return RelabelLog(X, np.array([r.level for r in kept], dtype=int), np.array([r.general_level for r in kept], dtype=int),
                      np.array([r.at for r in kept]), [r.id for r in kept], skipped)
