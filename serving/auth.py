"""API keys and roles.

A key is `tri_<id>_<secret>`; the table stores the id, the role, a random salt and
sha256(salt + key). Keys are checked in constant time and never logged; a verified key's
role is cached in memory under the key's hash only.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Callable

from fastapi import Depends, Request
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from serving.api.errors import APIError
from serving.db.models import ROLES, ApiKeyRow
from serving.limits import Limited

# what each role may do; admin may do everything
ROLE_GRANTS = {
    "client": {"client"},
    "operator": {"client", "operator"},
    "auditor": {"auditor"},
    "admin": {"client", "operator", "auditor", "admin"},
}


class AuthError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Principal:
    key_id: str
    role: str

    def can(self, need: str) -> bool:
        return need in ROLE_GRANTS.get(self.role, set())

    @property
    def actor(self) -> str:
        return f"{self.role}:{self.key_id}"


def _hash(salt: str, key: str) -> str:
    return hashlib.sha256((salt + key).encode("utf-8", "surrogatepass")).hexdigest()


def create_key(engine: Engine, role: str, name: str | None = None) -> str:
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    kid = secrets.token_hex(6)
    key = f"tri_{kid}_{secrets.token_urlsafe(32)}"
    salt = secrets.token_hex(16)
    with Session(engine) as s, s.begin():
        s.add(ApiKeyRow(id=kid, role=role, name=name, salt=salt, hash=_hash(salt, key),
                        created_at=datetime.now(timezone.utc), revoked=False))
    return key


def count_keys(engine: Engine) -> int:
    with Session(engine) as s:
        return int(s.scalar(select(func.count()).select_from(ApiKeyRow)) or 0)


class KeyStore:
    """Verified keys are cached by the key's hash for `cache_s` seconds, then checked
    against the database again, so a key revoked by another process (`triage keys
    revoke`) stops working within `cache_s` without a restart; the API's own revocation
    (`forget`) takes effect at once. While the database is unreachable a cached key keeps
    working (a stale entry rather than locking everyone out)."""

    def __init__(self, engine: Engine, cache_s: float = 5.0) -> None:
        self.engine = engine
        self.cache_s = cache_s
        self._cache: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    def forget(self, key_id: str) -> None:
        with self._lock:
            for d in [d for d, (p, _) in self._cache.items() if p.key_id == key_id]:
                del self._cache[d]

    def check(self, key: str) -> Principal:
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(digest)
        if hit is not None and now - hit[1] < self.cache_s:
            return hit[0]
        parts = key.split("_")
        if len(parts) < 3 or parts[0] != "tri" or len(parts[1]) > 32:
            raise AuthError(401, "invalid API key")
        kid = parts[1]
        try:
            with Session(self.engine) as s:
                row = s.get(ApiKeyRow, kid)
        except Exception:
            if hit is not None:
                return hit[0]
            raise AuthError(503, "key store unavailable (database unreachable) and key not cached") from None
        # compare even when the row is missing so timing says nothing about ids
        salt, stored = (row.salt, row.hash) if row else ("x" * 32, "0" * 64)
        ok = hmac.compare_digest(_hash(salt, key), stored)
        if not ok or row is None or row.revoked:
            with self._lock:
                self._cache.pop(digest, None)
            raise AuthError(401, "invalid API key" if not (ok and row is not None) else "this API key has been revoked")
        p = Principal(kid, row.role)
        with self._lock:
            self._cache[digest] = (p, now)
        return p


def bearer(request: Request) -> str:
    h = request.headers.get("authorization", "")
    scheme, _, token = h.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError(401, "missing API key: send 'Authorization: Bearer KEY'")
    return token.strip()


SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def principal(request: Request) -> Principal:
    """Who is calling: the bearer key, else the console's session cookie (whose CSRF
    token must come back in a header on anything but a read)."""
    if request.headers.get("authorization"):
        return request.app.state.keys.check(bearer(request))
    from serving.console.sessions import COOKIE, CSRF_HEADER

    sid = request.cookies.get(COOKIE)
    store = getattr(request.app.state, "sessions", None)
    if sid and store is not None:
        s = store.get(sid)
        if s is None:
            raise AuthError(401, "console session expired or unknown: log in again at /ui/login")
        if request.method not in SAFE_METHODS and not hmac.compare_digest(request.headers.get(CSRF_HEADER, ""), s.csrf):
            raise AuthError(403, f"missing or wrong {CSRF_HEADER} header for a console session")
        return request.app.state.keys.check(s.key)   # a revoked key ends its sessions too
    return request.app.state.keys.check(bearer(request))


def rate_limit(request: Request, p: Principal) -> None:
    """The key's request rate (serving/limits.py): 429 with Retry-After when over it."""
    limiter = getattr(request.app.state, "limiter", None)
    if limiter is not None:
        try:
            limiter.hit(p)
        except Limited as e:
            raise APIError(429, e.message, code="rate_limited", headers={"Retry-After": str(e.retry_after)}) from None


def require(role: str) -> Callable[[Request], Principal]:
    return require_any(role)


def require_any(*roles: str) -> Callable[[Request], Principal]:
    """A dependency admitting a caller whose role grants any of `roles`."""

    def dep(request: Request) -> Principal:
        p = principal(request)
        rate_limit(request, p)
        if not any(p.can(r) for r in roles):
            raise AuthError(403, f"this key's role ({p.role}) may not use this endpoint (needs {' or '.join(roles)})")
        return p

    dep.__name__ = "require_" + "_or_".join(roles)
    return dep


ClientKey = Annotated[Principal, Depends(require("client"))]
OperatorKey = Annotated[Principal, Depends(require("operator"))]
AuditorKey = Annotated[Principal, Depends(require("auditor"))]
# reads that operators and auditors both need (the class table, the history log, the live queue)
StaffKey = Annotated[Principal, Depends(require_any("operator", "auditor"))]
AdminKey = Annotated[Principal, Depends(require("admin"))]
