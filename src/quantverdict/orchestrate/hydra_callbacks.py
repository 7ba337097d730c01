"""Hydra callback: after a multirun grid, run the jobs' further server starts (``bench.server_starts``,
:mod:`quantverdict.orchestrate.starts`), print the per-scheme table, run the review, print where its MLflow runs
table is, and fail if any job failed (or the review could not be written, or was written but not logged to MLflow):
exit code 2 when every job was refused as bad input (nothing ran; the grid's folder is removed), else 1."""

from __future__ import annotations

import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from quantverdict.config.schema import ReviewConfig, TrackingConfig
from quantverdict.orchestrate.job import refused_before_work
from quantverdict.orchestrate.starts import grid_starts
from quantverdict.results.record import find_records, read
from quantverdict.results.table import format_table


class GridSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        # bench.server_starts > 1: starts 2.. of every finished job, interleaved round by round (before the table)
        starts_ok = grid_starts(sweep_dir)
        records = []
        for path in find_records(sweep_dir):
            try:
                records.append(read(path))
            except (ValueError, OSError) as exc:  # one unreadable record must not hide the others' table
                print(f"not read: {exc}", file=sys.stderr)
        failed = [r for r in records if r.status != "ok"]
        if failed and all(refused_before_work(r) for r in records):
            # bad input, nothing ran: every job was refused before any work; say why, leave nothing behind
            for r in failed:
                print(f"REFUSED {r.job.id} in stage {r.failed_stage}: {r.error}", file=sys.stderr)
            print(f"all {len(records)} jobs refused before any work; nothing ran", file=sys.stderr)
            shutil.rmtree(sweep_dir, ignore_errors=True)
            try:
                sweep_dir.parent.rmdir()  # multirun/, when this grid was its only one
            except OSError:
                pass
            sys.exit(2)
        print(format_table(records))
        (sweep_dir / "table.md").write_text(format_table(records) + "\n")
        reviewed = run_grid_review(config, sweep_dir) if records else True
        for r in failed:
            print(f"FAILED {r.job.id} in stage {r.failed_stage}: {r.error}", file=sys.stderr)
        if failed:
            print(f"{len(failed)} of {len(records)} jobs failed; records under {sweep_dir}", file=sys.stderr)
        if records and reviewed:
            print_runs_page(config)
        if failed or not reviewed or not starts_ok:
            sys.exit(1)


def print_runs_page(config: DictConfig) -> None:
    """Print how to open the grid's MLflow runs table (:func:`quantverdict.results.tracking.runs_page`), when the
    grid was tracked."""
    if "tracking" not in config:
        return
    tracking = OmegaConf.to_object(config.tracking)
    assert isinstance(tracking, TrackingConfig)
    line = runs_table_line(tracking)
    if line:
        print(line)


def runs_table_line(tracking: TrackingConfig) -> str:
    """``MLflow runs: mlflow ui --backend-store-uri <uri>, then open <address>`` for a tracked experiment; for a
    tracking server, its own address. '' when tracking is off or the experiment cannot be read."""
    if not tracking.enabled:
        return ""
    from quantverdict.results.tracking import make_client, runs_page

    try:
        exp = make_client(tracking.uri).get_experiment_by_name(tracking.experiment)
    except Exception:  # noqa: BLE001  (a link must not fail the grid)
        return ""
    if exp is None:
        return ""
    if tracking.uri.startswith(("http://", "https://")):
        return f"MLflow runs: {runs_page(str(exp.experiment_id), tracking.uri)}"
    return f"MLflow runs: mlflow ui --backend-store-uri {tracking.uri}, then open {runs_page(str(exp.experiment_id))}"


def run_grid_review(config: DictConfig, sweep_dir: Path) -> bool:
    """Review the grid in ``sweep_dir`` under ``config.review`` (written to ``<sweep_dir>/review``, logged to
    MLflow under ``config.tracking``). Prints the verdict; returns False (and prints why) on an error, and when
    the review was written but not logged to MLflow."""
    logged = True
    try:
        # imported here, inside the try: a review that cannot even be imported must not hide the table or exit code
        from quantverdict.review import ReviewNotLogged, run_review

        rc = OmegaConf.to_object(config.review) if "review" in config else ReviewConfig()
        tracking = OmegaConf.to_object(config.tracking) if "tracking" in config else None
        assert isinstance(rc, ReviewConfig) and (tracking is None or isinstance(tracking, TrackingConfig))
        # the grid's command line: its review.KEY=VALUE items go on top of the set picked for the device
        overrides = [str(o) for o in OmegaConf.select(config, "hydra.overrides.task", default=None) or []]
        try:
            review, paths = run_review(sweep_dir, rc, tracking, sweep_dir / "review", overrides=overrides)
        except ReviewNotLogged as exc:
            review, paths, logged = exc.review, exc.paths, False
            print(f"error: {exc}", file=sys.stderr)
    except Exception:  # noqa: BLE001  (a broken review must not hide the table or the exit code)
        print(f"the review of {sweep_dir} failed:\n{traceback.format_exc()}", file=sys.stderr)
        return False
    from quantverdict.review.render import console

    print(f"\n## Verdict ({review.constraints_how})\n")
    print(console(review).replace("**", ""), end="")  # the verdicts as the review command prints them
    print(f"\nreview: {paths['md']}\n        {paths['html']}")
    return logged
