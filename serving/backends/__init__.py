"""Backends: where the engine-level decisions run. One interface (`base.Backend`)."""
from __future__ import annotations


def make_backend(settings, classes, metrics=None, engine=None):
    """Build the backend the settings name (imports the heavy one only when asked)."""
    if settings.backend == "simulated":
        from serving.backends.simulated import SimulatedBackend

        return SimulatedBackend(settings, classes, metrics)
    if settings.backend == "vllm":
        from serving.backends.vllm_backend import VLLMBackend

        return VLLMBackend(settings, classes, metrics, engine=engine)
    if settings.backend == "remote":
        from serving.backends.remote import RemoteBackend

        return RemoteBackend(settings, classes, metrics)
    raise ValueError(f"unknown backend {settings.backend!r} (vllm, simulated, remote)")
