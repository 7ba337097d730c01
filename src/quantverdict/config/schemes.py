"""Scheme registry: what a scheme's recipe needs from the model, computed in one place.

A scheme file (``conf/scheme/<name>.yaml``) holds an llm-compressor recipe in its own
``<stage>_stage -> <group>_modifiers -> <Modifier>: {args}`` shape. Two things in it depend on the
model and are filled here rather than copied per model:

* ``group_size: auto`` -> the largest of ``scheme.group_size_candidates`` that divides the
  ``in_features`` of every quantized Linear layer (:func:`derive_group_size`). Group-wise
  quantization (compressed-tensors ``strategy: group``) cuts each weight row, i.e. the
  ``in_features`` axis, into groups of ``group_size`` columns with one scale (and zero point) each;
  a group size that does not divide ``in_features`` leaves a ragged last group that vLLM's kernels
  refuse.
* the keep-16-bit patterns (``scheme.ignore``, ``model.quantize_ignore``) in every ``ignore`` list: a plain
  module name becomes the regex that matches it wherever it sits (:func:`quantverdict.measure.keep16.anywhere`:
  ``lm_head`` -> ``re:(?:.*\\.)?lm_head$``, which also keeps ``language_model.lm_head`` 16-bit).
* the checkpoint cache key (:func:`checkpoint_key`): everything that changes the quantized weights.

The orchestrator side imports this module; the quantize child receives the resolved recipe as JSON.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantverdict.config.schema import Config, ConfigError, SchemeConfig, closest
from quantverdict.measure.keep16 import anywhere

SCHEME_ORDER = {  # tables, reviews: 16-bit, 8-bit, 4-bit weights; within each, weight-only first
    s: i
    for i, s in enumerate(("bf16", "int8", "fp8", "fp8_block", "w8a8", "gptq", "awq", "w4afp8", "nvfp4a16", "nvfp4"))
}
# config.json keys that describe a Llama-like decoder's Linear layers
DIM_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "vocab_size",
    "tie_word_embeddings",
)


def read_dims(model_dir: str | Path) -> dict[str, Any]:
    """The :data:`DIM_KEYS` present in ``model_dir/config.json`` (``text_config`` of multimodal configs).

    Raises:
        FileNotFoundError: no config.json in ``model_dir``.
    """
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    cfg = {**cfg.get("text_config", {}), **{k: v for k, v in cfg.items() if k != "text_config"}}
    return {k: cfg[k] for k in DIM_KEYS if cfg.get(k) is not None}


def quantized_in_features(dims: dict[str, Any]) -> list[int]:
    """Distinct ``in_features`` of the Linear layers a scheme quantizes in a Llama-like decoder layer.

    ``q_proj``, ``k_proj``, ``v_proj``, ``gate_proj`` and ``up_proj`` read the hidden state
    (``hidden_size``); ``o_proj`` reads the concatenated heads (``num_attention_heads * head_dim``);
    ``down_proj`` reads the MLP activation (``intermediate_size``). ``lm_head`` and the embeddings
    stay 16-bit (``scheme.ignore``) and are not counted.

    Args:
        dims: config.json values; needs ``hidden_size``, ``intermediate_size``,
            ``num_attention_heads``; ``head_dim`` defaults to ``hidden_size // num_attention_heads``.

    Returns:
        Sorted distinct in_features, e.g. SmolLM2-135M: ``[576, 1536]``.

    Raises:
        ConfigError: a required key is missing.
    """
    missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads") if k not in dims]
    if missing:
        raise ConfigError(f"model config.json lacks {', '.join(missing)}; cannot derive scheme.group_size")
    hidden = int(dims["hidden_size"])
    head_dim = int(dims.get("head_dim") or hidden // int(dims["num_attention_heads"]))
    attn_out = int(dims["num_attention_heads"]) * head_dim
    return sorted({hidden, attn_out, int(dims["intermediate_size"])})


def derive_group_size(group_size: str, candidates: list[int], in_features: list[int]) -> int | None:
    """Resolve ``scheme.group_size`` against the model's quantized ``in_features``.

    Args:
        group_size: ``"auto"``, ``"channel"`` or a positive integer as a string.
        candidates: allowed group sizes for ``"auto"``, any order (``scheme.group_size_candidates``).
        in_features: in_features of every quantized Linear layer (:func:`quantized_in_features`).

    Returns:
        ``"auto"``: the largest candidate dividing every in_features (SmolLM2: 576 and 1536 with
        candidates 128/64/32 -> 64, because 576 % 128 = 64); ``"channel"``: ``None`` (one scale
        per output row); an integer string: that integer.

    Raises:
        ConfigError: no candidate divides every in_features, the integer does not divide one of
            them, or the value is none of the three forms. The message names ``scheme.group_size``,
            the value, the offending dimension and the allowed candidates.
    """
    allowed = sorted(set(candidates), reverse=True)
    if group_size in ("channel", "block"):  # block: the format's 2-D blocks (Format.block), no 1-D group
        return None
    if group_size == "auto":
        for g in allowed:
            if g > 0 and all(d % g == 0 for d in in_features):
                return g
        raise ConfigError(
            f"scheme.group_size='auto': none of the candidates {allowed} divides every quantized "
            f"in_features {sorted(in_features)}; set scheme.group_size=channel or an integer that divides them"
        )
    if not str(group_size).isdigit() or int(group_size) < 1:
        raise ConfigError(f"scheme.group_size={group_size!r} must be 'auto', 'channel' or a positive integer")
    g = int(group_size)
    for d in sorted(in_features):
        if d % g:
            fits = [c for c in allowed if all(x % c == 0 for x in in_features)]
            raise ConfigError(
                f"scheme.group_size={g} does not divide in_features {d} of a quantized layer "
                f"({d} % {g} = {d % g}); candidates: {allowed}, of which {fits or 'none'} divide every "
                f"in_features {sorted(in_features)}; or use 'auto' / 'channel'"
            )
    return g


def scheme_group_size(scheme: SchemeConfig, dims: dict[str, Any]) -> int | None:
    """``scheme.group_size`` resolved for a model: :func:`derive_group_size` over the model's quantized
    in_features (:func:`quantized_in_features`); None for per-channel. Raises ConfigError as they do."""
    return derive_group_size(str(scheme.group_size), list(scheme.group_size_candidates), quantized_in_features(dims))


def weight_layout(scheme: SchemeConfig, dims: dict[str, Any]) -> dict[str, Any]:
    """How the scheme stores its weights' scales for this model, for the memory formula
    (:func:`quantverdict.measure.memory.check_against_prediction`).

    Returns:
        ``{"group_size"``: weights per scale (a fixed group; a block's ``rows * columns``, FP8_BLOCK: 16,384;
        None: per-channel), ``"scale_bytes"``: bytes per scale where the format fixes them (NVFP4: 1), else
        None (the checkpoint's dtype), ``"global_scale_bytes"``: per-module bytes of per-tensor scales (NVFP4: 4)}.

    Raises:
        ConfigError: as :func:`scheme_group_size`.
    """
    fmt = FORMATS.get(scheme.label)
    per_scale = fmt.weights_per_scale if fmt else None
    return {
        "group_size": per_scale if per_scale is not None else scheme_group_size(scheme, dims),
        "scale_bytes": fmt.scale_bytes if fmt else None,
        "global_scale_bytes": fmt.global_scale_bytes if fmt else 0,
    }


def _fill_group_sizes(node: Any, resolved: int | None, check: list[int], allowed: list[int]) -> None:
    if isinstance(node, dict):
        if "group_size" in node:
            if node.get("strategy") == "channel":
                node["group_size"] = None
            elif node["group_size"] == "auto":
                if resolved is None:  # scheme.group_size=channel turns a group recipe per-channel
                    node["group_size"] = None
                    if node.get("strategy") == "group":
                        node["strategy"] = "channel"
                else:
                    node["group_size"] = resolved
            elif node["group_size"] is not None:  # an explicit integer in the recipe: check it too
                node["group_size"] = derive_group_size(str(node["group_size"]), allowed, check)
        for value in node.values():
            _fill_group_sizes(value, resolved, check, allowed)
    elif isinstance(node, list):
        for value in node:
            _fill_group_sizes(value, resolved, check, allowed)


def _weight_args(node: Any) -> list[dict[str, Any]]:
    """Every ``weights: {...}`` block of a recipe (config_groups of any modifier)."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "weights" and isinstance(value, dict):
                found.append(value)
            else:
                found.extend(_weight_args(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_weight_args(value))
    return found


@dataclass(frozen=True)
class Format:
    """What a scheme label fixes: bits, the weights' number type, symmetry and group sizes vLLM can serve.

    Attributes:
        weight_bits, activation_bits: bits per weight / activation element (16: not quantized).
        weight_type: compressed-tensors ``QuantizationType`` of the weights (``int``, ``float``); None for BF16.
        symmetric_only: vLLM takes only symmetric weights (no zero point) for this format.
        group_sizes: integer ``group_size`` values vLLM's kernels take; () means per-channel only.
        strategies: compressed-tensors weight ``strategy`` values vLLM selects a kernel for.
        presets: compressed-tensors preset scheme names (``scheme: W8A8`` in a recipe) of this format,
            each with the ``symmetric`` it sets.
        block: ``(rows, columns)`` of a 2-D weight block with one scale (``strategy: block``); None otherwise.
        scale_bytes: bytes of one weight scale where the format fixes them (NVFP4: 1, FP8 E4M3); None: the
            checkpoint's own dtype (bf16: 2).
        global_scale_bytes: bytes of per-tensor scales stored once per quantized module besides the group
            scales (NVFP4: a float32 ``weight_global_scale``, 4).
        fixed_group: the group size is the format's own (``group_sizes`` holds the one value); the model's
            in_features must be multiples of it, no other group size is served.
        save_format: the compressed-tensors format the checkpoint must be saved in where the one it infers is
            not the one vLLM loads (W4AFP8: ``pack-quantized``, eight int4 in an int32 ``weight_packed``, as
            vLLM's ``CompressedTensorsW4A8Fp8`` reads it; compressed-tensors 0.19's ``infer_module_format``
            picks ``int-quantized``, one int8 a weight, for any int weights with activations); None: inferred.
    """

    weight_bits: int
    activation_bits: int
    weight_type: str | None
    symmetric_only: bool
    group_sizes: tuple[int, ...]
    strategies: tuple[str, ...]
    presets: tuple[tuple[str, bool], ...]
    block: tuple[int, int] | None = None
    scale_bytes: int | None = None
    global_scale_bytes: int = 0
    fixed_group: bool = False
    save_format: str | None = None

    @property
    def weights_per_scale(self) -> int | None:
        """Weights sharing one scale when the format fixes it: a block's ``rows * columns`` or the fixed group."""
        if self.block:
            return self.block[0] * self.block[1]
        return self.group_sizes[0] if self.fixed_group else None


# Sources: vLLM 0.32.0 (the serve environment), model_executor/layers/quantization/compressed_tensors/
# compressed_tensors.py (scheme selection: _is_wNa16_group_channel takes channel or group weights without
# activations; _is_dynamic_token_w8a8 / _is_static_tensor_w8a8 take 8-bit tensor or channel weights,
# "Only symmetric weight quantization supported"; _is_fp8_w8a8 takes symmetric float tensor/channel/block
# weights), utils/marlin_utils.py (MARLIN_SUPPORTED_GROUP_SIZES = [-1, 32, 64, 128]; zero points with 4-bit
# weights), utils/machete_utils.py (zero points with uint4/uint8 on Hopper) and kernels/linear/mixed_precision/
# cpu.py (CPUWNA16: uint4 / uint4b8, even group sizes); the presets: compressed-tensors 0.19
# quantization/quant_scheme.py (PRESET_SCHEMES; W8A8 and its alias INT8 are symmetric per-channel int8,
# FP8_DYNAMIC symmetric per-channel float8) as llm-compressor 0.14 applies them.
# The formats after FP8_DYNAMIC, from the same presets: FP8_BLOCK: float8 weights, strategy block,
# block_structure [128, 128], dynamic float8 activations per 128-column group; W4AFP8: int4 weights, group 128,
# symmetric, dynamic per-token float8 activations (vLLM's CompressedTensorsW4A8Fp8 raises unless group_size
# == 128 and strategy group); NVFP4A16 / NVFP4: float4 (E2M1) weights, strategy tensor_group, group 16,
# scale_dtype float8_e4m3fn, plus a float32 global scale per tensor (NVFP4: activations the same, their global
# scale observed on calibration data, static_minmax).
FORMATS: dict[str, Format] = {
    "BF16": Format(16, 16, None, False, (), (), ()),
    "W4A16": Format(4, 16, "int", False, (32, 64, 128), ("group", "channel"), (("W4A16", True), ("W4A16_ASYM", False))),
    "W8A16": Format(8, 16, "int", False, (32, 64, 128), ("group", "channel"), (("W8A16", True),)),
    "W8A8": Format(8, 8, "int", True, (), ("channel", "tensor"), (("W8A8", True), ("INT8", True))),
    "FP8_DYNAMIC": Format(8, 8, "float", True, (), ("channel", "tensor"), (("FP8_DYNAMIC", True),)),
    "FP8_BLOCK": Format(8, 8, "float", True, (), ("block",), (("FP8_BLOCK", True),), block=(128, 128)),
    "W4AFP8": Format(
        4, 8, "int", True, (128,), ("group",), (("W4AFP8", True),), fixed_group=True, save_format="pack-quantized"
    ),
    "NVFP4A16": Format(
        4, 16, "float", True, (16,), ("tensor_group",), (("NVFP4A16", True),), None, 1, 4, fixed_group=True
    ),
    "NVFP4": Format(4, 4, "float", True, (16,), ("tensor_group",), (("NVFP4", True),), None, 1, 4, fixed_group=True),
}


def _layer_shapes(dims: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``{projection: (out_features, in_features)}`` of the Linear layers a scheme quantizes in a Llama-like
    decoder layer (see :func:`quantized_in_features`); k_proj/v_proj have ``num_key_value_heads * head_dim``
    outputs."""
    hidden, inter = int(dims["hidden_size"]), int(dims["intermediate_size"])
    heads = int(dims["num_attention_heads"])
    head_dim = int(dims.get("head_dim") or hidden // heads)
    kv = int(dims.get("num_key_value_heads") or heads) * head_dim
    q = heads * head_dim
    return {
        "q_proj": (q, hidden),
        "k_proj": (kv, hidden),
        "v_proj": (kv, hidden),
        "o_proj": (hidden, q),
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }


def shape_errors(scheme: SchemeConfig, dims: dict[str, Any]) -> list[str]:
    """Why the model's layer shapes cannot take the scheme's fixed group or block, one message per dimension.

    * A fixed group (W4AFP8: 128, NVFP4/NVFP4A16: 16) must divide every quantized ``in_features``:
      llm-compressor 0.14 refuses other layers before quantizing (``validate_group_size_divisibility``:
      "Group and tensor-group quantization require columns % group_size == 0"), and vLLM's W4A8 kernel takes
      group 128 only (``CompressedTensorsW4A8Fp8``: "W4A8 kernels require group quantization with group size
      128"), so a smaller group is another format, not this one.
    * A block (FP8_BLOCK: 128 x 128) must divide every quantized ``in_features`` and ``out_features``:
      llm-compressor stores ragged edge blocks, but compressed-tensors' forward (0.17 and 0.19) then fails
      (``unflatten: Provided sizes [5, 128] don't multiply up to the size of dim 2 (576)``), and vLLM's
      ``validate_fp8_block_shape`` refuses merged layers (q/k/v, gate/up) whose parts are not multiples of
      the block ("Weight output_partition_size = 576 is not divisible by weight quantization block_n = 128").

    Args:
        scheme: the composed scheme.
        dims: model config.json values (:func:`read_dims`).

    Returns:
        Messages naming the scheme, the size, the layers and the dimension with its remainder, and what would
        work; [] when the shapes fit (or the format fixes no group or block).
    """
    fmt = FORMATS.get(scheme.label)
    if fmt is None or fmt.weights_per_scale is None or "hidden_size" not in dims:
        return []
    shapes = _layer_shapes(dims)
    checks: list[tuple[str, int, int]] = []  # (axis, size, dimension)
    if fmt.block:
        rows, cols = fmt.block
        checks += [("in_features", cols, d) for d in sorted({s[1] for s in shapes.values()})]
        checks += [("out_features", rows, d) for d in sorted({s[0] for s in shapes.values()})]
        what = f"its {rows}x{cols} weight blocks"
    else:
        g = fmt.group_sizes[0]
        checks += [("in_features", g, d) for d in sorted({s[1] for s in shapes.values()})]
        what = f"its group_size {g} (the only one it has)"
    errors = []
    for axis, size, dim in checks:
        if dim % size:
            idx = 1 if axis == "in_features" else 0
            layers = [name for name, shape in shapes.items() if shape[idx] == dim]
            errors.append(
                f"scheme {scheme.name} ({scheme.label}) cannot quantize this model: {what} do not divide "
                f"{axis} {dim} of {', '.join(layers)} ({dim} % {size} = {dim % size}); {scheme.label} needs every "
                f"quantized layer's {axis} to be a multiple of {size} (e.g. hidden_size 4096, intermediate_size "
                "14336); for this model use a scheme whose group size fits (gptq/awq W4A16 and int8 take "
                "group_size auto, fp8 FP8_DYNAMIC is per-channel)"
            )
    return errors


def _activation_args(node: Any) -> list[dict[str, Any]]:
    """Every ``input_activations: {...}`` block of a recipe."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "input_activations" and isinstance(value, dict):
                found.append(value)
            else:
                found.extend(_activation_args(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_activation_args(value))
    return found


def _presets(node: Any) -> list[str]:
    """Every preset scheme name (``scheme: W8A8``) of a recipe's modifiers."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "scheme" and isinstance(value, str):
                found.append(value)
            else:
                found.extend(_presets(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_presets(value))
    return found


def recipe_errors(scheme: SchemeConfig) -> list[str]:
    """Where the recipe contradicts the scheme's fields (``weight_bits``, ``activation_bits``, ``symmetric``,
    ``label``), one message per contradiction, naming the recipe value and the scheme key.

    Both bits and symmetry are reported in records and used by the memory formula, so a recipe that says
    otherwise would mislabel the checkpoint. A preset (``scheme: W8A8``) must be one of the label's
    :attr:`Format.presets`, with the same symmetry.
    """
    errors = []
    recipe = _plain(scheme.recipe)
    fmt = FORMATS.get(scheme.label)
    for args in _weight_args(recipe):
        if "num_bits" in args and int(args["num_bits"]) != scheme.weight_bits:
            errors.append(f"recipe weights num_bits={args['num_bits']} but scheme.weight_bits={scheme.weight_bits}")
        if "symmetric" in args and bool(args["symmetric"]) != scheme.symmetric:
            errors.append(f"recipe weights symmetric={args['symmetric']} but scheme.symmetric={scheme.symmetric}")
        if fmt and fmt.weight_type and "type" in args and args["type"] != fmt.weight_type:
            errors.append(
                f"recipe weights type={args['type']!r} but scheme.label={scheme.label} has {fmt.weight_type} weights"
            )
        if fmt and fmt.strategies and "strategy" in args and args["strategy"] not in fmt.strategies:
            errors.append(
                f"recipe weights strategy={args['strategy']!r} is not one vLLM serves for {scheme.label}; allowed: "
                f"{', '.join(fmt.strategies)}{closest(str(args['strategy']), fmt.strategies)}"
            )
        gs = args.get("group_size")
        if fmt and isinstance(gs, int) and not isinstance(gs, bool) and gs not in fmt.group_sizes:
            errors.append(
                f"recipe weights group_size={gs} is not one vLLM serves for {scheme.label}; allowed: "
                f"{', '.join(map(str, fmt.group_sizes)) or 'none (per-channel only)'}"
            )
    acts = _activation_args(recipe)
    for args in acts:
        if "num_bits" in args and int(args["num_bits"]) != scheme.activation_bits:
            errors.append(
                f"recipe input_activations num_bits={args['num_bits']} but "
                f"scheme.activation_bits={scheme.activation_bits}"
            )
    if _weight_args(recipe) and not acts and scheme.activation_bits != 16:
        errors.append(
            f"recipe quantizes weights only (no input_activations) but scheme.activation_bits={scheme.activation_bits}"
        )
    if fmt:
        allowed = dict(fmt.presets)
        for preset in _presets(recipe):
            if preset not in allowed:
                names = list(allowed) or ["none (no quantization)"]
                errors.append(
                    f"recipe scheme={preset!r} is not a {scheme.label} preset; allowed: {', '.join(names)}"
                    f"{closest(preset, list(allowed))}"
                )
            elif allowed[preset] != scheme.symmetric:
                errors.append(
                    f"recipe scheme={preset!r} has symmetric={allowed[preset]} but scheme.symmetric={scheme.symmetric}"
                )
    return errors


def check_recipe(scheme: SchemeConfig) -> None:
    """The recipe agrees with the scheme's fields (:func:`recipe_errors`).

    Raises:
        ConfigError: naming the recipe value and the scheme key it contradicts.
    """
    errors = recipe_errors(scheme)
    if errors:
        raise ConfigError(f"scheme {scheme.name!r}: " + "; ".join(errors))


def scheme_errors(scheme: SchemeConfig) -> list[str]:
    """Fields that the scheme's format fixes, checked against what llm-compressor and vLLM accept.

    ``scheme.label`` (:data:`FORMATS`) fixes ``weight_bits`` and ``activation_bits``; ``method: none`` is
    the BF16 baseline and only it; W8A8 and FP8_DYNAMIC weights must be symmetric (vLLM selects no kernel
    for zero points there); an integer ``group_size`` (and every ``group_size_candidates`` entry) must be
    one vLLM's kernels take (32, 64, 128; W8A8 and FP8_DYNAMIC are per-channel only); the recipe must agree
    (:func:`recipe_errors`). Sources: see :data:`FORMATS`.

    Returns:
        One message per problem, naming the key, the allowed values and the closest match; [] when valid.
    """
    errors: list[str] = []
    labels = list(FORMATS)
    fmt = FORMATS.get(scheme.label)
    if fmt is None:
        return [
            f"scheme.label={scheme.label!r} is not allowed; allowed: {', '.join(labels)}{closest(scheme.label, labels)}"
        ]
    for key, want in (("weight_bits", fmt.weight_bits), ("activation_bits", fmt.activation_bits)):
        have = getattr(scheme, key)
        if have != want:
            errors.append(
                f"scheme.{key}={have} does not fit scheme.label={scheme.label}, which fixes it; allowed: {want}"
            )
    if (scheme.method == "none") != (scheme.label == "BF16"):
        errors.append(
            f"scheme.method={str(scheme.method)!r} with scheme.label={scheme.label}: method none is the unquantized "
            "BF16 baseline and only it; a quantized label needs rtn, rtn_calibrated, gptq, awq or smoothquant_gptq"
        )
    if scheme.method == "none" and scheme.recipe:
        errors.append("scheme.method=none quantizes nothing, but scheme.recipe is not empty; set scheme.recipe={}")
    if fmt.symmetric_only and not scheme.symmetric:
        errors.append(
            f"scheme.symmetric=false: vLLM serves {scheme.label} weights only symmetric (no zero point); allowed: true"
        )
    gs = str(scheme.group_size)
    if fmt.block and gs != "block":
        errors.append(
            f"scheme.group_size={gs!r}: {scheme.label} has {fmt.block[0]}x{fmt.block[1]} weight blocks; allowed: block"
        )
    elif fmt.fixed_group and gs != str(fmt.group_sizes[0]):
        errors.append(
            f"scheme.group_size={gs!r}: {scheme.label} has a fixed group size (compressed-tensors preset, the one vLLM "
            f"serves); allowed: {fmt.group_sizes[0]}"
        )
    elif scheme.label != "BF16" and not fmt.block:
        if gs == "block":
            errors.append(f"scheme.group_size='block': {scheme.label} has no weight blocks; allowed: auto, channel")
        elif not fmt.group_sizes and gs != "channel":
            errors.append(f"scheme.group_size={gs!r}: {scheme.label} has per-channel weight scales; allowed: channel")
        elif gs.isdigit() and int(gs) not in fmt.group_sizes:
            allowed = ", ".join(["auto", "channel", *map(str, fmt.group_sizes)])
            errors.append(
                f"scheme.group_size={gs}: vLLM's {scheme.label} kernels take group sizes {list(fmt.group_sizes)}; "
                f"allowed: {allowed}"
            )
        if gs == "auto":
            bad = [g for g in scheme.group_size_candidates if g not in fmt.group_sizes]
            if bad:
                errors.append(
                    f"scheme.group_size_candidates={list(scheme.group_size_candidates)}: {bad} not taken by vLLM's "
                    f"{scheme.label} kernels; allowed: {list(fmt.group_sizes)}"
                )
    return errors + recipe_errors(scheme)


# modifiers that only transform weights using calibration activations (no quantization of their own)
CALIBRATION_ONLY_MODIFIERS = ("AWQModifier", "SmoothQuantModifier")
# GPTQModifier arguments that only the Hessian-based algorithm uses
GPTQ_ONLY_ARGS = ("dampening_frac", "block_size", "offload_hessians", "actorder")


def _add_ignore(node: Any, extra: list[str]) -> None:
    if isinstance(node, dict):
        if isinstance(node.get("ignore"), list):
            node["ignore"] = node["ignore"] + [p for p in extra if p not in node["ignore"]]
        for value in node.values():
            _add_ignore(value, extra)
    elif isinstance(node, list):
        for value in node:
            _add_ignore(value, extra)


def _ignore_anywhere(node: Any) -> None:
    """Every ``ignore`` list's plain module names in their match-anywhere form (:func:`anywhere`), in place."""
    if isinstance(node, dict):
        if isinstance(node.get("ignore"), list):
            node["ignore"] = list(dict.fromkeys(anywhere(str(p)) for p in node["ignore"]))
        for value in node.values():
            _ignore_anywhere(value)
    elif isinstance(node, list):
        for value in node:
            _ignore_anywhere(value)


def data_free_equivalent(recipe: dict[str, Any]) -> dict[str, Any]:
    """The same checkpoint format by round-to-nearest: for models whose accuracy is not measured.

    Drops the calibration-only transforms (:data:`CALIBRATION_ONLY_MODIFIERS`: AWQ's and
    SmoothQuant's rescaling) and turns each ``GPTQModifier`` into a ``QuantizationModifier`` with the
    same targets, ignore list, scheme or config_groups, minus :data:`GPTQ_ONLY_ARGS` (``actorder``
    too, which needs the Hessian). The saved tensors have the same dtypes, shapes, group sizes and
    zero points, so vLLM selects the same kernels and the checkpoint the same bytes: memory and speed
    are those of the calibrated scheme. Used for ``model.source=synthetic`` (random weights).
    """

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in GPTQ_ONLY_ARGS}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    out: dict[str, Any] = {}
    for stage, groups in recipe.items():
        out[stage] = {}
        for group, modifiers in groups.items():
            new: dict[str, Any] = {}
            for name, args in modifiers.items():
                if name in CALIBRATION_ONLY_MODIFIERS:
                    continue
                if name == "GPTQModifier":
                    name, args = "QuantizationModifier", strip(args)
                new[name] = copy.deepcopy(args)
            out[stage][group] = new
    return out


def resolve_recipe(scheme: SchemeConfig, dims: dict[str, Any], extra_ignore: list[str] | None = None) -> dict[str, Any]:
    """A deep copy of ``scheme.recipe`` with every ``group_size: auto`` filled for this model.

    ``auto`` becomes :func:`derive_group_size` of ``scheme.group_size`` (which is itself
    ``auto``, ``channel`` or an integer). Where that is per-channel, the weight args get
    ``strategy: channel`` and ``group_size: None``; a ``strategy: channel`` block always gets
    ``group_size: None``. An explicit integer ``group_size`` in the recipe is checked the same way.

    Args:
        scheme: the composed scheme config (``scheme.recipe`` already has ``${scheme.ignore}`` resolved).
        dims: model config.json values (:func:`read_dims`).
        extra_ignore: the model's own 16-bit patterns (``model.quantize_ignore``), appended to every
            ``ignore`` list of the recipe. Then every plain module name of an ``ignore`` list becomes
            ``re:(?:.*\\.)?<name>$`` (:func:`quantverdict.measure.keep16.anywhere`): compressed-tensors
            matches a plain name only when it equals the module's full name, so ``lm_head`` alone would
            quantize a head that sits under a wrapper (``language_model.lm_head``).

    Returns:
        The recipe as plain dicts/lists, ready for ``llmcompressor.recipe.Recipe.from_dict``.
        ``{}`` for a scheme without a recipe (bf16).

    Raises:
        ConfigError: the group size does not fit the model (see :func:`derive_group_size`), the format's fixed
            group or block does not divide the model's layers (:func:`shape_errors`), or the recipe contradicts
            ``scheme.weight_bits`` / ``scheme.symmetric`` (:func:`check_recipe`).
    """
    check_recipe(scheme)
    recipe = copy.deepcopy(_plain(scheme.recipe))
    if not recipe:
        return {}
    bad_shapes = shape_errors(scheme, dims)
    if bad_shapes:
        raise ConfigError("; ".join(bad_shapes))
    resolved = scheme_group_size(scheme, dims)
    _fill_group_sizes(recipe, resolved, quantized_in_features(dims), list(scheme.group_size_candidates))
    if extra_ignore:
        _add_ignore(recipe, list(extra_ignore))
    _ignore_anywhere(recipe)
    return recipe


def _plain(node: Any) -> Any:
    """Plain dict/list copy of a (possibly OmegaConf) nested container."""
    if hasattr(node, "items"):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)) or (hasattr(node, "__iter__") and not isinstance(node, (str, bytes))):
        return [_plain(v) for v in node]
    return node


def checkpoint_key(
    model_key: str,
    scheme_name: str,
    recipe: dict[str, Any],
    calibration: dict[str, Any],
    versions: dict[str, str],
) -> str:
    """Content key of a quantized checkpoint: 16 hex chars of sha256 over canonical JSON.

    Canonical JSON: ``json.dumps({"model", "scheme", "recipe", "calibration", "versions"},
    sort_keys=True, separators=(",", ":"))``, so dict order and whitespace do not matter but any
    changed value (recipe argument, calibration sample count, library version) gives a new key.

    Args:
        model_key: identifies the materialized source model (e.g. its name plus content hash).
        scheme_name: ``scheme.name``.
        recipe: the resolved recipe (:func:`resolve_recipe`).
        calibration: calibration settings actually used (text file, num_samples, seq_len, seed).
        versions: quantize-environment versions (torch, transformers, llmcompressor, compressed-tensors).
    """
    payload = {
        "model": model_key,
        "scheme": scheme_name,
        "recipe": recipe,
        "calibration": calibration,
        "versions": versions,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# methods that make the checkpoint without data (the quantize stage feeds no calibration text to them)
DATA_FREE_METHODS = ("none", "rtn")


def calibrates(cfg: Config) -> bool:
    """Whether the job's quantize stage feeds calibration text to llm-compressor.

    True for calibrated K/V scales (``kv.calibrated``: llm-compressor's ``kv_cache_scheme`` observes K and V on
    the text) and for a method that calibrates (every method but ``none``/``rtn``). On random weights
    (``model.source=synthetic``) a weight-calibrating method is replaced by round-to-nearest in the same format
    unless ``model.synthetic.calibrate`` asks for it; ``rtn_calibrated`` is not: its format (NVFP4's static
    activation global scale) cannot be made without observed activations, so it calibrates on any weights.
    Read by the checks of the calibration counts and file, the hub-access check, the resume key and the job.
    """
    if cfg.kv.calibrated:
        return True
    method = str(cfg.scheme.method)
    if method in DATA_FREE_METHODS:
        return False
    if cfg.model.source == "synthetic" and method != "rtn_calibrated":
        return bool(cfg.model.synthetic and cfg.model.synthetic.calibrate)
    return True
