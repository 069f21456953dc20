"""Console login sessions: an API key is exchanged once for an opaque session id that
travels in an HTTP-only, SameSite=Strict cookie; the key itself never reaches the
browser's storage or JavaScript.

    sid, s = store.open(principal)        # at login
    store.get(sid)  -> Session | None     # every request; None when unknown or expired
    store.close(sid)                      # logout

Sessions live in memory only (a restart logs everyone out). A session keeps its key in
this process's memory and has it checked again on each call (the key store's short cache),
so revoking the key ends its console sessions too. Each carries a CSRF token
that the console sends back in the `X-Triage-CSRF` header on every state-changing call:
a cookie alone never authorises a change.
"""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass

COOKIE = "triage_session"
CSRF_HEADER = "x-triage-csrf"


@dataclass(frozen=True)
class Session:
    key: str               # checked again on every call (serving.auth.KeyStore.check)
    role: str
    csrf: str
    expires: float


class SessionStore:
    def __init__(self, ttl_s: float = 12 * 3600, clock=time.time) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._s: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, key: str, role: str) -> tuple[str, Session]:
        sid = secrets.token_urlsafe(32)
        s = Session(key, role, secrets.token_urlsafe(24), self.clock() + self.ttl_s)
        with self._lock:
            self._prune()
            self._s[sid] = s
        return sid, s

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        with self._lock:
            s = self._s.get(sid)
            if s is not None and s.expires <= self.clock():
                del self._s[sid]
                return None
            return s

    def close(self, sid: str | None) -> None:
        with self._lock:
            self._s.pop(sid or "", None)

    def _prune(self) -> None:
        now = self.clock()
        for k in [k for k, s in self._s.items() if s.expires <= now]:
            del self._s[k]
