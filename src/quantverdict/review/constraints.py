"""The constraint set a review uses (``auto``: ``conf/review/cpu.yaml`` or ``gpu.yaml`` by where the records ran,
``review.KEY=VALUE`` overrides on top) and the label that names a review after it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from quantverdict.config.schema import ConfigError, ReviewConfig, TargetConfig, closest
from quantverdict.config.targets import load_target
from quantverdict.config.validate import review_errors
from quantverdict.results.record import JobRecord

AUTO = "auto"
# keys that do not change the verdict: left out of the label's hash
NOT_CONSTRAINTS = ("name", "log_to_mlflow")
# keys added after labels were first published, with their defaults: left out of the hash while at that default,
# so a review that does not set them keeps its label and folder
UNSET_KEEPS_HASH: dict[str, object] = {"gpu_price_per_hour": {}, "slo_attainment_pct": 99.0} | dict.fromkeys(
    ("max_mean_kld", "min_top1_agreement_pct", "e2e_ms", "target", "target_memory_fraction", "energy_usd_per_kwh")
)


def _conf_dir() -> Path:
    # config.compose registers the Hydra config store when imported: only when a set file is read
    from quantverdict.config.compose import CONF_DIR

    return Path(CONF_DIR) / "review"


def device_class(records: list[JobRecord]) -> str | None:
    """The device class most records ran on (``gpu`` when ``environment.gpu`` lists one, else ``config.env.device``
    with ``cuda`` as ``gpu``; a tie goes to ``gpu``), None when no record says."""
    devices = ["gpu" if r.environment.gpu else str(r.cfg.env.device).replace("cuda", "gpu") for r in records]
    seen = Counter(d for d in devices if d in ("cpu", "gpu"))
    return max(("cpu", "gpu"), key=lambda d: (seen[d], d == "gpu")) if seen else None


def load_set(name: str) -> ReviewConfig:
    """``conf/review/<name>.yaml`` merged onto the :class:`ReviewConfig` schema. Raises ConfigError: no such file."""
    if not (path := _conf_dir() / f"{name}.yaml").is_file():
        have = sorted(p.stem for p in _conf_dir().glob("*.yaml"))
        msg = f"review.name={name!r}: no constraint set {name!r} in {_conf_dir()}; sets: {', '.join(have)}"
        raise ConfigError(msg + closest(name, have))
    return _merged(OmegaConf.structured(ReviewConfig), OmegaConf.load(path))


def _merged(*parts: Any) -> ReviewConfig:
    rc = OmegaConf.to_object(OmegaConf.merge(*parts))
    assert isinstance(rc, ReviewConfig)
    return rc


def review_overrides(overrides: list[str]) -> list[str]:
    """The ``review.KEY=VALUE`` overrides of a command line, as ``KEY=VALUE``."""
    return [o.lstrip("+")[7:] for o in overrides if o.lstrip("+").startswith("review.") and "=" in o]


def _user_set(rc: ReviewConfig) -> list[str]:
    """``KEY=VALUE`` for every field that differs from the ``auto`` file: the user's overrides."""
    auto = load_set("default")
    return [
        f"{f.name}={json.dumps(getattr(rc, f.name))}"
        for f in dataclasses.fields(ReviewConfig)
        if f.name != "name" and getattr(rc, f.name) != getattr(auto, f.name)
    ]


def resolve(rc: ReviewConfig, records: list[JobRecord], overrides: list[str] | None) -> tuple[ReviewConfig, str]:
    """``(config, how)``: the constraint set to review ``records`` under and how it was picked. ``auto``:
    ``conf/review/<device class>.yaml`` with the ``review.KEY=VALUE`` items of ``overrides`` and every field where
    ``rc`` differs from the ``auto`` file on top. Raises ConfigError: an override that makes the set invalid."""
    given = review_overrides(overrides or [])
    named = [u.split("=", 1)[1] for u in given if u.startswith("name=")]
    if rc.name != AUTO and not named:  # review=NAME: that file's values and the overrides, already composed
        load_set(rc.name)  # an unknown set is refused with the sets there are
        return _target_budget(rc, given, f"constraint set {rc.name} (named)" + _with(given))
    # review.name=NAME picks that set's values, not only its name
    picked = named[-1] if named and named[-1] != AUTO else None
    device = None if picked else device_class(records)
    name = picked or device or "gpu"
    base = load_set(name)
    user = [u for u in given if not u.startswith("name=")]
    keys = {u.split("=", 1)[0] for u in user}
    user += [u for u in _user_set(rc) if u.split("=", 1)[0] not in keys]
    out = _merged(OmegaConf.structured(base), OmegaConf.from_dotlist(user))
    if errors := review_errors(out):
        raise ConfigError("invalid review configuration:\n  - " + "\n  - ".join(errors))
    where = f"the records ran on a {name.upper()}" if device else "no record names its device"
    how = f"picked: {where}; review={'gpu' if name == 'cpu' else 'cpu'} for the other"
    return _target_budget(out, user, f"constraint set {name} ({'named' if picked else how})" + _with(user))


def _with(user: list[str]) -> str:
    return f", with {', '.join('review.' + u for u in user)}" if user else ""


def target_budget_gib(rc: ReviewConfig) -> float | None:
    """The target's memory budget (GiB: memory x vLLM's memory fraction, to 4 places), None without a loadable
    ``review.target``."""
    try:
        return None if rc.target is None else _budget_of(load_target(rc.target, rc.target_memory_fraction))
    except ConfigError:
        return None


def _budget_of(t: TargetConfig) -> float:
    return round(t.memory_gib * t.memory_fraction, 4)


def _target_budget(rc: ReviewConfig, user: list[str], how: str) -> tuple[ReviewConfig, str]:
    """With ``review.target`` and no ``review.memory_budget_gib`` given, the memory check uses the target's budget."""
    if rc.target is None or any(u.split("=", 1)[0] == "memory_budget_gib" for u in user):
        return rc, how
    t = load_target(rc.target, rc.target_memory_fraction)
    budget = _budget_of(t)
    how += f"; memory budget {budget:g} GiB = the target's {t.memory_gib:g} GiB x {t.memory_fraction:g} ({t.gpu})"
    return dataclasses.replace(rc, memory_budget_gib=budget), how


def constraints_hash(rc: ReviewConfig) -> str:
    """8 hex digits of the SHA-256 of the constraint values as sorted JSON (:data:`NOT_CONSTRAINTS` and
    :data:`UNSET_KEEPS_HASH` keys at their default left out)."""
    skip = {k for k, default in UNSET_KEEPS_HASH.items() if getattr(rc, k) == default} | set(NOT_CONSTRAINTS)
    values = {k: v for k, v in dataclasses.asdict(rc).items() if k not in skip}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:8]


def label(rc: ReviewConfig) -> str:
    """``<set name>-<constraints hash>``, e.g. ``cpu-3f9a01bc``: names a review's folder and MLflow run."""
    return f"{rc.name}-{constraints_hash(rc)}"
