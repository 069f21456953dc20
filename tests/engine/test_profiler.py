"""The committed `vllm-cpu-smollm2` profile is what its committed engine samples give, and
it meets the fit target (held-out MAPE <= 10 %). No engine: the samples were recorded by
`triage profile fit --backend vllm ... --samples-out data/profiles/samples/vllm-cpu-smollm2.json`."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from serving.profiler import fit_profile  # noqa: E402
from triage.paths import data_dir  # noqa: E402


def test_committed_profile_refits_from_its_samples_within_target():
    raw = json.loads((data_dir() / "profiles" / "samples" / "vllm-cpu-smollm2.json").read_text())
    committed = json.loads((data_dir() / "profiles" / "vllm-cpu-smollm2.json").read_text())
    prof = fit_profile(raw["samples"], name="vllm-cpu-smollm2", engine_info=raw["engine"], loadavg=raw.get("loadavg"))
    assert prof["estimator"] == pytest.approx(committed["estimator"])
    assert prof["mape"] == committed["mape"] <= 0.10
    assert prof["policy_params"] == committed["policy_params"]
    assert prof["policy_params"]["triage"]["safety"] >= 1.0
    assert len(prof["mape_detail"]["proserve_other_splits"]) == 9
