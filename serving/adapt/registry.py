"""Site adapter versions: fit on the relabel log, gate, store, promote, shadow, roll back.

    reg = SiteRegistry(db_engine, state_dir() / "site_models", fingerprint, slot)
    reg.adapt(actor)            # fit on the trusted relabel log; held-out gate; a new version row
    reg.shadow(v, actor)        # the candidate predicts beside the live decisions (agreement counted)
    reg.promote(v, actor)       # only a version that passed the gate; swaps the live adapter
    reg.rollback(actor)         # back to the previously promoted version, or the general model
    reg.sync_live()             # the service: follow the database (a CLI promotion, another front end)

The log is split by time: the oldest (1 - holdout) share trains, the newest share is held
out. A candidate passes (`predictors.adapter.promotion_verdict`) only if on the held-out
relabels it beats the current decisions' accuracy (the live adapter's, or the general
model's) and its under-triage of levels 1-2 is not above the general model's. Every version
is a row of `site_models` plus files under `<state dir>/site_models/v<N>`; every fit,
refusal, promotion, shadowing and rollback is an event in the hash-chained audit log,
written in the same transaction as the row it changes. A promotion loads and checks the
candidate's files first, then commits the database change, then swaps the live adapter (one
attribute assignment): if any step fails, the previous model keeps serving.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection, Engine

from predictors.adapter import AdaptError, SiteAdapter, compare, fit_adapter, promotion_verdict
from predictors.site_features import FEATURE_VERSION, VITALS_NAMES
from serving.adapt.examples import load_log
from serving.db.chain import canonical
from serving.db.models import SiteModelRow
from serving.db.session import CHAIN_LOCK, SITE_LOCK, write_lock
from serving.db.writer import insert_event, last_hash

log = logging.getLogger(__name__)

MIN_PER_LEVEL = 10
HOLDOUT = 0.25


class NotPromotable(ValueError):
    pass


def general_fingerprint(urgency_dir: Path) -> str:
    """The general urgency model's identity: its weights and its calibration/threshold."""
    import hashlib

    from predictors.onnx_graph import weights_fingerprint

    urgency_dir = Path(urgency_dir)
    h = hashlib.sha256(weights_fingerprint(urgency_dir).encode())
    h.update((urgency_dir / "triage_meta.json").read_bytes())
    return h.hexdigest()[:32]


def append_event(conn: Connection, kind: str, actor: str | None, payload: dict, at: float | None = None) -> None:
    """One audit event on the hash chain, inside the caller's transaction (same chain rule
    and lock as `serving.db.writer`)."""
    write_lock(conn, CHAIN_LOCK)
    insert_event(conn, last_hash(conn), time.time() if at is None else at, kind, actor, None, canonical(payload))


