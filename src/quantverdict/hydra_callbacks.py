"""Hydra callback: after a multirun grid, print the per-scheme table and fail if any job failed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from quantverdict.record import find_records, load
from quantverdict.report import format_table


class GridSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        records = [load(p) for p in find_records(sweep_dir)]
        print(format_table(records))
        (sweep_dir / "table.md").write_text(format_table(records) + "\n")
        failed = [r for r in records if r.get("status") != "ok"]
        for r in failed:
            print(f"FAILED {r['job']['id']} in stage {r.get('failed_stage')}: {r.get('error')}", file=sys.stderr)
        if failed:
            print(f"{len(failed)} of {len(records)} jobs failed; records under {sweep_dir}", file=sys.stderr)
            sys.exit(1)
