"""Hydra wiring: the schema registration, the ``qv_project_root`` resolver and a ``compose`` helper.

Importing this module registers ``base_config`` (the :class:`~quantverdict.config.schema.Config` schema)
so that every config group in ``conf/`` is checked against its dataclass when Hydra composes.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any, cast

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError

from quantverdict.config.schema import Config, ConfigError, ModelConfig, closest
from quantverdict.config.schemes import scheme_errors
from quantverdict.config.validate import validate

PROJECT_ROOT = Path(__file__).resolve().parents[3]
CONF_DIR = PROJECT_ROOT / "conf"

if not OmegaConf.has_resolver("qv_project_root"):
    OmegaConf.register_new_resolver("qv_project_root", lambda: str(PROJECT_ROOT))
if not OmegaConf.has_resolver("qv_pid"):  # two grids started in the same second get distinct folders
    OmegaConf.register_new_resolver("qv_pid", lambda: str(os.getpid()), use_cache=True)
ConfigStore.instance().store(name="base_config", node=Config)


def to_config(cfg: DictConfig) -> Config:
    """Resolve a composed DictConfig into a validated :class:`Config` (raises ConfigError)."""
    try:
        # keys appended with `+key=value` bypass the schema during composition: check them again
        OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.to_container(cfg, resolve=False))
    except ConfigKeyError as exc:
        key = exc.full_key or str(exc.key)
        parent, _, leaf = key.rpartition(".")
        allowed = _schema_keys(parent)
        raise ConfigError(
            f"unknown config key {key!r}; allowed under {parent or 'the top level'!r}: "
            f"{', '.join(allowed)}{closest(leaf, allowed)}"
        ) from None
    obj = cast(Config, OmegaConf.to_object(cfg))
    validate(obj, scheme_errors(obj.scheme))
    return obj


def _schema_keys(path: str) -> list[str]:
    """Field names of the schema dataclass at dotted ``path`` of :class:`Config` ('' = top level)."""
    tp: Any = Config
    for part in [p for p in path.split(".") if p]:
        hints = typing.get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}
        tp = hints.get(part)
    return sorted(f.name for f in dataclasses.fields(tp)) if dataclasses.is_dataclass(tp) else []


def compose(overrides: list[str] | None = None) -> Config:
    """Compose ``conf/config.yaml`` with ``overrides`` outside a Hydra app (tests, tools)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = hydra_compose(config_name="config", overrides=overrides or [])
    return to_config(cfg)


def as_dict(cfg: Any) -> dict[str, Any]:
    """A dataclass config (or DictConfig) as a plain, resolved dict."""
    return cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True))


def model_config(root: Path, name: str) -> ModelConfig:
    """``<root>/conf/model/<name>.yaml`` as a :class:`ModelConfig` (e.g. the model a synthetic one borrows its
    tokenizer from).

    Raises:
        ConfigError: there is no such file; the message names the allowed names and the closest one.
    """
    path = root / "conf" / "model" / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in (root / "conf" / "model").glob("*.yaml"))
        raise ConfigError(
            f"model.synthetic.tokenizer_from={name!r} is not a model config; allowed: {', '.join(names)}"
            f"{closest(name, names)}"
        )
    # omegaconf's stub types to_object as dict | list | str | None; a structured config returns its dataclass
    return cast(
        ModelConfig, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(path)))
    )
