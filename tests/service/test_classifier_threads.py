"""How many threads the urgency classifier gets: one beside an in-process CPU engine (a
two-thread pass takes both cores at once and stalls both of the engine's OpenMP threads),
two where no engine shares the CPU; an operator's value always wins."""
from __future__ import annotations

import pydantic
import pytest

import serving.engine
from serving.app import classifier_threads
from serving.settings import Settings


@pytest.mark.parametrize("cpu, want", [(True, 1), (False, 2)])
def test_beside_the_in_process_engine_one_thread_on_cpu(monkeypatch, cpu, want):
    monkeypatch.setattr(serving.engine, "cpu_only", lambda: cpu)
    assert classifier_threads(Settings(backend="vllm")) == want


@pytest.mark.parametrize("backend, extra", [("simulated", {}), ("remote", {"instances": "http://127.0.0.1:8001"})])
def test_without_an_engine_beside_it_two_threads(monkeypatch, backend, extra):
    monkeypatch.setattr(serving.engine, "cpu_only", lambda: True)
    assert classifier_threads(Settings(backend=backend, **extra)) == 2


def test_an_operators_value_wins_and_zero_is_refused(monkeypatch):
    monkeypatch.setattr(serving.engine, "cpu_only", lambda: True)
    assert classifier_threads(Settings(backend="vllm", predictor_threads=2)) == 2
    monkeypatch.setenv("TRIAGE_PREDICTOR_THREADS", "3")
    assert classifier_threads(Settings(backend="simulated")) == 3
    with pytest.raises(pydantic.ValidationError, match="predictor_threads"):
        Settings(predictor_threads=0)
