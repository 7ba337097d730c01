"""Command-line overrides checked before Hydra runs anything, with errors in the project's form.

Hydra composes the config before the entry point's body runs, and its errors neither suggest the
closest name (``scheme=awk`` -> "Could not find 'scheme/awk'") nor say what a value should look like
(``eval.limit=abc`` -> "could not be converted to Integer"); for an unknown key it even advises
``+eval.limt=5``, which the schema then refuses. :func:`check_command_line` composes the config once
per distinct override value (every value of a ``-m`` sweep) with Hydra's compose API and turns each
failure into one line that names the key, the allowed values or form, and the closest match
(:func:`explain`); all of them are collected into one :class:`~quantverdict.config.schema.ConfigError`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from quantverdict.config.compose import CONF_DIR, enum_refusal, override_for
from quantverdict.config.schema import Config, ConfigError, closest

# hydra's own settings (hydra.run.dir=..., hydra/launcher=...) are Hydra's to check
_HYDRA_KEYS = ("hydra.", "hydra/", "+hydra", "~hydra")
_MAX_ROUNDS = 20


def _schema_type(path: str) -> Any:
    """The annotated type at dotted ``path`` (``eval.limit``, ``bench.rates[0]``) of :class:`Config`.

    None if unknown.
    """
    tp: Any = Config
    for part in [p for p in path.split(".") if p]:
        name, _, index = part.partition("[")
        tp = _strip_optional(tp)[0]
        if not dataclasses.is_dataclass(tp):
            return None
        tp = typing.get_type_hints(tp).get(name)
        while index and typing.get_origin(_strip_optional(tp)[0]) is list:  # one element type per [i]
            tp = typing.get_args(_strip_optional(tp)[0])[0]
            index = index.partition("[")[2]
    return tp


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else tp), True
    return tp, False


def value_form(tp: Any) -> str:
    """What a value of type ``tp`` looks like on the command line, e.g. ``Optional[int]`` -> 'an integer or null'."""
    inner, optional = _strip_optional(tp)
    forms = {int: "an integer", float: "a number (e.g. 0.5, inf)", bool: "true or false", str: "a string"}
    if inner in forms:
        form = forms[inner]
    elif typing.get_origin(inner) is list:
        elem = _strip_optional(typing.get_args(inner)[0])[0]
        each = {int: "integers", float: "numbers", str: "strings", bool: "true/false values"}.get(elem, "values")
        form = f"a list of {each}, e.g. [{'1,4' if elem in (int, float) else 'a,b'}]"
    elif typing.get_origin(inner) is dict:
        form = "a mapping, e.g. {key: value}"
    elif dataclasses.is_dataclass(inner):
        form = f"a mapping of {', '.join(f.name for f in dataclasses.fields(inner))}"
    else:
        form = "a value of another type"
    return f"{form} or null" if optional else form


def _schema_keys(parent: str) -> list[str]:
    tp = _strip_optional(_schema_type(parent))[0] if parent else Config
    return sorted(f.name for f in dataclasses.fields(tp)) if dataclasses.is_dataclass(tp) else []


def explain(exc: BaseException, overrides: list[str]) -> tuple[str, str | None] | None:
    """A Hydra/OmegaConf composition error in the project's form.

    Handles ``MissingConfigException`` (no such file in a config group), ``ConfigCompositionException``
    caused by an unknown key (``ConfigAttributeError``/``ConfigKeyError``), a value outside an Enum field's
    choices (:func:`quantverdict.config.compose.enum_refusal`) or a value of the wrong type (OmegaConf
    ``ValidationError``), and ``OverrideParseException`` (not an override at all).

    Args:
        exc: what ``hydra.compose`` raised.
        overrides: the overrides it was given.

    Returns:
        ``(message, override)``: one line naming the key and the allowed values or form (with the closest
        match), and the override that caused it (None when it cannot be told); None for other errors.
    """
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    if isinstance(exc, MissingConfigException) and exc.options is not None and exc.missing_cfg_file:
        group, _, value = exc.missing_cfg_file.rpartition("/")
        key = group.replace("/", ".")
        options = sorted(exc.options)
        return (
            f"{key}={value}: no such {key}; allowed: {', '.join(options)}{closest(value, options)}",
            override_for(key, overrides),
        )
    if isinstance(exc, OverrideParseException):
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parser = OverridesParser.create()
        for o in overrides:
            try:
                parser.parse_overrides([o])
            except OverrideParseException as one:
                why = str(one).splitlines()[0]
                return f"{o}: not an override KEY=VALUE ({why}); lists are [a,b], strings with ',' quoted", o
        return None
    if isinstance(exc, ConfigCompositionException) and str(exc).startswith("Ambiguous value for argument"):
        arg = str(exc).split("'", 2)[1] if str(exc).count("'") >= 2 else None
        key = (arg or "KEY").split("=", 1)[0]
        return (
            f"{arg}: several values; to run one job per value add -m (multirun), for a list write "
            f"{key}=[a,b], for a string with a comma quote it: {key}='a,b'",
            arg,
        )
    cause = exc.__cause__
    if not isinstance(exc, ConfigCompositionException) or cause is None:
        return None
    full_key = str(getattr(cause, "full_key", "") or "")
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and full_key:
        parent, _, leaf = full_key.rpartition(".")
        if parent and typing.get_origin(_strip_optional(_schema_type(parent))[0]) is dict:
            # a mapping's keys are the user's (review.gpu_price_per_hour): Hydra adds a new one only with '+'
            return (
                f"{full_key}: {parent} is a mapping whose keys are yours to add, with Hydra's leading '+': "
                f"'+{parent}={{{leaf}: VALUE}}'",
                override_for(full_key, overrides),
            )
        keys = _schema_keys(parent)
        where = f"in {parent}" if parent else "at the top level"
        return (
            f"{full_key}: no such key {where}; keys: {', '.join(keys)}{closest(leaf, keys)}",
            override_for(full_key, overrides),
        )
    refused = enum_refusal(exc, overrides)  # a value outside an Enum field's choices: validate's form
    if refused is not None:
        return refused
    if isinstance(cause, ValidationError) and full_key:
        root = full_key.split("[", 1)[0]
        override = override_for(root, overrides)
        tp = _schema_type(full_key)
        form = value_form(tp) if tp is not None else "of the schema's type"
        what = override or full_key
        element = f" {full_key}" if full_key != root else ""
        return f"{what}:{element} must be {form}", override
    return None


def _compose_errors(overrides: list[str]) -> list[str]:
    """Every explained composition error of ``overrides``: compose, drop the culprit, compose again."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    errors: list[str] = []
    todo = list(overrides)
    for _ in range(_MAX_ROUNDS):
        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
                compose(config_name="config", overrides=todo)
            return errors
        except Exception as exc:  # noqa: BLE001 - what fails here fails in hydra.main too, after it made folders
            explained = explain(exc, todo) if isinstance(exc, (HydraException, OmegaConfBaseException)) else None
            if explained is None:
                msg = f"composing the config with {' '.join(todo)} failed: {type(exc).__name__}: {exc}".strip()
                if exc.__cause__ is not None:
                    msg += f": {str(exc.__cause__).splitlines()[0]}"
                errors.append(msg)
                return errors
            msg, culprit = explained
            errors.append(msg)
            if culprit is None or culprit not in todo:
                return errors
            todo.remove(culprit)
    return errors


