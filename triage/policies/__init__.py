"""Scheduling policies, one per file, registered by name."""
from triage.policies.base import POLICIES, Policy, SchedulerView, register
from triage.policies import (  # noqa: F401  (registration)
    fcfs, fcfs_prefill_first, sarathi, hpjf, semantic, slidebatching, triage_policy,
    edf, sjf, vtc, fairbatching, sedf, slidingserve,
)


def make_policy(name: str, **params) -> Policy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return cls(**params)


__all__ = ["POLICIES", "Policy", "SchedulerView", "make_policy", "register"]
