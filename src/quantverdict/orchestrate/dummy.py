"""Shape-only checkpoints for ``bench.server.load_format=dummy``: a synthetic model served by vLLM with random
weights it makes itself, so a 70B-class shape needs no 140 GB of weights on disk.

vLLM's dummy loader (``--load-format dummy``) builds the model from ``config.json`` and its
``quantization_config`` and fills the parameters with random values; it reads no weight file. So a
shape checkpoint is a folder with the model's ``config.json`` (plus, for a quantized scheme, the
``quantization_config`` llm-compressor writes), the borrowed tokenizer and no ``*.safetensors``.

The ``quantization_config`` is not written by hand: the scheme's recipe, resolved for the *real* model's
dimensions (group size included), quantizes a small proxy of the same architecture (:func:`proxy_config`:
same ``model_type`` and options, 1 layer of width 256), and its compressed-tensors ``quantization_config``
(config groups, format, ignore list: none of it depends on the layer sizes) goes into the shape's
``config.json``. Memory then comes from the prediction (:func:`quantverdict.orchestrate.hardware.predict_weight_bytes`)
and from the vLLM log; the checkpoint's bytes are not measured, and the record says so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from quantverdict.children.materialize import DIM_KEYS
from quantverdict.config.schema import Config, ConfigError, ModelConfig
from quantverdict.orchestrate import caches, preflight
from quantverdict.processes.envs import StageEnv
from quantverdict.results.record import Checkpoint, StageInfo

log = logging.getLogger(__name__)

SHAPE_INFO = "quantverdict_shape.json"  # written last: the shape folder is complete
NOT_MEASURED = "not measured: bench.server.load_format=dummy serves random weights made by vLLM (no checkpoint files)"
# the proxy's dimensions: small, and divisible by every group size the schemes use (128, 64, 32)
PROXY_DIMS = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
PROXY_VOCAB = 49152  # the borrowed tokenizer's (smollm2-135m): every id must lie inside the vocabulary


def _synthetic_config(model: ModelConfig) -> dict[str, Any]:
    syn = model.synthetic
    if model.source != "synthetic" or syn is None:
        raise ConfigError(
            f"bench.server.load_format=dummy serves a shape: model.source must be synthetic, not {model.source}"
        )
    if "text_config" in syn.config:
        raise ConfigError(
            f"bench.server.load_format=dummy: model {model.name} nests its text model (text_config); shapes are "
            "made for flat decoder configs (e.g. llama3.1-70b-shape). Use bench.server.load_format=auto"
        )
    return dict(syn.config)


def shape_dims(config: dict[str, Any]) -> dict[str, Any]:
    """``model.dims`` of a flat decoder config, as the materialize stage reports them (``head_dim`` defaulted
    to ``hidden_size / num_attention_heads``; every layer holds a KV cache)."""
    dims = {k: config.get(k) for k in DIM_KEYS}
    if dims["head_dim"] is None and dims["hidden_size"] and dims["num_attention_heads"]:
        dims["head_dim"] = int(dims["hidden_size"]) // int(dims["num_attention_heads"])
    if dims["tie_word_embeddings"] is None:
        dims["tie_word_embeddings"] = False
    dims["num_kv_layers"] = dims["num_hidden_layers"]
    return dims


def shape_model(model: ModelConfig) -> dict[str, Any]:
    """The materialize result of a shape: ``dims`` and ``num_parameters`` from the config, no folder yet.

    Raises:
        ConfigError: not a synthetic model, or a nested (``text_config``) one.
    """
    config = _synthetic_config(model)
    assert model.synthetic is not None
    return {
        "path": None,
        "architecture": model.synthetic.architecture,
        "model_type": config.get("model_type"),
        "dims": shape_dims(config),
        "num_parameters": preflight.synthetic_parameters(config),
        "dtype": model.dtype,
        "source": "synthetic",
        "load_format": "dummy",
    }


def proxy_config(config: dict[str, Any]) -> dict[str, Any]:
    """The real config with the proxy's dimensions (:data:`PROXY_DIMS`) and vocabulary; every other key
    (``model_type``, rope, norms, biases) is the real one."""
    vocab = min(int(config.get("vocab_size") or PROXY_VOCAB), PROXY_VOCAB)
    return {**config, **PROXY_DIMS, "vocab_size": vocab, "max_position_embeddings": 4096}


def shape_checkpoint(
    cfg: Config,
    env: StageEnv,
    recipe: dict[str, Any],
    method: str,
    versions: dict[str, str],
    tokenizer_path: str,
    cache: Path,
    out: Path,
    st: StageInfo,
) -> Checkpoint:
    """The shape folder of ``cfg.model`` in ``cfg.scheme`` (``cache/shapes/<model>/<scheme>-<key>``), made once.

    The proxy (:func:`proxy_config`) is materialized and quantized with ``recipe`` (resolved for the real
    dimensions) through the ordinary caches; the folder gets the real ``config.json`` with the proxy
    checkpoint's ``quantization_config``, and the proxy's tokenizer and generation files.

    Returns:
        The record's ``checkpoint`` section: ``path`` (the shape folder), ``key`` (the proxy checkpoint's),
        ``cached``, ``quantized``, ``load_format`` (``dummy``), ``proxy_path``, ``quantization_config``.
    """
    config = _synthetic_config(cfg.model)
    assert cfg.model.synthetic is not None
    proxy_model = dataclasses.replace(
        cfg.model,
        name=f"{cfg.model.name}-proxy",
        synthetic=dataclasses.replace(cfg.model.synthetic, config=proxy_config(config)),
    )
    proxy = caches.materialize(proxy_model, env, cache, out, StageInfo(), {"tokenizer_path": tokenizer_path})
    ck = Checkpoint.model_validate(
        caches.quantize(
            dataclasses.replace(cfg, model=proxy_model), env, proxy, recipe, method, versions, cache, out, StageInfo()
        )
    )
    src = Path(str(ck.path))
    quantized = ck.key is not None  # a cached checkpoint has no "quantized"; the baseline no key
    qconfig = json.loads((src / "config.json").read_text()).get("quantization_config") if quantized else None
    target = cache / "shapes" / cfg.model.name / f"{cfg.scheme.name}-{ck.key or 'unquantized'}"
    result = Checkpoint(
        path=str(target),
        key=ck.key,
        quantized=quantized,
        load_format="dummy",
        proxy_path=str(src),
        quantization_config=qconfig,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    with caches.exclusive_lock(target.with_name(f".{target.name}.lock")):  # jobs of a parallel grid: one builds
        result.cached = (target / SHAPE_INFO).is_file()
        if result.cached:
            st.status, st.detail = "cached", f"shape {target} (dummy weights)"
            return result
        _write_shape(target, Path(proxy["path"]), src, config, qconfig, result.to_dict())
    st.detail = f"shape {target}: config.json {'with the quantization_config of ' + str(src) if qconfig else ''}"
    return result


def _write_shape(
    target: Path,
    proxy_dir: Path,
    src: Path,
    config: dict[str, Any],
    qconfig: dict[str, Any] | None,
    result: dict[str, Any],
) -> None:
    """Write the shape folder atomically (a ``.partial`` folder renamed into place)."""
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in proxy_dir.iterdir():  # tokenizer, generation config: not the weights, not our json
        if (
            f.is_file()
            and ".safetensors" not in f.name  # the weights and their shard index
            and not f.name.startswith("quantverdict_")
            and f.name != "config.json"
        ):
            shutil.copy2(f, tmp / f.name)
    real = {**json.loads((src / "config.json").read_text()), **config}
    real.pop("quantization_config", None)
    if qconfig:
        real["quantization_config"] = qconfig
    (tmp / "config.json").write_text(json.dumps(real, indent=2))
    (tmp / SHAPE_INFO).write_text(json.dumps(result, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
