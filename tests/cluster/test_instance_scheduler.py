"""Our scheduler class (real vLLM 0.32 `Scheduler`, hand-made KV config, no model) reads
the flat wire fields a remote front end sends and answers the load snapshot that
`GET /triage/load` serves. No `engine` marker: seconds, not minutes."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from serving.instance.fields import wire_xargs  # noqa: E402
from serving.peers import build_scheduler, stand_in_output  # noqa: E402


def _request(rid, prompt, max_tokens, priority, xargs, arrival):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=dict(xargs) if xargs else None)
    return Request(request_id=rid, prompt_token_ids=[(hash(rid) % 900) + 10] * prompt, sampling_params=sp,
                   pooling_params=None, arrival_time=arrival, priority=priority)


def test_flat_fields_reach_the_scheduler_and_the_load_snapshot():
    s = build_scheduler("triage", num_blocks=200, block_size=16, max_num_seqs=4, max_num_batched_tokens=256,
                        triage={"profile": "vllm-cpu-smollm2"})
    s.clock = lambda: 1000.0
    xa = wire_xargs(request_id="req-front-1", level=1, ttft_slo=0.7, tpot_slo=0.09, predicted_output_len=12,
                    waited_s=0.5)
    s.add_request(_request("chatcmpl-internal-1", 100, 20, 1, xa, arrival=1000.0))
    # a request from a plain vLLM client: priority only, no fields of ours
    s.add_request(_request("plain-2", 50, 20, 4, None, arrival=1000.0))
    r1 = s.tstate.requests["chatcmpl-internal-1"]
    assert (r1.level, r1.ttft_slo, r1.tpot_slo, r1.predicted_output_len) == (1, 0.7, 0.09, 12)
    assert r1.arrival == pytest.approx(999.5)           # the instance's arrival minus the front end's wait
    r2 = s.tstate.requests["plain-2"]
    assert r2.level == 4, "without our fields the level is vLLM's priority"
    snap = s.triage_control("load")
    assert snap["scheduler"] == "TriageScheduler"
    ids = {row["id"]: row for row in snap["waiting"]}
    assert set(ids) == {"req-front-1", "plain-2"}, "the snapshot speaks the front end's ids"
    assert ids["req-front-1"]["level"] == 1 and ids["req-front-1"]["need"] == 100
    assert ids["req-front-1"]["slack_s"] == pytest.approx(999.5 + 0.7 - 1000.0, abs=1e-3)
    assert {"beta", "a_p", "t_c"} <= set(snap["estimator"]) and snap["free_blocks"] > 0
    out = s.schedule()
    s.update_from_output(out, stand_in_output(s, out))
    snap = s.triage_control("load")
    assert {row["id"] for row in snap["running"]} >= {"req-front-1"}
    # a relabel by the front end's id (POST /triage/relabel) reaches the request
    s.triage_control("relabel", {"id": "req-front-1", "level": 2})
    s.schedule()
    assert s.tstate.requests["chatcmpl-internal-1"].level == 2


def test_an_instance_takes_policy_options_from_the_environment(monkeypatch):
    """`TRIAGE_POLICY_PARAMS` (the service's setting, in JSON) reaches a `triage instance`'s
    scheduler too, so an operator can set a policy option on every instance without
    writing `--additional-config`; the config, where it names options, wins; a bad value
    stops the start-up with a clear error."""
    from types import SimpleNamespace

    from serving.vllm_scheduler import TriageSettings

    monkeypatch.setenv("TRIAGE_POLICY_PARAMS", '{"max_preemptions": 1}')
    assert TriageSettings.from_vllm_config(SimpleNamespace(additional_config={})).policy_params == {"max_preemptions": 1}
    named = SimpleNamespace(additional_config={"triage": {"policy_params": {"eta": 2.0}}})
    assert TriageSettings.from_vllm_config(named).policy_params == {"eta": 2.0}
    monkeypatch.setenv("TRIAGE_POLICY_PARAMS", "{max_preemptions: 1")
    with pytest.raises(ValueError, match="TRIAGE_POLICY_PARAMS"):
        TriageSettings.from_vllm_config(SimpleNamespace(additional_config={}))


def test_a_step_log_path_gives_each_engine_process_its_own_file(monkeypatch):
    """`{pid}` in the step log's path becomes the engine process's id, whether the path comes
    from the service's setting (passed in the engine's config) or from `TRIAGE_STEP_LOG`
    (a `triage instance`): engines run one after another, or a standby beside the serving
    one, then write files of their own instead of interleaving lines in one."""
    import os
    from types import SimpleNamespace

    from serving.vllm_scheduler import TriageSettings

    pid = str(os.getpid())
    from_service = SimpleNamespace(additional_config={"triage": {"step_log": "/tmp/steps-{pid}.jsonl"}})
    assert TriageSettings.from_vllm_config(from_service).step_log == f"/tmp/steps-{pid}.jsonl"
    monkeypatch.setenv("TRIAGE_STEP_LOG", "/var/log/triage/{pid}.jsonl")
    assert TriageSettings.from_vllm_config(SimpleNamespace(additional_config={})).step_log == f"/var/log/triage/{pid}.jsonl"
    assert TriageSettings.from_vllm_config(from_service).step_log == f"/tmp/steps-{pid}.jsonl"   # the config wins
    plain = SimpleNamespace(additional_config={"triage": {"step_log": "/tmp/steps.jsonl"}})
    assert TriageSettings.from_vllm_config(plain).step_log == "/tmp/steps.jsonl"
