"""Tensor-parallel memory arithmetic: what one GPU of a server sharded over ``tp`` GPUs holds.

Pure (standard library only): the GPU fit check (:mod:`quantverdict.orchestrate.hardware`) and the review's
GPU count (:mod:`quantverdict.review.gpus`) both use it.

vLLM's tensor parallelism (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053) splits every Linear layer
by columns or rows and the embedding and ``lm_head`` by vocabulary, so each GPU holds ``1/tp`` of the
weights (norms are replicated: a rounding error). The KV cache splits by KV head: with fewer KV heads than
GPUs, heads are replicated so that each GPU keeps one (vLLM ``QKVParallelLinear``: ``num_kv_head_replicas =
tp_size / total_num_kv_heads`` when ``tp_size >= total_num_kv_heads``, ``model_executor/layers/linear.py``).
"""

from __future__ import annotations

# the tensor-parallel sizes tried when counting GPUs: vLLM needs tp to divide the attention heads, which
# in the shipped models (and most) are powers of two
TP_SIZES = (1, 2, 4, 8)


def kv_heads_per_gpu(num_key_value_heads: int, tp: int) -> int:
    """KV heads one GPU holds: ``max(1, kv_heads // tp)``. Llama-3.1-70B (8 KV heads): 4 at tp=2, 1 at tp=8."""
    return max(1, int(num_key_value_heads) // max(1, int(tp)))


def kv_share_per_gpu(num_key_value_heads: int, tp: int) -> float:
    """The fraction of the whole model's KV cache one GPU holds: ``kv_heads_per_gpu / kv_heads``
    (``1/tp`` while the heads divide; 1/kv_heads once every GPU holds a single, replicated head)."""
    heads = max(1, int(num_key_value_heads))
    return kv_heads_per_gpu(heads, tp) / heads


def per_gpu_gib(
    weights_gib: float, kv_gib: float, num_key_value_heads: int, tp: int, reserved_gib: float = 0.0
) -> float:
    """GiB one GPU holds: ``weights / tp + kv x kv_share_per_gpu + reserved`` (``reserved``: per GPU, e.g.
    activations and CUDA graphs). Llama-3.1-70B bf16 (131.4 GiB of weights) with 10 GiB of KV cache at
    tp=2: 65.7 + 5.0 = 70.7 GiB."""
    return weights_gib / max(1, int(tp)) + kv_gib * kv_share_per_gpu(num_key_value_heads, tp) + reserved_gib


def gpus_needed(
    weights_gib: float,
    kv_gib: float,
    num_key_value_heads: int,
    budget_gib_per_gpu: float,
    reserved_gib: float = 0.0,
    sizes: tuple[int, ...] = TP_SIZES,
) -> int | None:
    """The fewest GPUs (from ``sizes``) whose per-GPU need (:func:`per_gpu_gib`) fits ``budget_gib_per_gpu``;
    None when even the largest does not."""
    for tp in sizes:
        if per_gpu_gib(weights_gib, kv_gib, num_key_value_heads, tp, reserved_gib) <= budget_gib_per_gpu:
            return tp
    return None
