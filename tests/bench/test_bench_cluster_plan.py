"""bench cluster's process plan (no engine is started here: the processes are recorded)."""
from pathlib import Path

import pytest

from serving.bench import cluster


@pytest.fixture
def started(monkeypatch, tmp_path):
    calls = []

    class Proc:
        def poll(self):
            return None

    def fake_popen(cmd, env, log, nice):
        calls.append((cmd, env, Path(log).name, nice))
        return Proc()

    monkeypatch.setattr(cluster, "_popen", fake_popen)
    monkeypatch.setattr(cluster, "port_free", lambda port: True)
    return calls, tmp_path


@pytest.mark.parametrize("front_nice, engine_nice", [(0, 5), (10, 15), (19, 19)])
def test_co_located_instances_run_below_the_front_end(started, front_nice, engine_nice):
    """The front end classifies every call, in arrival order, before its level is known: the
    engines must not starve it (as the single-process service nices its engine)."""
    calls, tmp = started
    plan = cluster.ClusterPlan(instances=2, workdir=tmp, nice=front_nice)
    for i in range(2):
        cluster.start_instance(i, plan, stock=False, model="m")
    cluster.start_instance(0, plan, stock=True, model="m")
    assert [c[3] for c in calls] == [engine_nice] * 3
    assert [c[2] for c in calls] == ["instance0.log", "instance1.log", "instance0-stock.log"]
