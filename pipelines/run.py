"""Run one quantization job, or a grid with Hydra's multirun.

    python -m pipelines.run scheme=awq model=smollm2-135m
    python -m pipelines.run -m scheme=bf16,awq,gptq,int8,fp8,w8a8

Each job writes ``record.json`` (and logs) into its Hydra output folder and one MLflow run. In a
grid a failed job is recorded and the grid goes on; the grid ends with a table of all jobs and a
non-zero exit code if any failed (see :mod:`quantverdict.orchestrate.hydra_callbacks`).

Exit codes: 0 done; 1 a job failed; 2 bad input, nothing ran and nothing is left behind: no run folder, record or
MLflow run (an override Hydra cannot compose, :func:`quantverdict.config.overrides.check_command_line`, or a value
:func:`quantverdict.config.validate.validate` refuses, :func:`refuse_bad_values`: both checked before Hydra makes a
folder, for every job of a grid; a job this machine cannot run, refused in one of the checks before any expensive
work, :data:`quantverdict.orchestrate.job.CHECK_STAGES`: its folder is removed; in a grid: every job refused);
130 interrupted by Ctrl-C (143 by SIGTERM): the job is recorded ``interrupted``, its MLflow run KILLED, its
processes stopped.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import quantverdict.config.compose  # noqa: F401  (registers the config schema and resolvers)
from quantverdict.config import device_pick
from quantverdict.config.compose import CONF_DIR, compose
from quantverdict.config.overrides import check_command_line
from quantverdict.config.schema import ConfigError
from quantverdict.orchestrate import starts
from quantverdict.orchestrate.hydra_callbacks import runs_table_line
from quantverdict.orchestrate.job import refused_before_work, run_job, write_config_failure
from quantverdict.processes import procs
from quantverdict.results.record import JobRecord, load
from quantverdict.results.table import format_table

log = logging.getLogger("quantverdict")
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C
MAX_GRID_CHECKS = 64  # a grid of more jobs has each of its values checked once, not every combination
# what a single job cannot say on its own: every verdict compares a scheme with the baseline of the same model
WITHOUT_BASELINE = (
    "Alone, this job gives {scheme}'s own numbers for {model} (weights, accuracy scores, speed where served), not a "
    "verdict: accuracy loss and speedup are measured against the {baseline} baseline of the same model and machine.\n"
    "For the verdict: python -m pipelines.run -m scheme={baseline},{scheme} with the same other overrides (an "
    "identical finished job is reused, not rerun)."
)
BASELINE_ALONE = (
    "Alone, the {baseline} baseline gives {model}'s reference numbers, not a verdict: a verdict compares schemes with "
    "it.\nFor one: python -m pipelines.run -m scheme={baseline},<schemes> with the same other overrides (an identical "
    "finished job is reused, not rerun)."
)


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(dcfg: DictConfig) -> None:
    procs.install_signal_handlers()
    hc = HydraConfig.get()
    out_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode.name == "MULTIRUN"
    try:
        cfg = quantverdict.config.compose.to_config(dcfg)
    except ConfigError as exc:
        log.error("%s", exc)
        if multirun:
            write_config_failure(dcfg, out_dir, exc)
            return  # the grid goes on; GridSummary reports it and sets the exit code
        remove_run_dir(out_dir)
        sys.exit(EXIT_BAD_INPUT)
    try:
        record = run_job(cfg, out_dir)
    except KeyboardInterrupt:
        raise
    except ConfigError:  # refused before any expensive work (preflight, cpu_check): bad input for this machine
        if multirun:
            return
        if refused_before_work(load_typed(out_dir)):
            remove_run_dir(out_dir)
            sys.exit(EXIT_BAD_INPUT)
        print(f"record: {out_dir / 'record.json'}")
        sys.exit(1)
    except Exception:
        if not multirun:
            print(f"record: {out_dir / 'record.json'}")
            sys.exit(1)
        return  # the grid goes on; GridSummary reports failed jobs and sets the exit code
    if multirun:
        return
    if starts.wants_starts(cfg) and record.get("status") == "ok":
        # a single job runs its further server starts back to back (a grid interleaves them: GridSummary)
        outcome = starts.run_starts([out_dir], "single_job")
        record = load(out_dir)
        for _job, start, error in outcome.failed:
            log.error("server start %d failed: %s", start, error)
        if not outcome.ok:
            print(format_table([record]))
            print(f"record: {out_dir / 'record.json'}")
            sys.exit(1)
    print(format_table([record]))
    print(f"\nrecord: {out_dir / 'record.json'}")
    is_baseline = cfg.scheme.name == cfg.baseline_scheme and cfg.kv.name == "auto"
    alone = BASELINE_ALONE if is_baseline else WITHOUT_BASELINE
    print(alone.format(model=cfg.model.name, scheme=cfg.scheme.name, baseline=cfg.baseline_scheme))
    line = runs_table_line(cfg.tracking)
    if line:
        print(line)


def load_typed(out_dir: Path) -> JobRecord:
    """The job's record in ``out_dir``, typed."""
    return JobRecord.view(load(out_dir))


