"""vLLM's native KV offloading (seed 004's cache branch): sized automatically on a GPU,
refused with its reason on CPU, where vLLM 0.32 itself refuses it at engine start."""
from __future__ import annotations

import pytest

from serving.engine import AUTO_OFFLOAD_MAX_GIB, EngineConfig, cpu_only, kv_offload_gib


def test_auto_size_is_off_on_cpu_and_a_share_of_free_host_memory_on_gpu():
    assert kv_offload_gib(None, cpu=True, host_available_gib=200) == 0
    assert kv_offload_gib(None, cpu=False, host_available_gib=10) == 2          # a quarter, whole GiB
    assert kv_offload_gib(None, cpu=False, host_available_gib=3.9) == 0         # under 1 GiB: off
    assert kv_offload_gib(None, cpu=False, host_available_gib=500) == AUTO_OFFLOAD_MAX_GIB
    assert kv_offload_gib(6, cpu=False, host_available_gib=1) == 6              # an operator's size wins
    assert kv_offload_gib(0, cpu=True, host_available_gib=200) == 0
    with pytest.raises(ValueError, match="needs a GPU"):
        kv_offload_gib(4, cpu=True, host_available_gib=200)
    with pytest.raises(ValueError, match=">= 0"):
        kv_offload_gib(-1, cpu=False, host_available_gib=200)


@pytest.mark.skipif(not cpu_only(), reason="the refusal is the CPU engine's")
def test_cpu_service_refuses_an_offload_size_before_starting(monkeypatch):
    from typer.testing import CliRunner

    from serving.cli import app
    from serving.settings import Settings

    assert Settings().kv_offload_gib is None
    assert Settings(backend="simulated", kv_offload_gib=2).kv_offload_gib == 2   # no engine to offload from
    with pytest.raises(ValueError, match="kv_offload_gib=2.0: KV offloading needs a GPU engine"):
        Settings(kv_offload_gib=2)
    with pytest.raises(ValueError, match="needs a GPU"):   # the engine's own check, before vLLM is imported
        EngineConfig(kv_offload_gib=1).engine_args()
    monkeypatch.setenv("TRIAGE_KV_OFFLOAD_GIB", "2")
    r = CliRunner().invoke(app, ["serve"])
    assert r.exit_code == 2
    assert "KV offloading needs a GPU engine" in r.output and "host memory already" in r.output


def test_vllm_backend_sizes_the_offload_from_free_host_memory(monkeypatch):
    import types

    import psutil

    import serving.engine
    from serving.backends.vllm_backend import VLLMBackend
    from serving.settings import Settings
    from triage.classes import load_classes

    backend = VLLMBackend(Settings(), load_classes())
    if cpu_only():
        assert backend._config().kv_offload_gib == 0
    # as on a GPU host with 40 GiB free: a quarter of it goes to the engine's offloading
    monkeypatch.setattr(serving.engine, "cpu_only", lambda: False)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=40 * 2**30))
    assert backend._config().kv_offload_gib == 10
