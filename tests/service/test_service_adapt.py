"""Site adaptation (serving/adapt): the promotion gate, rollback, refusals, and that only
operators' relabels reach an adapter.

The registry tests run on a real SQLite database with relabel logs built from synthetic
site features (the real feature layout, a small pooled vector), so each takes about a
second; the API test drives the real service (simulated backend, trained predictors)."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from predictors.adapter import AdaptError
from predictors.site_features import FEATURE_VERSION, site_features
from predictors.site_slot import SiteSlot
from serving.adapt.examples import encode, load_log
from serving.adapt.registry import NotPromotable, SiteRegistry
from serving.auth import create_key
from serving.db.models import AuditEventRow, RelabelExampleRow, SiteModelRow
from serving.db.session import make_engine, upgrade

FP = "f" * 32
HIDDEN = 8


@pytest.fixture()
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _key(eng, role: str) -> str:
    return create_key(eng, role, "test").split("_")[1]


def _probs(levels, confident: np.ndarray) -> np.ndarray:
    """General-model probabilities: mass on `levels`, 0.95 where `confident`, else 0.6."""
    p = np.full((len(levels), 5), 0.0)
    top = np.where(confident, 0.95, 0.6)
    p += ((1 - top) / 4)[:, None]
    p[np.arange(len(levels)), np.asarray(levels) - 1] = top
    return p


def _write_log(eng, key_id: str, role: str, gold, general, pooled, confident, t0: float = 0.0, prefix: str = "r") -> None:
    X = site_features(pooled, _probs(general, confident), ["a call"] * len(gold))
    rows = [{"request_id": f"{prefix}{i}", "actor": f"{role}:{key_id}", "key_id": key_id, "role": role, "at": t0 + i,
             "level": int(g), "general_level": int(gl), "features": encode(x), "feature_version": FEATURE_VERSION,
             "general_fingerprint": FP} for i, (g, gl, x) in enumerate(zip(gold, general, X))]
    with eng.begin() as c:
        c.execute(insert(RelabelExampleRow), rows)


def _site(n: int, seed: int = 0):
    """A site whose operators grade 3/4/5 by pooled[1] (the general model says 3 for all of
    them) and agree with the general model, confidently, on 1-2."""
    rng = np.random.default_rng(seed)
    gold = rng.choice([1, 2, 3, 4, 5], size=n, p=[0.12, 0.2, 0.28, 0.25, 0.15])
    pooled = rng.normal(size=(n, HIDDEN))
    pooled[:, 1] += np.select([gold == 3, gold == 4, gold == 5], [-2.5, 0.0, 2.5], 0.0)
    pooled[:, 2] += np.where(gold <= 2, 2.0 * (3 - gold), 0.0)
    general = np.where(gold <= 2, gold, 3)
    return gold, general, pooled, gold <= 2


def _registry(eng, tmp_path, slot=None) -> SiteRegistry:
    return SiteRegistry(eng, tmp_path / "site_models", FP, slot)


def test_too_few_relabels_or_one_class_is_refused_and_changes_nothing(db, tmp_path):
    reg = _registry(db, tmp_path, SiteSlot())
    with pytest.raises(AdaptError, match="empty"):
        reg.adapt("admin:x")
    op = _key(db, "operator")
    gold = np.full(40, 3)
    _write_log(db, op, "operator", gold, gold, np.zeros((40, HIDDEN)), gold < 0)
    with pytest.raises(AdaptError, match="all 40 relabels are level 3"):
        reg.adapt("admin:x")
    g, gl, pooled, conf = _site(30)
    _write_log(db, op, "operator", g, gl, pooled, conf, t0=100, prefix="s")
    with pytest.raises(AdaptError, match="too few relabels per level"):
        reg.adapt("admin:x", min_per_level=10)
    with Session(db) as s:
        assert s.scalar(select(func.count()).select_from(SiteModelRow)) == 0
    assert not (tmp_path / "site_models").exists() or not any((tmp_path / "site_models").iterdir())
    assert reg.slot.live is None


def test_relabels_by_non_operator_keys_never_reach_the_adapter(db):
    op, client, revoked, auditor = _key(db, "operator"), _key(db, "client"), _key(db, "operator"), _key(db, "auditor")
    g, gl, pooled, conf = _site(20)
    _write_log(db, op, "operator", g, gl, pooled, conf, prefix="ok")
    _write_log(db, client, "client", g, gl, pooled, conf, t0=50, prefix="c")          # a client's row
    _write_log(db, auditor, "operator", g, gl, pooled, conf, t0=80, prefix="a")       # claims operator; key is an auditor's
    _write_log(db, revoked, "operator", g, gl, pooled, conf, t0=120, prefix="rv")     # key revoked since
    from serving.db.models import ApiKeyRow

    with db.begin() as c:
        c.execute(ApiKeyRow.__table__.update().where(ApiKeyRow.id == revoked).values(revoked=True))
    log = load_log(db, FP, FEATURE_VERSION)
    assert len(log.y) == 20 and log.skipped["untrusted_key"] == 60


def test_an_adapter_that_raises_under_triage_is_not_promoted(db, tmp_path):
    """Operators graded a cluster 3 for a long time, then 2 (newest, held out). The general
    model says 2 there (not confidently, so no floor): the adapter, which learnt 3, would
    under-triage the held-out level-2 calls. It is stored as refused and cannot be promoted."""
    op = _key(db, "operator")
    g, gl, pooled, conf = _site(240)
    cluster = np.zeros((60, HIDDEN))
    cluster[:, 5] = 4.0
    old = 3 * np.ones(45, dtype=int)
    _write_log(db, op, "operator", np.r_[g[:180], old], np.r_[gl[:180], 2 * np.ones(45, int)],
               np.r_[pooled[:180], cluster[:45]], np.r_[conf[:180], np.zeros(45, bool)])
    new = 2 * np.ones(15, dtype=int)
    _write_log(db, op, "operator", np.r_[g[180:], new], np.r_[gl[180:], new], np.r_[pooled[180:], cluster[45:]],
               np.r_[conf[180:], np.zeros(15, bool)], t0=1000, prefix="n")
    slot = SiteSlot()
    reg = _registry(db, tmp_path, slot)
    res = reg.adapt("admin:x", holdout=0.25)
    fig = res["figures"]
    assert not res["passed"], res["verdict"]
    assert "under-triage" in res["verdict"]
    assert fig["adapted"]["under_triage_1_2"] > fig["general"]["under_triage_1_2"]
    with pytest.raises(NotPromotable):
        reg.promote(res["version"], "admin:x")
    assert slot.live is None and reg.rows()[0].status == "refused"


def test_promotion_rollback_and_a_failed_promotion(db, tmp_path):
    op = _key(db, "operator")
    g, gl, pooled, conf = _site(300, seed=1)
    _write_log(db, op, "operator", g, gl, pooled, conf)
    slot = SiteSlot()
    reg = _registry(db, tmp_path, slot)
    res = reg.adapt("admin:x")
    fig = res["figures"]
    assert res["passed"], res["verdict"]
    assert fig["adapted"]["accuracy"] > fig["general"]["accuracy"]
    assert fig["adapted"]["under_triage_1_2"] <= fig["general"]["under_triage_1_2"]
    v1 = res["version"]
    reg.promote(v1, "admin:x")
    assert slot.live.version == v1 and reg.live_row().version == v1
    # the live adapter decides: a level-5 request of this site (general model: 3) becomes 5
    X = site_features(pooled[g == 5][:5], _probs(gl[g == 5][:5], conf[g == 5][:5]), ["a call"] * 5)
    levels, version, _, _ = slot.apply(X, list(gl[g == 5][:5]))
    assert version == v1 and (levels == 5).mean() >= 0.6

    # a second candidate on the same log does not beat the live v1: stored, refused
    res2 = reg.adapt("admin:x")
    assert not res2["passed"] and "does not beat" in res2["verdict"]

    # rollback: v1 retired, the general model serves alone
    assert reg.rollback("admin:x") == {"live": None, "rolled_back": v1}
    assert slot.live is None and reg.live_row() is None
    with pytest.raises(NotPromotable):
        reg.rollback("admin:x")

    # a promotion that fails half way (its files are damaged) leaves the previous state serving
    (tmp_path / "site_models" / f"v{v1}" / "adapter.npz").write_bytes(b"not an npz")
    with pytest.raises(Exception):
        reg.promote(v1, "admin:x")
    assert slot.live is None and reg.live_row() is None
    kinds = [k for (k,) in Session(db).execute(select(AuditEventRow.kind).order_by(AuditEventRow.id))]
    assert kinds == ["site_model.fitted", "site_model.promoted", "site_model.fitted", "site_model.rolled_back"]


def test_service_records_only_operator_relabels_and_lists_models(db_url, tmp_path, predictors_dir):
    """Through the API: a client may not relabel (403) and leaves no example; an operator's
    relabel is kept with the request's features; adapt on that one-class log refuses (409)
    and changes nothing; GET /admin/models lists (operators) and POST is admin-only."""
    from conftest import Server, chat, make_keys, make_settings

    keys = make_keys(db_url)
    s = make_settings(db_url, tmp_path, predictors_dir, max_inflight=1, default_max_tokens=48)
    with Server(s) as srv:
        admin, op, client = srv.client(keys["admin"]), srv.client(keys["operator"]), srv.client(keys["client"])
        import threading

        threads = [threading.Thread(target=chat, args=(client, f"ankle sprain {i}, walking fine")) for i in range(4)]
        for t in threads:
            t.start()
        waiting = []
        t0 = time.monotonic()
        while not waiting and time.monotonic() - t0 < 20:
            snap = op.get("/admin/queue").json()
            waiting = [r["request_id"] for lv in snap["by_level"].values() for r in lv]
            time.sleep(0.05)
        assert waiting, "no request waited"
        rid = waiting[0]
        assert client.patch(f"/admin/requests/{rid}", json={"level": 1, "reason": "x"}).status_code == 403
        r = op.patch(f"/admin/requests/{rid}", json={"level": 2, "reason": "site protocol"})
        assert r.status_code == 200, r.text
        for t in threads:
            t.join(60)
        srv.state.writer.sync(10)
        eng = srv.state.db
        with Session(eng) as sess:
            rows = list(sess.scalars(select(RelabelExampleRow)))
        assert [(x.request_id, x.level, x.role) for x in rows] == [(rid, 2, "operator")]
        assert len(np.frombuffer(__import__("base64").b64decode(rows[0].features), "<f4")) > 384

        assert op.get("/admin/models").status_code == 200
        assert op.post("/admin/models/adapt").status_code == 403
        r = admin.post("/admin/models/adapt", json={"min_per_level": 5})
        assert r.status_code == 409 and "all 1 relabels are level 2" in r.json()["error"]["message"], r.text
        listing = admin.get("/admin/models").json()
        assert listing["models"] == [] and listing["live"] is None and listing["serving"] == "general"
        assert admin.post("/admin/models/rollback").status_code == 409
        assert admin.post("/admin/models/7/promote").status_code == 404
        assert json.loads(admin.post("/admin/models/adapt", json={"holdout": 2}).text)["error"]["param"]
