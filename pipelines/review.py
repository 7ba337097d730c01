"""Review a grid: which scheme to deploy under stated constraints, defended with three numbers.

    python -m pipelines.review outputs/multirun/<grid>
    python -m pipelines.review outputs/multirun/X review.memory_budget_gib=0.22
    python -m pipelines.review outputs/multirun/X review.min_recovery_pct=99.5 --out outputs/review-strict
    python -m pipelines.review mlflow:quantverdict                  # an MLflow experiment (tracking.uri from conf/)
    python -m pipelines.review quantverdict tracking.uri=sqlite:///outputs/mlflow.db

The constraints (schema: :class:`quantverdict.config.schema.ReviewConfig`) are ``conf/review/cpu.yaml`` or
``conf/review/gpu.yaml``, picked from where the records ran (``conf/review/default.yaml`` is ``name: auto``,
:mod:`quantverdict.review.constraints`); ``review=cpu``/``review=gpu`` picks one by name and any
``review.KEY=VALUE`` overrides a key of the picked set. Writes ``review.md``, ``review.html``
(self-contained) and ``review.json`` into ``--out``, by default a new folder
``<paths.output_root>/reviews/<time>-<pid>_<label>`` of this checkout (``outputs/`` unless ``QV_OUTPUT_ROOT`` or
``paths.output_root=...`` says otherwise), where ``<label>`` is the set's name and the hash of its values
(``cpu-3f9a01bc``); nothing is written into the source folder. Logs them to an MLflow run named
``review/<label>``, tagged ``quantverdict.kind=review``, in the store of this checkout's tracking config
(``conf/tracking/sqlite.yaml``: ``<paths.output_root>/mlflow.db``; ``tracking=...`` and ``tracking.KEY=...``
on the command line change it), never in the store that the records name (their grid's, maybe another
checkout's). The grid's own review, run by itself at the end of every grid
(:class:`quantverdict.orchestrate.hydra_callbacks.GridSummary`), is ``<grid>/review``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
import sys
from pathlib import Path
from typing import cast

from omegaconf import OmegaConf

from quantverdict.config.schema import ConfigError, ReviewConfig, TrackingConfig
from quantverdict.config.validate import review_errors

log = logging.getLogger("quantverdict")
ALLOWED_PREFIXES = ("review", "tracking", "paths")
HELP_EPILOG = """examples:
  python -m pipelines.review outputs/multirun/<grid> review.memory_budget_gib=20 review.itl_ms_p99=50
  python -m pipelines.review outputs/multirun/<grid> 'review.gpu_price_per_hour={H100: 2.5}' \\
      review.energy_usd_per_kwh=0.15          the cost line: USD per million output tokens (GPU-hours, energy)

