"""Deployment targets: the GPU a review's verdict is for (``conf/target/<name>.yaml``, ``review.target=<name>``).

A target is data: GPU name, memory (GiB as nvidia-smi reports it), vLLM's memory fraction
(``--gpu-memory-utilization``) and an optional price per GPU-hour. The review checks each candidate's memory at
the target's budget even when the jobs ran on another device (:mod:`quantverdict.review.crossmodel`).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from quantverdict.config.schema import ConfigError, ReviewConfig, TargetConfig, closest

# conf/ beside src/ (the same folder config.compose.CONF_DIR names; not imported: compose imports validate,
# which imports this module)
TARGET_DIR = Path(__file__).resolve().parents[3] / "conf" / "target"


def target_names() -> list[str]:
    """The shipped targets, by file name (``a10g``, ``h200``, ...), sorted."""
    return sorted(p.stem for p in TARGET_DIR.glob("*.yaml"))


def load_target(name: str, memory_fraction: float | None = None) -> TargetConfig:
    """``conf/target/<name>.yaml`` merged onto :class:`TargetConfig`; ``memory_fraction`` replaces the file's.

    Raises:
        ConfigError: no such target (names the shipped ones and the closest), or a file that does not match
            the schema.
    """
    path = TARGET_DIR / f"{name}.yaml"
    if not path.is_file():
        have = target_names()
        raise ConfigError(
            f"review.target={name!r}: no target {name!r} in {TARGET_DIR}; targets: {', '.join(have)}"
            f"{closest(name, have)}"
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TargetConfig), OmegaConf.load(path))
        target = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: not a target ({exc})") from None
    assert isinstance(target, TargetConfig)
    if memory_fraction is not None:
        target.memory_fraction = memory_fraction
    return target


def target_errors(rc: ReviewConfig) -> list[str]:
    """Problems of ``review.target`` / ``review.target_memory_fraction``, one message per bad key."""
    errors: list[str] = []
    f = rc.target_memory_fraction
    if f is not None and not 0 < f <= 1:
        errors.append(f"review.target_memory_fraction={f} must be in (0, 1], e.g. 0.9 (vLLM's default)")
    if rc.target is None:
        return errors
    try:
        t = load_target(rc.target, f)
    except ConfigError as exc:
        return errors + [str(exc)]
    if t.memory_gib <= 0 or (f is None and not 0 < t.memory_fraction <= 1):
        errors.append(f"target {t.name}: memory_gib must be > 0 and memory_fraction in (0, 1]")
    return errors


def vllm_batch_defaults(gpu: str, memory_gib: float) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` that ``vllm serve`` picks on a GPU when neither is set.

    Source: vLLM's ``EngineArgs.get_batch_defaults`` (vllm/engine/arg_utils.py, read in vLLM 0.26 and 0.32), for
    the OpenAI API server: GPUs of >= 160 GiB: 1024 sequences, 16,384 tokens; >= 70 GiB and not an A100 (H100,
    H200): 1024, 8,192; any other GPU (A10G, L4, A100): 256, 2,048. A job that emulates a small card on a big one
    with the memory fraction alone inherits the big card's batch limits (and, for a hybrid model, needs one
    recurrent-state block per sequence: 1024 of them do not fit an A10G-sized budget), so the review compares them
    with the target's.

    Args:
        gpu: the GPU's name as nvidia-smi reports it (e.g. ``NVIDIA A100-SXM4-80GB``); only "a100" matters.
        memory_gib: its total memory, GiB (nvidia-smi memory.total / 1024).
    """
    if memory_gib >= 160:
        return 1024, 16384
    if memory_gib >= 70 and "a100" not in gpu.lower():
        return 1024, 8192
    return 256, 2048
