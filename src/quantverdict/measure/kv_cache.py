"""KV-cache and hybrid-model paging arithmetic: bytes per token and per sequence from a model's dimensions.

Pure (standard library only): the review's memory check (:mod:`quantverdict.review.memory`) calls it with
``model.dims`` of a record. Formulas and their sources are in each function's docstring.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from quantverdict.measure.points import ModelDims

Dims = ModelDims | Mapping[str, Any]  # a model's dimensions, typed or as config.json / ``model.dims`` holds them


def kv_bytes_per_token(dims: Dims, dtype_bytes: float) -> float | None:
    """KV-cache bytes per token: ``2 (K and V) × kv_layers × kv_heads × head_dim × dtype_bytes``.

    vLLM allocates exactly this per token and layer (``AttentionSpec.page_size_bytes``: ``2 × block_size ×
    num_kv_heads × head_size × dtype size``, vLLM v1 ``kv_cache_interface``); ``dtype_bytes`` is 1 for an FP8
    cache (:func:`kv_element_bytes`), whose scales are per layer, not per token (:func:`kv_scale_bytes`).
    Llama-3.1-8B (32 layers, 8 KV heads, head_dim 128): bf16 2 × 32 × 8 × 128 × 2 = 131,072 B; fp8 65,536 B.

    ``kv_layers`` is ``num_kv_layers`` (the layers that hold a KV cache: hybrid models such as
    Qwen3.5 keep a fixed-size recurrent state, not per-token K/V, in their linear-attention layers),
    else ``num_hidden_layers``. ``head_dim`` defaults to ``hidden_size / num_attention_heads``,
    ``num_key_value_heads`` to ``num_attention_heads`` (multi-head attention). None when a
    dimension is missing.
    """
    d = ModelDims.of(dims)
    layers, heads = d.num_kv_layers or d.num_hidden_layers, d.num_attention_heads
    kv_heads = d.num_key_value_heads or heads
    head_dim = d.head_dim or (d.hidden_size / heads if d.hidden_size and heads else None)
    if not layers or not kv_heads or not head_dim:
        return None
    return 2.0 * layers * kv_heads * head_dim * dtype_bytes


# bytes per element of vLLM's --kv-cache-dtype (vllm.utils.torch_utils STR_DTYPE_TO_TORCH_DTYPE): the FP8 formats
# are one byte; "auto" is the model's (served) dtype, looked up by its name
KV_ELEMENT_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bfloat16": 2, "float16": 2, "half": 2, "float32": 4}


def kv_element_bytes(kv_cache_dtype: str, model_dtype: str = "bfloat16") -> float:
    """Bytes of one K or V element in vLLM's KV cache: 1 for ``fp8`` (E4M3, also ``fp8_e4m3``/``fp8_e5m2``), else
    the served dtype's (``auto``: ``model_dtype``; bf16 2, float32 4). Unknown names count 2 bytes."""
    name = model_dtype if kv_cache_dtype in ("auto", "", None) else kv_cache_dtype
    return float(KV_ELEMENT_BYTES.get(str(name), 2))


def kv_scale_bytes(dims: Dims, kv_cache_dtype: str) -> int:
    """Bytes vLLM keeps for the scales of a quantized KV cache, per model (not per token).

    An FP8 cache has one K and one V scale per attention layer (``Attention._k_scale``, ``_v_scale``: float32
    scalars, 1.0 uncalibrated, else the checkpoint's ``k_scale``/``v_scale``), outside the cache's blocks:
    ``2 × 4 × kv_layers`` bytes (Llama-3.1-8B: 256 B). A token costs no scale bytes: bytes per token stay
    :func:`kv_bytes_per_token` at one byte an element. 0 for a 16-bit cache.
    """
    if kv_element_bytes(kv_cache_dtype) != 1:
        return 0
    d = ModelDims.of(dims)
    return 8 * int(d.num_kv_layers or d.num_hidden_layers or 0)


