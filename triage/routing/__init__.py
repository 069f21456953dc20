"""Routers across engine instances, one interface for simulated and live instances."""
from triage.routing.base import REJECT, ROUTERS, InstanceLoad, Router, StateLoad, register
from triage.routing import simple, pab, gorouting  # noqa: F401  (registration)


def make_router(name: str, **params) -> Router:
    try:
        cls = ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(sorted(ROUTERS))}") from None
    return cls(**params)


__all__ = ["REJECT", "ROUTERS", "InstanceLoad", "Router", "StateLoad", "make_router", "register"]
