"""A composed config, once per set of overrides, for tests that read a valid config and do not test composition
itself (a compose takes about half a second: Hydra's defaults tree and OmegaConf's merges).

Keyed on the overrides and QV_DATA_ROOT (the one environment variable the configs here read that a test changes);
each call gets its own deep copy, so a test may change what it gets. A compose that fails is not kept: it raises
every time. Warnings logged while composing are logged by the first call only: a test of a warning composes itself.
"""

from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

from omegaconf import OmegaConf

from quantverdict.config.compose import compose
from quantverdict.config.schema import Config, SchemeConfig

SCHEMES = Path(__file__).resolve().parents[1] / "conf" / "scheme"


@functools.cache
def _composed(overrides: tuple[str, ...], data_root: str | None) -> Config:
    return compose(list(overrides))


def composed(*overrides: str) -> Config:
    """``compose(list(overrides))``, composed once per overrides (and QV_DATA_ROOT) and copied for each caller."""
    return copy.deepcopy(_composed(overrides, os.environ.get("QV_DATA_ROOT")))


def load_scheme(name: str) -> SchemeConfig:
    """conf/scheme/<name>.yaml against the SchemeConfig schema alone (no compose), ``${scheme.ignore}`` resolved."""
    node = OmegaConf.merge(OmegaConf.structured(SchemeConfig), OmegaConf.load(SCHEMES / f"{name}.yaml"))
    scheme = OmegaConf.to_object(OmegaConf.create({"scheme": node}).scheme)
    assert isinstance(scheme, SchemeConfig)
    return scheme
