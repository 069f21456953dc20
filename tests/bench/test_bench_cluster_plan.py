"""bench cluster's process plan: who runs at which priority (no engine is started here)."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serving.bench import cluster
from serving.engine import lower_engine_priority


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


@pytest.mark.parametrize("nice", [0, 10])
def test_instances_http_servers_start_at_the_front_ends_priority(started, nice):
    calls, tmp = started
    plan = cluster.ClusterPlan(instances=2, workdir=tmp, nice=nice)
    for i in range(2):
        cluster.start_instance(i, plan, stock=False, model="m")
    cluster.start_instance(0, plan, stock=True, model="m")
    assert [c[3] for c in calls] == [nice] * 3
    assert [c[2] for c in calls] == ["instance0.log", "instance1.log", "instance0-stock.log"]


def test_an_instances_engine_children_run_below_it():
    """What wait_instance does once an instance answers, with `--engine-nice 5`: its child
    processes (vLLM's EngineCore and workers) get 5 more, the instance's own HTTP process
    none, so the front end's classifier and the instances' HTTP servers win the CPU from
    the engines (a starved front end once held ESI-1 calls 9.4 s, docs/deploy.md)."""
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"])
    try:
        import psutil

        deadline = time.time() + 10
        while not psutil.Process(parent.pid).children() and time.time() < deadline:
            time.sleep(0.05)
        (child,) = psutil.Process(parent.pid).children()
        before = child.nice()
        assert lower_engine_priority(5, parent.pid) == [child.pid]
        assert child.nice() == min(19, before + 5)
        assert psutil.Process(parent.pid).nice() == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        for p in psutil.Process(parent.pid).children(recursive=True):
            p.kill()
        parent.kill()
        parent.wait()


def test_instances_and_front_end_share_the_benchs_session_in_groups_of_their_own(tmp_path):
    """Nice values only count inside one autogroup (one session): the front end and the
    instances must share the bench's session for the engines' lower priority to yield the
    front end's CPU, and each must lead its own process group so a kill takes it whole."""
    proc = cluster._popen([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ),
                          tmp_path / "p.log", 0)
    try:
        assert os.getsid(proc.pid) == os.getsid(0)
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
        cluster.kill_group(cluster.Server("p", "", None, proc, tmp_path / "p.log"))
        assert proc.returncode is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
