"""The audit database's tables (SQLAlchemy 2.0). Alembic (`migrations/`) is the only way
the schema changes; `triage db check` shows that the migrations equal these models.

Times are UNIX epoch seconds (float) so reports compute latencies without time zones;
`created_at`-style columns are for people and carry a time zone.
"""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import (Boolean, DateTime, Float, Index, Integer, MetaData, String, Text,
                        UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class RequestRow(Base):
    __tablename__ = "requests"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    client_request_id: Mapped[str | None] = mapped_column(String(128))
    api_key_id: Mapped[str | None] = mapped_column(String(32))
    endpoint: Mapped[str] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(128))
    classifier_level: Mapped[int | None] = mapped_column(Integer)   # the urgency model's own argmax
    predicted_level: Mapped[int | None] = mapped_column(Integer)    # the predictor's decision (after escalation)
    override_level: Mapped[int | None] = mapped_column(Integer)     # caller priority or operator relabel
    effective_level: Mapped[int] = mapped_column(Integer)
    ttft_slo: Mapped[float] = mapped_column(Float)
    tpot_slo: Mapped[float] = mapped_column(Float)
    classes_version: Mapped[int] = mapped_column(Integer)
    arrival: Mapped[float] = mapped_column(Float)
    dispatched: Mapped[float | None] = mapped_column(Float)
    first_token: Mapped[float | None] = mapped_column(Float)
    finish: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    max_tokens: Mapped[int | None] = mapped_column(Integer)
    predicted_output_len: Mapped[int | None] = mapped_column(Integer)
    queue_time: Mapped[float | None] = mapped_column(Float)
    ttft: Mapped[float | None] = mapped_column(Float)
    max_tpot: Mapped[float | None] = mapped_column(Float)
    mean_tpot: Mapped[float | None] = mapped_column(Float)
    tdg_gain: Mapped[float | None] = mapped_column(Float)
    tdg_ideal: Mapped[float | None] = mapped_column(Float)
    slo_met: Mapped[bool] = mapped_column(Boolean, default=False)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    instance: Mapped[str | None] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(16))   # ok | length | shed | aborted | cancelled | shutdown | engine_restart | interrupted | error
    prompt: Mapped[str | None] = mapped_column(Text)    # only with store_prompts=true

    __table_args__ = (Index("ix_requests_arrival", "arrival"), Index("ix_requests_effective_level", "effective_level"))


def arrived(q, t0: float | None, t1: float | None):
    """`q` restricted to the requests that arrived in [t0, t1) (either end open when None)."""
    if t0 is not None:
        q = q.where(RequestRow.arrival >= t0)
    if t1 is not None:
        q = q.where(RequestRow.arrival < t1)
    return q


class PriorityClassRow(Base):
    __tablename__ = "priority_classes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version: Mapped[int] = mapped_column(Integer)
    level: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    weight: Mapped[float] = mapped_column(Float)
    ttft: Mapped[float] = mapped_column(Float)
    tpot: Mapped[float] = mapped_column(Float)
    w_first: Mapped[float] = mapped_column(Float)
    w_decode: Mapped[float] = mapped_column(Float)
    actor: Mapped[str | None] = mapped_column(String(64))
    created: Mapped[float] = mapped_column(Float)
    # the urgency model's escalation threshold in force with this version (None: off / not known)
    escalate_below: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str | None] = mapped_column(Text)    # why the editor made this version

    __table_args__ = (UniqueConstraint("version", "level", name="uq_priority_classes_version_level"),)


class RelabelRow(Base):
    __tablename__ = "relabels"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64), index=True)
    actor: Mapped[str] = mapped_column(String(64))
    at: Mapped[float] = mapped_column(Float)
    from_level: Mapped[int] = mapped_column(Integer)
    to_level: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    stage: Mapped[str] = mapped_column(String(16))   # queued | running


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)   # the public prefix of the key
    role: Mapped[str] = mapped_column(String(16))
    name: Mapped[str | None] = mapped_column(String(128))
    salt: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class AuditEventRow(Base):
    """Append-only; `hash = sha256(prev_hash + canonical JSON of the row)` (see chain.py)."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str | None] = mapped_column(String(64))
    request_id: Mapped[str | None] = mapped_column(String(64), index=True)
    payload: Mapped[str] = mapped_column(Text)      # canonical JSON
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)


ROLES = ("client", "operator", "auditor", "admin")


class RelabelExampleRow(Base):
    """An operator relabel as a labelled example of the site's protocol (serving.adapt):
    the request's site features (base64 float32; never its text), the operator's level and
    the general model's own decision. Written through the audit writer, sealed by an event."""

    __tablename__ = "relabel_examples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64), index=True)
    actor: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str] = mapped_column(String(32))
    role: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Float)
    level: Mapped[int] = mapped_column(Integer)
    general_level: Mapped[int] = mapped_column(Integer)
    features: Mapped[str] = mapped_column(Text)
    feature_version: Mapped[int] = mapped_column(Integer)
    general_fingerprint: Mapped[str] = mapped_column(String(64))


class SiteModelRow(Base):
    """A site adapter version: its files under <state dir>/site_models/v<version>, its held-out
    figures and verdict, and its state: candidate (passed the gate), refused, live, retired."""

    __tablename__ = "site_models"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    created: Mapped[float] = mapped_column(Float)
    actor: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    passed: Mapped[bool] = mapped_column(Boolean, default=False)
    verdict: Mapped[str] = mapped_column(Text)
    path: Mapped[str] = mapped_column(Text)
    general_fingerprint: Mapped[str] = mapped_column(String(64))
    n_train: Mapped[int] = mapped_column(Integer)
    n_holdout: Mapped[int] = mapped_column(Integer)
    figures: Mapped[str] = mapped_column(Text)       # JSON: held-out adapted / current / general, training info
    promoted_at: Mapped[float | None] = mapped_column(Float)