def _variants(overrides: list[str]) -> list[list[str]]:
    """The override lists a ``-m`` sweep composes: the first value of every sweep, then each other value of one
    sweep at a time (every distinct value is composed once; combinations are not multiplied)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    values: list[list[str]] = []
    for o in parsed:
        if o.is_sweep_override():
            try:
                vals = list(o.sweep_string_iterator())
            except Exception:  # noqa: BLE001 - glob() sweeps need Hydra's config loader: composed by Hydra itself
                vals = []
            values.append([f"{o.get_key_element()}={v}" for v in vals])
        else:
            values.append([o.input_line] if o.input_line else [])
    base = [v[0] for v in values if v]
    out = [base]
    for i, vals in enumerate(values):
        for v in vals[1:]:
            variant = list(base)
            variant[sum(1 for w in values[:i] if w)] = v
            out.append(variant)
    return out


def check_command_line(argv: list[str]) -> None:
    """Compose ``conf/config.yaml`` with the overrides of a ``pipelines.run`` command line before Hydra runs it.

    Skipped for ``--help``, ``--hydra-help``, ``--info``, ``--shell-completion`` and a command line that picks
    another config (``--config-path``/``--config-name``/``--config-dir``). Overrides of ``hydra.*`` are left
    to Hydra. Values are checked against the schema only; the checks of
    :func:`quantverdict.config.validate.validate` run later, per job.

    Raises:
        ConfigError: every bad override, one line each (:func:`explain`).
    """
    from hydra._internal.utils import get_args_parser
    from hydra.errors import HydraException

    args, _ = get_args_parser().parse_known_args(argv)
    if args.help or args.hydra_help or args.info or args.shell_completion:
        return
    if args.config_path or args.config_name or args.config_dir or args.experimental_rerun:
        return
    overrides = [o for o in args.overrides if not o.startswith(_HYDRA_KEYS)]
    try:
        variants = _variants(overrides) if args.multirun else [overrides]
    except HydraException:
        variants = [overrides]  # a parse error: composing says which override
    errors: list[str] = []
    for variant in variants:
        errors += [e for e in _compose_errors(variant) if e not in errors]
    if errors:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
