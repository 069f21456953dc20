"""Per-key abuse limits, by role: a request rate (token bucket) and a cap on concurrent
generation requests.

    limiter = KeyLimiter(settings.role_limits)
    limiter.hit(principal)                 # every authenticated call; Limited when over its rate
    release = limiter.acquire(principal)   # a generation request enters the queue; Limited at the cap
    release()                              # it finished (served, shed, aborted, failed): exactly once

Both refusals are 429 with `Retry-After`: the rate's says when the bucket holds a token
again, the cap's is the service's `retry_after_s`. Limits are per key, so one client key
cannot fill the admission queue ahead of the other keys at its level; they are by role
so operators and admins (who may relabel and set priorities) get more room than clients.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field


class RoleLimit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rps: float = Field(..., gt=0, description="sustained requests per second per key")
    burst: int = Field(..., gt=0, description="requests a key may make at once before the rate applies")
    concurrency: int = Field(..., gt=0, description="generation requests a key may have queued or running")


DEFAULT_ROLE_LIMITS: dict[str, RoleLimit] = {
    "client": RoleLimit(rps=50, burst=100, concurrency=128),
    "operator": RoleLimit(rps=200, burst=400, concurrency=512),
    "auditor": RoleLimit(rps=20, burst=40, concurrency=16),
    "admin": RoleLimit(rps=200, burst=400, concurrency=512),
}


class Limited(Exception):
    def __init__(self, reason: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.reason = reason            # rate | concurrency
        self.message = message
        self.retry_after = retry_after


@dataclass
class _Bucket:
    tokens: float
    at: float
    active: int = 0


class KeyLimiter:
    def __init__(self, limits: dict[str, RoleLimit], *, retry_after_s: int = 2, on_limited=None) -> None:
        self.limits = {**DEFAULT_ROLE_LIMITS, **limits}
        self.retry_after_s = retry_after_s
        self.on_limited = on_limited or (lambda role, reason: None)
        self._keys: dict[str, _Bucket] = {}
        self._lock = threading.Lock()   # FastAPI runs the auth dependency in its thread pool

    def _bucket(self, key_id: str, lim: RoleLimit, now: float) -> _Bucket:
        b = self._keys.get(key_id)
        if b is None:
            b = self._keys[key_id] = _Bucket(float(lim.burst), now)
        else:
            b.tokens = min(float(lim.burst), b.tokens + (now - b.at) * lim.rps)
            b.at = now
        return b

    def hit(self, principal) -> None:
        lim = self.limits[principal.role]
        now = time.monotonic()
        with self._lock:
            b = self._bucket(principal.key_id, lim, now)
            if b.tokens >= 1.0:
                b.tokens -= 1.0
                return
            wait = (1.0 - b.tokens) / lim.rps
        self.on_limited(principal.role, "rate")
        raise Limited("rate", f"rate limit: this key ({principal.role}) may make {lim.rps:g} requests per second "
                              f"(bursts of {lim.burst}); retry after {math.ceil(wait)} s", max(1, math.ceil(wait)))

    def acquire(self, principal):
        lim = self.limits[principal.role]
        with self._lock:
            b = self._bucket(principal.key_id, lim, time.monotonic())
            if b.active >= lim.concurrency:
                full = True
            else:
                b.active += 1
                full = False
        if full:
            self.on_limited(principal.role, "concurrency")
            raise Limited("concurrency", f"concurrency limit: this key ({principal.role}) already has "
                                         f"{lim.concurrency} requests queued or running", self.retry_after_s)
        done = [False]

        def release() -> None:
            with self._lock:
                if not done[0]:
                    done[0] = True
                    b.active -= 1

        return release

    def active(self, key_id: str) -> int:
        with self._lock:
            b = self._keys.get(key_id)
            return b.active if b else 0