def remove_run_dir(out_dir: Path) -> None:
    """Remove a refused job's folder (Hydra's run folder: its ``.hydra/``, log and record), and the ``runs/``
    folder above it when that is left empty: bad input leaves nothing behind."""
    logging.shutdown()  # the job's log file is in the folder
    shutil.rmtree(out_dir, ignore_errors=True)
    try:
        out_dir.parent.rmdir()  # only when empty
    except OSError:
        pass


def grid_jobs(overrides: list[str], multirun: bool) -> list[tuple[str, list[str]]]:
    """The jobs a command line runs, each as (its sweep values, its overrides): the command line itself for one
    job; for a ``-m`` grid every combination of its sweeps, or, past :data:`MAX_GRID_CHECKS` combinations, each
    value of each sweep once (:func:`quantverdict.config.overrides._variants`). [] when a sweep cannot be expanded
    here (``glob()``: Hydra expands it)."""
    if not multirun:
        return [("", overrides)]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from quantverdict.config.overrides import _variants

    axes: list[list[str]] = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            try:
                axes.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
            except Exception:  # noqa: BLE001 - glob() sweeps need Hydra's config loader: left to Hydra
                return []
        elif o.input_line:
            axes.append([o.input_line])
    swept = {v for axis in axes if len(axis) > 1 for v in axis}
    total = 1
    for axis in axes:
        total *= len(axis)
    jobs = _variants(overrides) if total > MAX_GRID_CHECKS else [list(c) for c in itertools.product(*axes)]
    return [(" ".join(o for o in job if o in swept), job) for job in jobs]


def refuse_bad_values(argv: list[str]) -> None:
    """Compose and validate (:func:`quantverdict.config.compose.compose`) every job of a ``pipelines.run`` command
    line before Hydra makes any folder: a value :func:`quantverdict.config.validate.validate` refuses
    (``bench.num_prompts=0``) is bad input, for one job and for a grid alike (a grid runs none of its jobs then).

    Skipped where :func:`quantverdict.config.overrides.check_command_line` is (``--help``, another config).

    Raises:
        ConfigError: every refused value, one line each; in a grid, a line that holds for some jobs only names them
            by their sweep values.
    """
    from hydra._internal.utils import get_args_parser
    from hydra.errors import HydraException

    args, _ = get_args_parser().parse_known_args(argv)
    if args.help or args.hydra_help or args.info or args.shell_completion:
        return
    if args.config_path or args.config_name or args.config_dir or args.experimental_rerun:
        return
    overrides = [o for o in args.overrides if not o.startswith(("hydra.", "hydra/", "+hydra", "~hydra"))]
    try:
        jobs = grid_jobs(overrides, bool(args.multirun))
    except HydraException:
        return  # check_command_line has said what cannot be parsed
    problems: dict[str, list[str]] = {}
    for label, job in jobs:
        try:
            compose(job)
        except ConfigError as exc:
            for line in str(exc).removeprefix("invalid configuration:").splitlines():
                if line.strip():
                    problems.setdefault(line.strip().removeprefix("- "), []).append(label)
    if not problems:
        return
    lines = [p if len(where) == len(jobs) else f"{p} (in job {', '.join(where)})" for p, where in problems.items()]
    raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(lines))


def cli(argv: list[str] | None = None) -> None:
    """``python -m pipelines.run``: the overrides composed and validated for every job before Hydra starts (bad
    input: a message in the project's form, exit code 2, no output folder), then the Hydra app :func:`main` on
    ``sys.argv``."""
    # env=auto -> env=gpu or env=cpu, and the eval/bench profiles of its device unless given (Hydra reads sys.argv)
    sys.argv[1:] = device_pick.expand(sys.argv[1:] if argv is None else list(argv), CONF_DIR)
    try:
        check_command_line(sys.argv[1:])
        refuse_bad_values(sys.argv[1:])
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    try:
        main()
    except KeyboardInterrupt as exc:  # the job recorded it and stopped its processes: one line, no traceback
        print(
            f"interrupted by {procs.interrupt_signal(exc)}: stopped; what finished is kept in the record",
            file=sys.stderr,
        )
        sys.exit(getattr(exc, "exit_code", EXIT_INTERRUPTED))


if __name__ == "__main__":
    cli()