writes review.md, review.html and review.json into --out; every key: docs/reference/config.md (review).
exit codes: 0 done, 1 written but not logged to MLflow, 2 bad input (a key, a value or the source)."""
# review keys holding a mapping (review.gpu_price_per_hour={H200: 3.5}): the value given replaces the mapping, with
# or without Hydra's '+' (the review's header prints the override without it, and that line must compose again)
MAPPING_KEYS = tuple(
    f.name
    for f in dataclasses.fields(ReviewConfig)
    if f.default_factory is not dataclasses.MISSING and isinstance(f.default_factory(), dict)
)


def _mapping_overrides(overrides: list[str]) -> list[str]:
    """``review.K=V`` of a mapping key K as ``++review.K=V`` (set or add); every other override unchanged."""
    out = []
    for o in overrides:
        key = o.lstrip("+").split("=", 1)[0]
        out.append("++" + o.lstrip("+") if key.removeprefix("review.") in MAPPING_KEYS and "=" in o else o)
    return out


def compose_review(overrides: list[str]) -> tuple[ReviewConfig, TrackingConfig, Path]:
    """The review constraints, tracking config and output root, composed from ``conf/`` with overrides.

    Raises:
        ConfigError: an override outside ``review``/``tracking``/``paths``, an unknown key or config file, a
            value of the wrong type (:func:`quantverdict.config.overrides.explain`), or a bad review value.
        hydra.errors.ConfigCompositionException: another composition error.
    """
    bad = [o for o in overrides if re.split(r"[.=]", o.lstrip("+~"), maxsplit=1)[0] not in ALLOWED_PREFIXES]
    if bad:
        raise ConfigError(f"only review.*, tracking.* and paths.* keys apply to a review; not: {', '.join(bad)}")
    # Hydra and the config wiring load only when a review is composed (``--help`` and argument errors stay fast)
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from quantverdict.config.compose import CONF_DIR
    from quantverdict.config.overrides import explain

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        try:
            cfg = compose(config_name="config", overrides=_mapping_overrides(overrides))
        except (HydraException, OmegaConfBaseException) as exc:
            explained = explain(exc, overrides)  # key, allowed values or form, closest match
            if explained is None:
                raise
            raise ConfigError(explained[0]) from None
    rc = cast(ReviewConfig, OmegaConf.to_object(cfg.review))
    errors = review_errors(rc)
    if errors:
        raise ConfigError("invalid review configuration:\n  - " + "\n  - ".join(errors))
    tracking = cast(TrackingConfig, OmegaConf.to_object(cfg.tracking))
    return rc, tracking, Path(cfg.paths.output_root)


def plain(text: str) -> str:
    """Markdown emphasis removed, for the terminal."""
    return text.replace("**", "").replace("`", "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.review",
        description="Review a grid of quantization jobs under stated constraints (conf/review/cpu.yaml or gpu.yaml, "
        "picked from where the grid ran).",
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", help="a run or multirun folder, or an MLflow experiment (mlflow:NAME or NAME)")
    parser.add_argument("overrides", nargs="*", help="review.KEY=VALUE, review=NAME, tracking.KEY=VALUE")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default: <paths.output_root>/reviews/<time>-<pid>_<set>-<hash> of this checkout)",
    )
    args = parser.parse_intermixed_args(argv)  # overrides may come before or after --out
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")

    # after argument parsing: Hydra, the config wiring and the review (matplotlib) load only for a review
    from hydra.errors import ConfigCompositionException

    import quantverdict.config.compose  # noqa: F401  (registers the config schema and resolvers)
    from quantverdict.review import ReviewNotLogged, run_review
    from quantverdict.review.cost import cost_notes
    from quantverdict.review.render import console

    try:
        rc, tracking, output_root = compose_review(args.overrides)
    except (ConfigError, ConfigCompositionException) as exc:
        print(f"error: {exc}{': ' + str(exc.__cause__) if exc.__cause__ else ''}", file=sys.stderr)
        return 2
    source = args.source
    src_path = Path(source)
    from_mlflow = source.startswith("mlflow:") or not src_path.exists()
    if from_mlflow:
        source = source.removeprefix("mlflow:")
        if "/" in source and not args.source.startswith("mlflow:"):
            print(
                f"error: {args.source!r} is not a folder (for an MLflow experiment write mlflow:NAME)", file=sys.stderr
            )
            return 2
    # the composed tracking config (this checkout's, with the command line's tracking overrides), never the store
    # that a folder's records name: that is their grid's, maybe another checkout's or another machine's
    not_logged: ReviewNotLogged | None = None
    try:
        review, paths = run_review(
            source if from_mlflow else src_path,
            rc,
            tracking,
            args.out,
            output_root,
            args.overrides,
        )
    except ReviewNotLogged as exc:  # written, not logged: the verdict is shown, then the exit code says so
        review, paths, not_logged = exc.review, exc.paths, exc
    except (FileNotFoundError, ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(plain(console(review)), end="")
    if review.flags:
        print(f"{len(review.flags)} honesty flags (see the review):")
        for f in review.flags:
            print(f"  - {plain(f.message)}")
    print(f"constraints: {review.constraints_how} [{review.constraints_label}]")
    for note in cost_notes(review.constraints, review.environment):  # a price set that priced nothing
        print(f"note: {note}")
    print(f"review: {paths['md']}\n        {paths['html']}\n        {paths['json']}")
    if not_logged is not None:
        print(f"error: {not_logged}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
