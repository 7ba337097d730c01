"""The two screenshots in docs/screenshots, from the embedded CPU grid's records (as tests/regen_docs_results.py
reviews them: ``docs/results/cpu-records/xeon-amx/smollm2-135m``, the ``cpu`` constraint set):

* ``review-first-screen.png``: the first 1280 x 800 px of that grid's review.html;
* ``mlflow-runs.png``: MLflow's runs page (:func:`quantverdict.results.tracking.runs_page`) served by a real
  ``mlflow server`` over a fresh sqlite store holding the six job runs (each with its stage runs, as
  :class:`quantverdict.results.tracking.Tracker` logs them) and the review.

    PYTHONPATH=src:.:tests python tests/regen_screenshots.py [--out docs/screenshots]

Needs Debian's ``chromium`` (``make browser``). Everything else goes to a temporary folder; the server is stopped
with its whole process tree.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from browser import FIRST_SCREEN, mlflow_server, screenshot
from pipelines.review import main as review_main
from quantverdict.config.schema import TrackingConfig
from quantverdict.results.tracking import Tracker, runs_page

ROOT = Path(__file__).resolve().parents[1]
CPU_RECORDS = ROOT / "docs" / "results" / "cpu-records" / "xeon-amx" / "smollm2-135m"
UI_WAIT_MS = 20_000


def build_store(tmp: Path) -> tuple[str, Path]:
    """A copy of the CPU grid's records under ``tmp/grid`` logged to ``tmp/mlflow.db`` as MLflow logs a grid,
    then reviewed (``python -m pipelines.review``). Returns (tracking URI, review folder)."""
    uri = f"sqlite:///{tmp}/mlflow.db"
    trk = TrackingConfig(name="sqlite", uri=uri, experiment="quantverdict", artifact_location=str(tmp / "artifacts"))
    grid = tmp / "grid"
    for src in sorted(CPU_RECORDS.iterdir()):
        rec = json.loads((src / "record.json").read_text())
        out = grid / src.name
        out.mkdir(parents=True)
        rec["job"]["output_dir"] = str(out)
        rec["config"]["tracking"] = {"name": "sqlite", "enabled": True, "uri": uri, "experiment": "quantverdict"}
        (out / "record.json").write_text(json.dumps(rec))
        job = rec["job"]
        tr = Tracker(trk)
        tr.start(
            f"{job['model']}/{job['scheme']}",
            {
                "model": str(job["model"]),
                "scheme": str(job["scheme"]),
                "config_hash": str(job.get("config_hash")),
                "output_dir": str(out),
            },
        )
        for name, stage in (rec.get("stages") or {}).items():
            tr.stage(name, str(stage.get("status") or "ok"), stage.get("wall_s"))
        tr.finish(rec, out, [out / "record.json"])
    review = tmp / "review"
    tracking = [
        f"tracking.uri={uri}",
        "tracking.experiment=quantverdict",
        f"tracking.artifact_location={tmp / 'artifacts'}",
    ]
    assert review_main([str(grid), *tracking, "--out", str(review)]) == 0
    return uri, review


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="qv-shots-") as d:
        tmp = Path(d)
        uri, review = build_store(tmp)
        screenshot((review / "review.html").as_uri(), tmp / "review-first-screen.png", tmp, FIRST_SCREEN)
        from mlflow import MlflowClient

        exp = MlflowClient(tracking_uri=uri).get_experiment_by_name("quantverdict")
        with mlflow_server(uri, tmp) as address:
            url = runs_page(str(exp.experiment_id), address)
            screenshot(url, tmp / "mlflow-runs.png", tmp, (1400, 800), UI_WAIT_MS)
        for name in ("review-first-screen.png", "mlflow-runs.png"):
            shutil.copy(tmp / name, args.out / name)
            print(args.out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
