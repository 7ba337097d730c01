"""Run one quantization job, or a grid with Hydra's multirun.

    python -m pipelines.run scheme=awq model=smollm2-135m
    python -m pipelines.run -m scheme=bf16,awq,gptq,int8,fp8,w8a8

Each job writes ``record.json`` (and logs) into its Hydra output folder and one MLflow run. In a
grid a failed job is recorded and the grid goes on; the grid ends with a table of all jobs and a
non-zero exit code if any failed (see :mod:`quantverdict.orchestrate.hydra_callbacks`).

Exit codes: 0 done; 1 a job failed; 2 bad input, nothing ran (an override Hydra cannot compose, checked
before Hydra starts by :func:`quantverdict.config.overrides.check_command_line`, or a value
:func:`quantverdict.config.validate.validate` refuses; in a grid: every job refused); 130 interrupted by Ctrl-C
(143 by SIGTERM): the job is recorded ``interrupted``, its MLflow run KILLED, its processes stopped.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import quantverdict.config.compose  # noqa: F401  (registers the config schema and resolvers)
from quantverdict.config import device_pick
from quantverdict.config.compose import CONF_DIR
from quantverdict.config.overrides import check_command_line
from quantverdict.config.schema import ConfigError
from quantverdict.orchestrate import starts
from quantverdict.orchestrate.job import run_job, write_config_failure
from quantverdict.processes import procs
from quantverdict.results.record import load
from quantverdict.results.table import format_table

log = logging.getLogger("quantverdict")
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C


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
        write_config_failure(dcfg, out_dir, exc)
        if multirun:
            return  # the grid goes on; GridSummary reports it and sets the exit code
        sys.exit(EXIT_BAD_INPUT)
    try:
        record = run_job(cfg, out_dir)
    except KeyboardInterrupt:
        raise
    except ConfigError:  # refused before any expensive work (preflight, cpu_check): bad input for this machine
        if not multirun:
            sys.exit(EXIT_BAD_INPUT)
        return
    except Exception:
        if not multirun:
            sys.exit(1)
        return  # the grid goes on; GridSummary reports failed jobs and sets the exit code
    if not multirun and starts.wants_starts(cfg) and record.get("status") == "ok":
        # a single job runs its further server starts back to back (a grid interleaves them: GridSummary)
        outcome = starts.run_starts([out_dir], "single_job")
        record = load(out_dir)
        for _job, start, error in outcome.failed:
            log.error("server start %d failed: %s", start, error)
        if not outcome.ok:
            print(format_table([record]))
            sys.exit(1)
    if not multirun:
        print(format_table([record]))


def cli(argv: list[str] | None = None) -> None:
    """``python -m pipelines.run``: the overrides composed once before Hydra starts (bad input: a message in the
    project's form, exit code 2, no output folder), then the Hydra app :func:`main` on ``sys.argv``."""
    # env=auto -> env=gpu or env=cpu, and the eval/bench profiles of its device unless given (Hydra reads sys.argv)
    sys.argv[1:] = device_pick.expand(sys.argv[1:] if argv is None else list(argv), CONF_DIR)
    try:
        check_command_line(sys.argv[1:])
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