class SiteRegistry:
    def __init__(self, engine: Engine, root: Path, fingerprint: str, slot: Any | None = None) -> None:
        self.engine = engine
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.slot = slot            # predictors.site_slot.SiteSlot of the live predictor, or None (CLI)
        self.live_version: int | None = None

    # --- reading ---------------------------------------------------------------------------
    def rows(self) -> list[SiteModelRow]:
        from sqlalchemy.orm import Session

        with Session(self.engine) as s:
            return list(s.scalars(select(SiteModelRow).order_by(SiteModelRow.version)))

    def live_row(self) -> SiteModelRow | None:
        return next((r for r in self.rows() if r.status == "live"), None)

    def listing(self) -> dict:
        rows = self.rows()
        shadow = None
        if self.slot is not None and self.slot.shadow_stats is not None:
            shadow = self.slot.shadow_stats.to_json()
        live = next((r.version for r in rows if r.status == "live"), None)
        return {
            "general_fingerprint": self.fingerprint,
            "live": live, "serving": "general" if live is None else f"site adapter v{live} (general model as floor)",
            "shadow": shadow,
            "models": [{"version": r.version, "status": r.status, "passed": r.passed, "verdict": r.verdict,
                        "created": r.created, "actor": r.actor, "promoted_at": r.promoted_at, "n_train": r.n_train,
                        "n_holdout": r.n_holdout, "general_fingerprint": r.general_fingerprint,
                        "usable": r.general_fingerprint == self.fingerprint, "figures": json.loads(r.figures)}
                       for r in reversed(rows)],
        }

    def load_adapter(self, row: SiteModelRow) -> SiteAdapter:
        if row.general_fingerprint != self.fingerprint:
            raise NotPromotable(f"version {row.version} was fitted on another general model "
                                f"({row.general_fingerprint[:12]}; serving {self.fingerprint[:12]}): fit a new one")
        a = SiteAdapter.load(Path(row.path))
        if a.general_fingerprint != self.fingerprint or a.feature_version != FEATURE_VERSION:
            raise NotPromotable(f"the files of version {row.version} do not match its row (general model or features)")
        return a

    # --- fitting ---------------------------------------------------------------------------
    def adapt(self, actor: str, *, min_per_level: int = MIN_PER_LEVEL, holdout: float = HOLDOUT, seed: int = 0,
              progress: Callable[[str, int, int], None] | None = None) -> dict:
        """Fit a candidate on the trusted relabel log and store it as a new version (status
        candidate if it passes the gate, else refused). Raises AdaptError, changing nothing,
        when the log cannot support an adapter."""
        log_ = load_log(self.engine, self.fingerprint, FEATURE_VERSION)
        n = len(log_.y)
        if n == 0:
            raise AdaptError("the relabel log is empty for the current general model: operators have not relabelled "
                             f"any request yet (left out: {log_.skipped}; nothing was changed)")
        from predictors.adapter import check_log

        check_log(log_.y, min_per_level)
        n_hold = max(1, int(round(n * holdout)))
        tr, te = slice(0, n - n_hold), slice(n - n_hold, n)
        ytr, yte = log_.y[tr], log_.y[te]
        try:
            check_log(ytr, max(2, int(min_per_level * (1 - holdout))))
        except AdaptError as e:
            raise AdaptError(f"training part ({n - n_hold} oldest relabels): {e}") from None
        if not (yte <= 2).any():
            raise AdaptError(f"the held-out part (the newest {n_hold} relabels) has no level 1-2 relabel, so under-triage "
                             "cannot be checked; collect more relabels (nothing was changed)")
        hidden = log_.X.shape[1] - 5 - len(VITALS_NAMES)
        adapter = fit_adapter(log_.X[tr], ytr, log_.general[tr], hidden, seed=seed, min_per_level=2, head="auto",
                              general_fingerprint=self.fingerprint, progress=progress)
        live = self.live_row()
        current = log_.general[te]
        current_name = "general"
        if live is not None:
            try:
                current = self.load_adapter(live).decide(log_.X[te], log_.general[te])
                current_name = f"v{live.version}"
            except Exception as e:  # a live adapter that cannot be read is not serving either
                log.warning("live site adapter v%s unreadable (%s); comparing with the general model", live.version, e)
        fig = compare(yte, adapter.decide(log_.X[te], log_.general[te]), current, log_.general[te])
        fig["current"]["model"] = current_name
        ok, verdict = promotion_verdict(fig)
        fig["adapted"]["ece"] = _ece(adapter.probs(log_.X[te]), yte)
        fig["training"] = {k: adapter.info[k] for k in ("n_train", "counts", "head", "l2", "trees", "budget_under_triage_1_2", "oof")}
        fig["training"].update(under_weight=adapter.under_weight, temperature=adapter.temperature, skipped=log_.skipped)
        with self.engine.begin() as conn:
            write_lock(conn, SITE_LOCK)
            version = int(conn.execute(select(func.coalesce(func.max(SiteModelRow.version), 0))).scalar()) + 1
            path = self.root / f"v{version}"
            adapter.save(path)
            try:
                now = time.time()
                conn.execute(SiteModelRow.__table__.insert().values(
                    version=version, created=now, actor=actor, status="candidate" if ok else "refused", passed=ok,
                    verdict=verdict, path=str(path), general_fingerprint=self.fingerprint, n_train=int(len(ytr)),
                    n_holdout=int(len(yte)), figures=json.dumps(fig), promoted_at=None))
                append_event(conn, "site_model.fitted", actor, {"version": version, "passed": ok, "verdict": verdict,
                                                                "held_out": {k: fig[k] for k in ("adapted", "current", "general")}}, now)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)  # no files without their row
                raise
        log.info("site adapter v%d fitted on %d relabels: %s", version, n, verdict)
        return {"version": version, "passed": ok, "verdict": verdict, "figures": fig}

    # --- state changes ---------------------------------------------------------------------
    def _get(self, version: int) -> SiteModelRow:
        row = next((r for r in self.rows() if r.version == version), None)
        if row is None:
            raise KeyError(version)
        return row

    def promote(self, version: int, actor: str) -> dict:
        row = self._get(version)
        if not row.passed:
            raise NotPromotable(f"version {version} did not pass the promotion gate ({row.verdict})")
        if row.status == "live":
            raise NotPromotable(f"version {version} is already live")
        adapter = self.load_adapter(row)  # fails before anything changes
        now = time.time()
        with self.engine.begin() as conn:
            prev = conn.execute(select(SiteModelRow.version).where(SiteModelRow.status == "live")).scalar()
            conn.execute(update(SiteModelRow).where(SiteModelRow.status == "live").values(status="retired"))
            conn.execute(update(SiteModelRow).where(SiteModelRow.version == version).values(status="live", promoted_at=now))
            append_event(conn, "site_model.promoted", actor, {"version": version, "previous": prev}, now)
        self._swap(version, adapter)
        return {"live": version, "previous": prev}

    def rollback(self, actor: str) -> dict:
        """Retire the live version; the previously promoted one (if any, and usable) goes live,
        else the general model serves alone."""
        rows = self.rows()
        live = next((r for r in rows if r.status == "live"), None)
        if live is None:
            raise NotPromotable("no site adapter is live: the general model is already serving alone")
        earlier = sorted((r for r in rows if r.promoted_at is not None and r.version != live.version and r.passed
                          and r.general_fingerprint == self.fingerprint), key=lambda r: r.promoted_at, reverse=True)
        target, adapter = None, None
        for r in earlier:
            try:
                adapter, target = self.load_adapter(r), r.version
                break
            except Exception as e:
                log.warning("rollback: version %d unusable (%s); trying an earlier one", r.version, e)
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(update(SiteModelRow).where(SiteModelRow.version == live.version).values(status="retired"))
            if target is not None:
                conn.execute(update(SiteModelRow).where(SiteModelRow.version == target).values(status="live", promoted_at=now))
            append_event(conn, "site_model.rolled_back", actor, {"from": live.version, "to": target}, now)
        self._swap(target, adapter)
        return {"live": target, "rolled_back": live.version}

    def shadow(self, version: int | None, actor: str) -> dict:
        """Run `version` beside the live decisions (None: stop shadowing). Any stored version
        for this general model may be shadowed; agreement is counted from now on."""
        adapter = None
        if version is not None:
            adapter = self.load_adapter(self._get(version))
        with self.engine.begin() as conn:
            append_event(conn, "site_model.shadow", actor, {"version": version})
        if self.slot is not None:
            self.slot.set_shadow(version, adapter)
        return {"shadow": version}

    def _swap(self, version: int | None, adapter: SiteAdapter | None) -> None:
        if self.slot is not None:
            self.slot.set_live(version, adapter)
            if self.slot.shadow is not None and self.slot.shadow.version == version:
                self.slot.set_shadow(None, None)  # the shadow is now the live model
        self.live_version = version

    def sync_live(self) -> None:
        """Make the live predictor follow the database's live version (start-up, and after a
        promotion or rollback made elsewhere, e.g. `triage adapt --promote`)."""
        row = self.live_row()
        version = row.version if row else None
        if version == self.live_version and (self.slot is None or (self.slot.live.version if self.slot.live else None) == version):
            return
        if row is None:
            self._swap(None, None)
            return
        try:
            self._swap(row.version, self.load_adapter(row))
            log.info("site adapter v%d is live", row.version)
        except Exception as e:
            log.warning("site adapter v%d is marked live but cannot be used (%s): the general model serves alone",
                        row.version, e)
            self._swap(None, None)
            self.live_version = version  # do not retry every poll


def _ece(probs: np.ndarray, gold: np.ndarray) -> float:
    from predictors.calibration import expected_calibration_error

    return expected_calibration_error(probs, np.asarray(gold) - 1)
