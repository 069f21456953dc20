"""Key management: list, create, revoke, rotate. One place for the API (`/admin/keys`,
admin role) and the CLI (`triage keys ...`); every change returns the audit `Record` that
says who did what (key id, role, name: never the secret).

Rotation issues a new key with the same role and name and revokes the old one in the
same transaction. The last active admin key cannot be revoked (nobody could manage keys
afterwards); rotating it is allowed.
"""
from __future__ import annotations

import secrets
import time
from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from serving.auth import _hash
from serving.db.models import ROLES, ApiKeyRow
from serving.db.writer import Record


class KeyNotFound(KeyError):
    pass


class LastAdmin(ValueError):
    pass


def _public(row: ApiKeyRow) -> dict:
    return {"id": row.id, "role": row.role, "name": row.name,
            "created_at": row.created_at.isoformat() if row.created_at else None, "revoked": bool(row.revoked)}


def _new_row(role: str, name: str | None) -> tuple[ApiKeyRow, str]:
    kid = secrets.token_hex(6)
    key = f"tri_{kid}_{secrets.token_urlsafe(32)}"
    salt = secrets.token_hex(16)
    return ApiKeyRow(id=kid, role=role, name=name, salt=salt, hash=_hash(salt, key),
                     created_at=datetime.now(timezone.utc), revoked=False), key


def list_keys(engine: Engine) -> list[dict]:
    with Session(engine) as s:
        return [_public(r) for r in s.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id))]


def create(engine: Engine, role: str, name: str | None, actor: str) -> tuple[dict, str, Record]:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    row, key = _new_row(role, name)
    with Session(engine) as s, s.begin():
        s.add(row)
        out = _public(row)
    return out, key, Record("key.created", time.time(), actor, None, {"key_id": out["id"], "role": role, "name": name})


def revoke(engine: Engine, key_id: str, actor: str) -> tuple[dict, Record]:
    with Session(engine) as s, s.begin():
        row = s.get(ApiKeyRow, key_id)
        if row is None:
            raise KeyNotFound(key_id)
        if row.role == "admin" and not row.revoked:
            others = s.scalars(select(ApiKeyRow.id).where(ApiKeyRow.role == "admin", ApiKeyRow.revoked.is_(False),
                                                          ApiKeyRow.id != key_id)).first()
            if others is None:
                raise LastAdmin(f"key {key_id} is the last active admin key; create another admin key first")
        was = bool(row.revoked)
        row.revoked = True
        out = _public(row)
    return out, Record("key.revoked", time.time(), actor, None,
                       {"key_id": key_id, "role": out["role"], "name": out["name"], "already_revoked": was})


def rotate(engine: Engine, key_id: str, actor: str) -> tuple[dict, str, Record]:
    with Session(engine) as s, s.begin():
        old = s.get(ApiKeyRow, key_id)
        if old is None:
            raise KeyNotFound(key_id)
        if old.revoked:
            raise ValueError(f"key {key_id} is revoked; create a new key instead")
        row, key = _new_row(old.role, old.name)
        s.add(row)
        old.revoked = True
        out = {**_public(row), "replaces": key_id}
    return out, key, Record("key.rotated", time.time(), actor, None,
                            {"key_id": out["id"], "replaces": key_id, "role": out["role"], "name": out["name"]})
