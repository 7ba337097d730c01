"""Hydra wiring: the schema registration, the ``qv_project_root`` resolver and a ``compose`` helper.

Importing this module registers ``base_config`` (the :class:`~quantverdict.config.schema.Config` schema)
so that every config group in ``conf/`` is checked against its dataclass when Hydra composes.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from pathlib import Path
from typing import Any, cast

from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from quantverdict.config import device_pick
from quantverdict.config.kv import kv_suffix
from quantverdict.config.schema import Config, ConfigError, ModelConfig, closest
from quantverdict.config.schemes import scheme_errors
from quantverdict.config.validate import choice_message, validate

PROJECT_ROOT = Path(__file__).resolve().parents[3]
CONF_DIR = PROJECT_ROOT / "conf"

if not OmegaConf.has_resolver("qv_project_root"):
    OmegaConf.register_new_resolver("qv_project_root", lambda: str(PROJECT_ROOT))
if not OmegaConf.has_resolver("qv_pid"):  # two grids started in the same second get distinct folders
    OmegaConf.register_new_resolver("qv_pid", lambda: str(os.getpid()), use_cache=True)
if not OmegaConf.has_resolver("qv_job_gpus"):  # a launcher's GPU request per job (conf/hydra/launcher/*.yaml)
    OmegaConf.register_new_resolver("qv_job_gpus", lambda device, tp: int(tp) if str(device) == "cuda" else 0)
if not OmegaConf.has_resolver("qv_hub_name"):  # conf/model/hub.yaml: a hub model named after its repo
    OmegaConf.register_new_resolver("qv_hub_name", lambda hf_id: str(hf_id).rsplit("/", 1)[-1] if hf_id else "hub")
if not OmegaConf.has_resolver("qv_kv_suffix"):  # a job folder names its kv choice unless auto: _bf16_kv-fp8
    OmegaConf.register_new_resolver("qv_kv_suffix", kv_suffix)
ConfigStore.instance().store(name="base_config", node=Config)

INVALID = "invalid configuration:\n  - "  # the head of a ConfigError listing problems, one per line
# OmegaConf's refusal of a value an Enum field does not name (omegaconf.nodes.EnumNode)
_ENUM_REFUSAL = re.compile(r"Invalid value '(?P<value>.*)', expected one of \[(?P<allowed>.*)\]")


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


def job_config(config: dict[str, Any]) -> Config:
    """A finished job's :class:`Config` from its record's config snapshot (``JobRecord.config``, the resolved config
    as written), the schema's defaults for keys it lacks (records written before a key existed)."""
    merged = OmegaConf.merge(OmegaConf.structured(Config), config)
    return cast(Config, OmegaConf.to_object(merged))


def _schema_keys(path: str) -> list[str]:
    """Field names of the schema dataclass at dotted ``path`` of :class:`Config` ('' = top level)."""
    tp: Any = Config
    for part in [p for p in path.split(".") if p]:
        hints = typing.get_type_hints(tp) if dataclasses.is_dataclass(tp) else {}
        tp = hints.get(part)
    return sorted(f.name for f in dataclasses.fields(tp)) if dataclasses.is_dataclass(tp) else []


def compose(overrides: list[str] | None = None) -> Config:
    """Compose ``conf/config.yaml`` with ``overrides`` outside a Hydra app (tests, tools); ``env=auto`` is resolved
    first (:func:`quantverdict.config.device_pick.expand`).

    Raises:
        ConfigError: every problem in one message: values outside an Enum field's choices (:func:`enum_refusal`)
            and what :func:`quantverdict.config.validate.validate` refuses in the rest.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    overrides = device_pick.expand(list(overrides or []), CONF_DIR)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = hydra_compose(config_name="config", overrides=overrides)
    except ConfigCompositionException as exc:
        refused = enum_refusal(exc, overrides)
        if refused is None:
            raise
        message, culprit = refused
        if culprit is not None:  # the other overrides' problems join the message, as validate() collects them
            try:
                compose([o for o in overrides if o != culprit])
            except ConfigError as more:
                raise ConfigError(INVALID + message + "\n  - " + str(more).removeprefix(INVALID)) from None
        raise ConfigError(INVALID + message) from None
    return to_config(cfg)


def override_for(key: str, overrides: list[str]) -> str | None:
    """The override (as typed) whose key is ``key`` (``+``/``~`` and ``@package`` ignored)."""
    for o in overrides:
        k = o.split("=", 1)[0].lstrip("+~").split("@", 1)[0]
        if k == key:
            return o
    return None


def enum_refusal(exc: BaseException, overrides: list[str]) -> tuple[str, str | None] | None:
    """A value that an Enum field of the schema refused while composing, in the project's form.

    Args:
        exc: what composing raised (Hydra's ``ConfigCompositionException`` with OmegaConf's ``ValidationError``
            as its cause, or that ``ValidationError`` itself).
        overrides: the overrides composed.

    Returns:
        ``(message, override)``: :func:`quantverdict.config.validate.choice_message` (key, value, allowed values,
        closest match) and the override that set the value (None when it came from a file); None when ``exc``
        is not such a refusal.
    """
    cause = exc if isinstance(exc, ValidationError) else exc.__cause__
    if not isinstance(cause, ValidationError):
        return None
    key = str(getattr(cause, "full_key", "") or "")
    m = _ENUM_REFUSAL.match(str(cause.msg or ""))
    if not key or m is None:
        return None
    allowed = [a.strip() for a in m["allowed"].split(",")]
    return choice_message(key, m["value"], allowed), override_for(key.split("[", 1)[0], overrides)


def as_dict(cfg: Any) -> dict[str, Any]:
    """A dataclass config (or DictConfig) as a plain, resolved dict; an Enum field as its string (every member's
    name is its value, see :mod:`quantverdict.config.schema`), so the record keeps the strings of the config."""
    return cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True))


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