def kv_capacity(
    dims: Dims, kv_cache_dtype: str, model_dtype: str, kv_cache_bytes: float, request_tokens: int
) -> dict[str, float] | None:
    """KV tokens and maximum concurrency of a KV cache of ``kv_cache_bytes`` in ``kv_cache_dtype``.

    ``tokens = floor((kv_cache_bytes - scale bytes) / bytes per token)``, bytes per token
    ``= 2 × kv_layers × kv_heads × head_dim × bytes per element`` (:func:`kv_bytes_per_token`,
    :func:`kv_element_bytes`, :func:`kv_scale_bytes`); ``max_concurrency = tokens / request_tokens``, as vLLM's
    "Maximum concurrency for N tokens per request" line computes it (dense models; a hybrid's paging is
    :func:`hybrid_paging`). Llama-3.1-8B (32 layers, 8 KV heads, head_dim 128) in 100 GiB: bf16 131,072 B a
    token, 819,200 tokens, 25.0 requests of 32,768 tokens; fp8 65,536 B, 1,638,399 tokens (the 256 B of scales
    take the last one), 49.99997 requests.

    Returns:
        ``{"bytes_per_token", "element_bytes", "scale_bytes", "tokens", "max_concurrency"}``; None when a
        dimension is missing.
    """
    element = kv_element_bytes(kv_cache_dtype, model_dtype)
    bpt = kv_bytes_per_token(dims, element)
    if not bpt:
        return None
    scales = kv_scale_bytes(dims, kv_cache_dtype)
    tokens = max(0, int((kv_cache_bytes - scales) // bpt))
    return {
        "bytes_per_token": bpt,
        "element_bytes": element,
        "scale_bytes": float(scales),
        "tokens": float(tokens),
        "max_concurrency": tokens / request_tokens if request_tokens else 0.0,
    }


def state_bytes_per_sequence(dims: Dims, dtype_bytes: float) -> float:
    """Fixed-size recurrent state a hybrid model keeps per sequence in its linear-attention layers (bytes).

    Gated DeltaNet, as vLLM allocates it (``MambaStateShapeCalculator.gated_delta_net_state_shape``,
    vLLM 0.26), per layer without a KV cache: a conv state of ``(conv_kernel - 1) × (2 × k_heads ×
    k_head_dim + v_heads × v_head_dim)`` and a temporal state of ``v_heads × v_head_dim × k_head_dim``,
    both in the model dtype by default. Qwen3.5-9B (16 k / 32 v heads of 128, kernel 4) in bf16:
    (3 × 8,192 + 524,288) × 2 = 1,097,728 B a layer, × 24 layers = 26,345,472 B (25.1 MiB) a sequence.
    0 for models without linear-attention layers.
    """
    d = ModelDims.of(dims)
    layers = (d.num_hidden_layers or 0) - (d.num_kv_layers or d.num_hidden_layers or 0)
    nk, nv = d.linear_num_key_heads, d.linear_num_value_heads
    dk, dv = d.linear_key_head_dim, d.linear_value_head_dim
    if layers <= 0 or not nk or not nv or not dk or not dv:
        return 0.0
    conv = ((d.linear_conv_kernel_dim or 4) - 1) * (2 * nk * dk + nv * dv)
    return float(layers * (conv + nv * dv * dk) * dtype_bytes)


def hybrid_paging(dims: Dims, kv_dtype_bytes: float, state_dtype_bytes: float) -> dict[str, float] | None:
    """How vLLM pages a hybrid model's memory: one page size shared by attention blocks and recurrent states.

    vLLM 0.26 (``HybridAttentionMambaModelConfig``, which logs "Setting attention block size to N tokens
    to ensure that attention page size is >= mamba page size" and "Padding mamba page size by X%") picks
    the attention block size as the smallest multiple of 16 tokens whose per-layer page
    (``block × 2 × kv_heads × head_dim × kv_dtype_bytes``) holds one layer's recurrent state, and pads the
    state to that page. A sequence of L tokens then takes ``ceil(L / block)`` pages in each KV layer and
    one page in each linear-attention layer. Qwen3.5-9B in bf16: state 1,097,728 B a layer ->
    ceil(1,097,728 / (16 × 4,096)) × 16 = 272 tokens a block, page 272 × 4,096 = 1,114,112 B (+1.49%).

    Returns ``{"block_tokens", "page_bytes", "kv_layers", "state_layers"}``, or None for a model without
    linear-attention layers or with a dimension missing.
    """
    state = state_bytes_per_sequence(dims, state_dtype_bytes)
    bpt = kv_bytes_per_token(dims, kv_dtype_bytes)
    d = ModelDims.of(dims)
    kv_layers = d.num_kv_layers or 0
    state_layers = (d.num_hidden_layers or 0) - kv_layers
    if not state or not bpt or kv_layers <= 0 or state_layers <= 0:
        return None
    per_layer_token = bpt / kv_layers  # 2 × kv_heads × head_dim × kv_dtype_bytes
    block = 16 * math.ceil(state / state_layers / (16 * per_layer_token))
    return {
        "block_tokens": block,
        "page_bytes": block * per_layer_token,
        "kv_layers": kv_layers,
        "state_layers": state_layers,
    }


def paged_bytes_per_sequence(paging: dict[str, float], tokens: int) -> float:
    """Bytes vLLM reserves for one sequence of ``tokens`` tokens of a hybrid model (:func:`hybrid_paging`):
    ``(ceil(tokens / block) × kv_layers + state_layers) × page_bytes``. Qwen3.5-9B, 4,096 tokens:
    (16 × 8 + 24) × 1,114,112 = 169,345,024 B."""
    blocks = math.ceil(tokens / paging["block_tokens"])
    return (blocks * paging["kv_layers"] + paging["state_layers"]) * paging["page_bytes"]
