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
