"""Where the review reads records from: a run/multirun folder, or an MLflow experiment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantverdict.results.record import RECORD_FILE, JobRecord, find_records, load

JOB_TAG = "config_hash"  # set on every job run by quantverdict.results.tracking.Tracker.start


def _read(path: Path) -> JobRecord:
    rec = JobRecord.view(load(path))
    rec.source_dir = str(path.parent)
    return rec


def load_dir(root: Path) -> tuple[list[JobRecord], list[str]]:
    """``(records, problems)``: every readable record under ``root``; an unreadable one is a problem, not fatal."""
    records, problems = [], []
    for path in find_records(root):
        try:
            records.append(_read(path))
        except (ValueError, OSError) as exc:  # json.JSONDecodeError is a ValueError
            problems.append(f"{path}: not read ({exc})")
    return records, problems


def load_mlflow(uri: str, experiment: str, dest: Path) -> tuple[list[JobRecord], list[str]]:
    """``(records, problems)`` of every job run of an MLflow experiment, its ``record.json``
    (and ``eval/`` samples) downloaded into ``dest/<run_id>/``. Raises ValueError: no such experiment."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        raise ValueError(
            f"no MLflow experiment {experiment!r} at {uri}; experiments there: {', '.join(names) or 'none'}"
        )
    records, problems = [], []
    for run in job_runs(client, exp.experiment_id):
        rid = run.info.run_id
        target = dest / rid
        target.mkdir(parents=True, exist_ok=True)
        artifacts = {a.path for a in client.list_artifacts(rid)}
        if RECORD_FILE not in artifacts:
            problems.append(f"run {run.info.run_name} ({rid}): no {RECORD_FILE} artifact")
            continue
        client.download_artifacts(rid, RECORD_FILE, str(target))
        if "eval" in artifacts:
            client.download_artifacts(rid, "eval", str(target))
        try:
            records.append(_read(target / RECORD_FILE))
        except ValueError as exc:
            problems.append(f"run {rid}: {exc}")
    return records, problems


def job_runs(client: Any, experiment_id: str) -> list[Any]:
    """Every job run (tagged :data:`JOB_TAG`, not a review run) of an MLflow experiment, over all pages of
    ``MlflowClient.search_runs`` (1000 runs a page)."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        runs += [r for r in page if JOB_TAG in r.data.tags]
        token = page.token
        if not token:
            return runs


def _rank(rec: JobRecord) -> tuple[bool, str]:
    return rec.status == "ok", rec.job.finished_at or rec.job.started_at or ""  # ISO timestamps sort by time


def dedupe(records: list[JobRecord]) -> tuple[list[JobRecord], list[str]]:
    """``(kept, notes)``: one record per (model, scheme), a finished one before an unfinished one, then the newest
    (``job.finished_at``, else ``job.started_at``); a note names each record left out."""
    best: dict[tuple[str, str], JobRecord] = {}
    notes: list[str] = []
    for rec in records:
        key = (str(rec.job.model), str(rec.job.scheme))
        cur = best.setdefault(key, rec)
        if cur is rec:
            continue
        keep, drop = (rec, cur) if _rank(rec) > _rank(cur) else (cur, rec)
        best[key] = keep
        notes.append(
            f"{drop.job.id} ({drop.status}, {drop.job.finished_at}) left out: "
            f"a newer or finished record of {key[0]}/{key[1]} is used"
        )
    return list(best.values()), notes
