"""vLLM's batch defaults on a target GPU (``config.targets.vllm_batch_defaults``), read from vLLM's source."""

from __future__ import annotations

import pytest

from quantverdict.config.targets import vllm_batch_defaults
from quantverdict.serving.server import _hint


@pytest.mark.parametrize(
    ("gpu", "memory_gib", "want"),
    [
        # vLLM's EngineArgs.get_batch_defaults, OpenAI server: >= 160 GiB -> 1024 / 16,384; >= 70 GiB and not an
        # A100 -> 1024 / 8,192; anything else -> 256 / 2,048
        ("NVIDIA A10G", 22.48828125, (256, 2048)),
        ("NVIDIA L4", 22.494140625, (256, 2048)),
        ("NVIDIA A100-SXM4-80GB", 80.0, (256, 2048)),
        ("NVIDIA H100 80GB HBM3", 79.6474609375, (1024, 8192)),
        ("NVIDIA H200", 140.4013671875, (1024, 8192)),
        ("NVIDIA B200", 179.0, (1024, 16384)),
    ],
)
def test_vllm_batch_defaults(gpu: str, memory_gib: float, want: tuple[int, int]) -> None:
    assert vllm_batch_defaults(gpu, memory_gib) == want


def test_a_mamba_cache_start_up_failure_names_the_key_to_set() -> None:
    cause = (
        "ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (756). Each decode sequence requires "
        "one Mamba cache block, so CUDA graph capture cannot proceed."
    )
    assert "bench.server.max_num_seqs" in _hint(cause)
    assert _hint("ValueError: something else") == "" and _hint(None) == ""
