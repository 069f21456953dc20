"""The Grafana dashboard (docs/grafana/triage-cluster.json) is valid JSON and names only
series that exist: the service's own (serving.metrics plus the remote backend's
per-instance series) and vLLM 0.32's `vllm:*` metrics."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

DASH = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "triage-cluster.json"
SUFFIXES = ("_bucket", "_total", "_count", "_sum")


def _base(name: str) -> str:
    for s in SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def test_dashboard_names_only_existing_series():
    from serving.backends.remote import RemoteBackend
    from serving.metrics import Metrics
    from serving.settings import Settings
    from triage.classes import load_classes

    d = json.loads(DASH.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    assert len(exprs) >= 10 and d["uid"] == "triage-cluster"
    names = {m for e in exprs for m in re.findall(r"\b(triage_[a-z_]+|vllm:[a-z_]+)", e)}
    m = Metrics()
    RemoteBackend(Settings(backend="remote", instances="http://127.0.0.1:1", db_url="sqlite:////tmp/unused.db"),
                  load_classes(), m)
    ours = {_base(x) for x in re.findall(r"^# TYPE (\S+)", m.render().decode(), re.M)}
    missing = sorted(n for n in names if n.startswith("triage_") and _base(n) not in ours)
    assert not missing, f"the dashboard names series the service does not export: {missing}"
    spec = importlib.util.find_spec("vllm")
    if spec is not None:
        src = (Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text()
        gone = sorted(n for n in names if n.startswith("vllm:") and f'"{_base(n)}' not in src)
        assert not gone, f"vLLM 0.32 has no such metric: {gone}"
