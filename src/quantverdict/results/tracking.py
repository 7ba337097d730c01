"""MLflow tracking: one run per (model, scheme) job; its stages are tags and metrics of that run, not runs.

A stage's status is the tag ``stage.<name>`` (``ok``, ``cached``, ``failed``, ``interrupted``, ...) and its wall time
the metric ``stage.<name>.wall_s``. The job's own numbers also go under short names (:func:`job_metrics`:
``weights_gib``, ``<task>.<metric>``, ``token_perplexity``, ``out_tok_s_max``, ``user_tok_s_low``); a review adds the
comparisons with the baseline (``mem_gib``, ``acc_delta``, ``speed_ratio_c1``, ``speed_ratio_load``).

Uses :class:`mlflow.MlflowClient` with explicit run ids (no global "active run"), so a failure can
never leave another run active. Params are the flattened resolved config (a value longer than MLflow
takes is cut with a marker naming the whole value's length and sha256, :func:`param_value`), metrics the
flattened numeric results (names made valid for MLflow without collisions), artifacts the record itself,
the whole resolved config (``config.yaml``), the resolved llm-compressor recipe (``recipe.json``, where
the job got that far), the sweep table and the stage logs.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import re
import time
from pathlib import Path
from typing import Any

from quantverdict.config.schema import TrackingConfig
from quantverdict.results.record import JobRecord, Speed

log = logging.getLogger(__name__)

_INVALID = re.compile(r"[^A-Za-z0-9_\-. /]")
# MLflow's limit on one param value, in characters (mlflow.utils.validation.MAX_PARAM_VAL_LENGTH)
PARAM_VALUE_MAX = 6000
CONFIG_ARTIFACT = "config.yaml"  # the job's whole resolved config, beside record.json


def param_value(value: Any, limit: int = PARAM_VALUE_MAX) -> str:
    """``str(value)`` as an MLflow param: whole when it fits in ``limit`` characters, else its start followed
    by a marker that names the whole value, ``…[cut; sha256:<64 hex>; <n> chars]`` (sha256 of its UTF-8
    bytes), the two together exactly ``limit`` characters. The whole value is in the run's ``config.yaml``.
    """
    text = str(value)
    if len(text) <= limit:
        return text
    marker = f"…[cut; sha256:{hashlib.sha256(text.encode()).hexdigest()}; {len(text)} chars]"
    return text[: limit - len(marker)] + marker


def metric_name(key: str) -> str:
    """A valid MLflow metric/param name: lm-eval's ``acc,none`` -> ``acc``; other bad characters -> ``_``."""
    key = key.replace(",none", "")
    return _INVALID.sub("_", key)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts/lists -> ``{"a.b.0.c": leaf}`` (lists indexed by position)."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(data, list) and data and isinstance(data[0], (dict, list)):
        for i, v in enumerate(data):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = data
    return out


def numeric_metrics(sections: dict[str, Any]) -> dict[str, float]:
    """Finite numbers (bools excluded) of ``sections`` flattened into valid, collision-free metric names.

    Raises:
        ValueError: two different keys would map to the same metric name.
    """
    metrics: dict[str, float] = {}
    origin: dict[str, str] = {}
    for key, value in flatten(sections).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        name = metric_name(key)
        if name in origin and origin[name] != key:
            raise ValueError(f"metric name collision: {origin[name]!r} and {key!r} both map to {name!r}")
        origin[name] = key
        metrics[name] = float(value)
    return metrics


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///<path>`` tracking URI, else None (other stores, in-memory sqlite).

    SQLAlchemy's form: ``sqlite:////abs/mlflow.db`` is absolute, ``sqlite:///rel.db`` relative to
    the working directory; a ``?query`` is not part of the path.
    """
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    path = uri[len(prefix) :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def make_client(uri: str) -> Any:
    """An :class:`mlflow.MlflowClient` for ``uri`` whose store exists when it returns.

    MLflow 3.17.2's sqlite tracking store creates its tables and runs its schema migrations in the
    constructor without a lock, so jobs of a parallel grid opening a fresh store at once crash each
    other (``sqlite3.OperationalError: duplicate column name: step``, ``alembic ... CommandError:
    Online migration expected to match one row``; measured by
    ``tests/integration/test_tracking_parallel.py``). For a sqlite store the first contact is
    therefore made under an exclusive ``flock`` on ``.<db name>.init.lock`` next to the database;
    later clients find the tables and only wait for the lock briefly.
    """
    from mlflow import MlflowClient

    db = sqlite_path(uri)
    if db is None:
        return MlflowClient(tracking_uri=uri)
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.parent / f".{db.name}.init.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # the store (tables, migrations) is created by now
    return client


# MLflow 3.x's UI opens an experiment on the page of its kind: the GenAI overview (traces) unless the experiment
# tag ``mlflow.experimentKind`` says otherwise. ``custom_model_development`` is the kind the UI calls
# "Machine learning" (its experiment-type selector), whose page is the runs table. Read from MLflow 3.17.2's UI
# bundle (mlflow/server/js/build: ``setExperimentTag({key: "mlflow.experimentKind", value: kind})`` and the kinds
# enum), which the Python package does not name; tests/integration/test_mlflow_ui.py checks that the page opens
# on the runs.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
PARENT_TAG = "mlflow.parentRunId"
GRID_TAG = "quantverdict.grid"  # on each job run: the grid (review source) it was reviewed in
REVIEW_TAG = "quantverdict.review"  # on each job run: the id of the review run that logged its three numbers


def experiment_id(client: Any, cfg: TrackingConfig) -> str:
    """Id of experiment ``cfg.experiment``, created (with ``cfg.artifact_location``) if missing, and marked as
    a model-training experiment (:func:`mark_model_training`) so that MLflow's UI opens on its runs.

    Safe when parallel jobs race to create it: the loser reads the winner's experiment.
    """
    exp = client.get_experiment_by_name(cfg.experiment)
    if exp is not None:
        if exp.tags.get(EXPERIMENT_KIND_TAG) is None:  # an experiment made before the tag, or by someone else
            mark_model_training(client, str(exp.experiment_id))
        if SHARED_VIEW_PREFIX + TABLE_VIEW_KEY not in exp.tags:
            set_table_view(client, str(exp.experiment_id))
        return str(exp.experiment_id)
    loc = cfg.artifact_location
    uri = Path(loc).resolve().as_uri() if loc and "://" not in loc else loc
    try:
        exp_id = str(
            client.create_experiment(
                cfg.experiment, artifact_location=uri, tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND}
            )
        )
    except Exception:  # another job of a parallel grid created it first
        exp = client.get_experiment_by_name(cfg.experiment)
        if exp is None:
            raise
        return str(exp.experiment_id)
    set_table_view(client, exp_id)
    return exp_id


def runs_page(exp_id: str, server: str = "http://127.0.0.1:5000") -> str:
    """The address of the experiment's runs table in MLflow's UI, in its "Model training" layout, with the columns
    of :data:`TABLE_COLUMNS` shown (the view :func:`set_table_view` stores on the experiment).

    MLflow 3.17.2's UI picks the page of an experiment from a switch of the whole UI (GenAI / Model training:
    the ``workflowType`` query parameter, else the browser's last choice, GenAI on a first visit), not from
    the experiment's kind tag: ``?workflowType=machine_learning`` opens the runs table on any browser.
    ``viewStateShareKey`` names a shared view of the table (MLflow's "Share" button stores one the same way).
    """
    return (
        f"{server.rstrip('/')}/#/experiments/{exp_id}/runs?workflowType=machine_learning"
        f"&viewStateShareKey={TABLE_VIEW_KEY}"
    )


# The runs table's columns in the view runs_page opens: the job's status (interrupted is not failed, though MLflow
# draws KILLED and FAILED with the same icon), the three numbers under their short names, two of the job's own
# numbers (what a job without a review shows) and the verdict. The table orders them by kind (metrics, then tags).
# MLflow's column keys are "<metrics|params|tags|attributes>.`<name>`"; a shared view is the experiment tag
# "mlflow.sharedViewState.<key>" holding the UI state as JSON (read from MLflow 3.17.2's UI bundle,
# mlflow/server/js/build: the share key's tag prefix and its parse of a plain JSON value).
TABLE_VIEW_KEY = "quantverdict-runs"
SHARED_VIEW_PREFIX = "mlflow.sharedViewState."
STATUS_TAG = "quantverdict.status"  # ok, failed, interrupted: the job's own word for its end
TABLE_COLUMNS = (
    f"tags.`{STATUS_TAG}`",
    "metrics.`mem_gib`",
    "metrics.`acc_delta`",
    "metrics.`speed_ratio_c1`",
    "metrics.`speed_ratio_load`",
    "metrics.`weights_gib`",
    "metrics.`out_tok_s_max`",
    "tags.`verdict`",
)


def set_table_view(client: Any, exp_id: str) -> None:
    """Store the runs table's view of :data:`TABLE_COLUMNS` on the experiment, under :data:`TABLE_VIEW_KEY`."""
    import json

    view = {"selectedColumns": list(TABLE_COLUMNS)}
    value = json.dumps(view)
    exp = client.get_experiment(exp_id)
    if exp.tags.get(SHARED_VIEW_PREFIX + TABLE_VIEW_KEY) != value:
        client.set_experiment_tag(exp_id, SHARED_VIEW_PREFIX + TABLE_VIEW_KEY, value)


def mark_model_training(client: Any, exp_id: str) -> None:
    """Tag the experiment ``mlflow.experimentKind = custom_model_development`` (MLflow's "Machine learning"
    kind), unless it already has a kind: a kind a person chose in the UI is kept."""
    exp = client.get_experiment(exp_id)
    if exp.tags.get(EXPERIMENT_KIND_TAG) is None:
        client.set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)


def log_job_headline(
    client: Any, run_id: str, metrics: dict[str, float], tags: dict[str, str], review_run_ids: set[str]
) -> None:
    """Put the review's numbers for one job on the job's own run, where the runs table and the compare view
    show them: ``metrics`` under their short names (``mem_gib``, ``acc_delta``, ``speed_ratio_c1``, ...),
    ``tags`` (the grid, the review run, what ``acc_delta`` measures). A job run nested under a review run (as
    reviews before this one did) is made top-level again: a parent would hide it in the runs table.

    Args:
        review_run_ids: the ids of review runs; a job's ``mlflow.parentRunId`` pointing at one is removed.
    """
    from mlflow.entities import Metric, RunTag

    ts = int(time.time() * 1000)
    client.log_batch(
        run_id,
        metrics=[Metric(k, float(v), ts, 0) for k, v in metrics.items() if math.isfinite(v)],
        tags=[RunTag(k, v[:5000]) for k, v in tags.items() if v],
    )
    parent = client.get_run(run_id).data.tags.get(PARENT_TAG)
    if parent and parent in review_run_ids:
        client.delete_tag(run_id, PARENT_TAG)


def run_status(status: str) -> str:
    """MLflow's run status for a job's or stage's status: FINISHED (ok, cached, skipped), KILLED (interrupted:
    stopped from outside), FAILED (anything else)."""
    if status in ("ok", "cached", "skipped"):
        return "FINISHED"
    return "KILLED" if status == "interrupted" else "FAILED"


class Tracker:
    """The MLflow side of one job: one run, opened by :meth:`open` (or by :meth:`finish`), never for a job refused
    before any work. Every method is a no-op when tracking is disabled; no store is touched before :meth:`open`."""

    def __init__(self, cfg: TrackingConfig):
        self.cfg = cfg
        self.client: Any = None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self._name = ""
        self._tags: dict[str, str] = {}
        self._stages: list[tuple[str, str, float | None]] = []  # (name, status, wall_s) not yet logged

    def start(self, run_name: str, tags: dict[str, str]) -> None:
        """Name the job's run and its tags; the run itself is created by :meth:`open`."""
        self._name, self._tags = run_name, dict(tags)

    def open(self) -> None:
        """Create the job's run (RUNNING) if it is not open yet, with the stages recorded so far."""
        if not self.cfg.enabled or self.run_id is not None:
            return
        self.client = make_client(self.cfg.uri)
        self.experiment_id = experiment_id(self.client, self.cfg)
        run = self.client.create_run(self.experiment_id, run_name=self._name or None, tags=self._tags)
        self.run_id = run.info.run_id
        log.info("MLflow run %s (%s) in %s", self._name, self.run_id, self.cfg.uri)
        self._log_stages()

    def stage(self, name: str, status: str, wall_s: float | None) -> None:
        """A finished (or failed) stage: tag ``stage.<name>`` = its status, metric ``stage.<name>.wall_s`` (seconds)
        on the job's run; kept until the run is open."""
        if not self.cfg.enabled:
            return
        self._stages.append((name, status, wall_s))
        if self.run_id is not None:
            self._log_stages()

    def _log_stages(self) -> None:
        from mlflow.entities import Metric, RunTag

        assert self.run_id is not None
        ts = int(time.time() * 1000)
        tags = [RunTag(f"stage.{n}", st) for n, st, _ in self._stages]
        metrics = [Metric(f"stage.{n}.wall_s", float(w), ts, 0) for n, _, w in self._stages if w is not None]
        if tags:
            self.client.log_batch(self.run_id, metrics=metrics, tags=tags)
        self._stages = []

    def finish(
        self, record: JobRecord | dict[str, Any], out_dir: Path, artifacts: list[Path], refused: bool = False
    ) -> None:
        """Log params, metrics and artifacts of the job (its record, typed or as its dict), then end its run
        FINISHED, KILLED or FAILED. ``refused``: the job's config was refused before any work; a run not opened
        yet is then never made (bad input leaves no run).

        The end status comes from :func:`run_status`; the tag :data:`STATUS_TAG` holds the record's own word (``ok``,
        ``failed``, ``interrupted``) and the run's description (``mlflow.note.content``) says where it stopped.
        Params are the config's values (:func:`param_value`), the recipe (``scheme.recipe``) and Hydra's own
        settings left out; the whole config is the artifact :data:`CONFIG_ARTIFACT`. Metrics: the record's
        sections flattened, and the job's own numbers under short names (:func:`job_metrics`).

        ``artifacts`` inside ``out_dir`` keep their sub-folder (``eval/samples_arc_easy.jsonl``).
        """
        if not self.cfg.enabled or (refused and self.run_id is None):
            return
        self.open()
        assert self.run_id is not None
        from mlflow.entities import Metric, Param

        rec = record if isinstance(record, JobRecord) else JobRecord.view(record)
        try:
            params = flatten(rec.config)
            plist = [
                Param(metric_name(k)[:250], param_value(v))
                for k, v in params.items()
                if not k.startswith(("scheme.recipe", "hydra"))
            ]
            for i in range(0, len(plist), 100):
                self.client.log_batch(self.run_id, params=plist[i : i + 100])
            self.client.log_dict(self.run_id, rec.config, CONFIG_ARTIFACT)
            metrics = numeric_metrics(
                {
                    "memory": rec.memory.to_dict(),
                    "accuracy": rec.accuracy.to_dict(),
                    "speed": _speed_by_label(rec.speed),
                }
            )
            metrics.update(job_metrics(rec))
            ts = int(time.time() * 1000)
            mlist = [Metric(k, v, ts, 0) for k, v in metrics.items()]
            for i in range(0, len(mlist), 500):
                self.client.log_batch(self.run_id, metrics=mlist[i : i + 500])
            self.client.set_tag(self.run_id, STATUS_TAG, str(rec.status))
            note = end_note(rec)
            if note:
                self.client.set_tag(self.run_id, "mlflow.note.content", note)
            if rec.error:
                self.client.set_tag(self.run_id, "quantverdict.error", rec.error[:5000])
            for path in artifacts:
                if path.exists():
                    sub = path.parent.relative_to(out_dir).as_posix() if path.parent != out_dir else None
                    self.client.log_artifact(self.run_id, str(path), sub if sub and sub != "." else None)
        finally:
            self.client.set_terminated(self.run_id, run_status(str(rec.status)))


def end_note(rec: JobRecord) -> str:
    """The run's description for a job that did not finish: ``interrupted by SIGINT in stage evaluate; ...`` (the
    same command resumes it) or ``failed in stage quantize: <error>``; '' for a finished job."""
    if rec.status == "interrupted":
        return (
            f"{rec.error or 'interrupted'} in stage {rec.failed_stage}: stopped from outside, not a failure; the "
            "same command resumes it (finished stages are reused)"
        )
    if rec.status != "ok":
        return f"failed in stage {rec.failed_stage}: {rec.error or 'no error recorded'}"[:5000]
    return ""


def job_metrics(rec: JobRecord) -> dict[str, float]:
    """What one job knows of itself without a baseline, under short names for the runs table.

    ``weights_gib``: the checkpoint's weight bytes / 2**30; ``<task>.<metric>``: each task's headline metric
    (``headline_metric``, else the config's ``eval.headline``) as lm-eval reported it (``arc_easy.acc_norm``,
    ``wikitext.word_perplexity``); ``token_perplexity``; ``out_tok_s_max``: the highest output tok/s of the
    sweep's points (all users together); ``user_tok_s_low``: one user's output tok/s at the sweep's lowest load,
    ``1000 / TPOT p50`` (ms). Missing numbers are left out.
    """
    out: dict[str, float] = {}

    def put(name: str, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)

    ck = rec.memory.checkpoint
    if ck.total_weight_bytes:
        put("weights_gib", ck.total_weight_bytes / 2**30)
    headline = rec.headline()  # the config's pick, where the record names none
    for task, res in rec.accuracy.tasks.items():
        metric = res.metric("headline_metric") or (headline[task] if task in headline else None)
        if isinstance(metric, str):
            put(metric_name(f"{task}.{metric}"), res.metric(metric))
    put("token_perplexity", rec.accuracy.token_perplexity_section.token_perplexity)
    points = [p for p in rec.speed.points if p.output_tok_s is not None]
    if points:
        put("out_tok_s_max", max(float(p.output_tok_s or 0.0) for p in points))
    low = _lowest_load(rec.speed)
    tpot = getattr(low, "tpot_ms_p50", None) if low is not None else None
    if isinstance(tpot, (int, float)) and tpot > 0:
        put("user_tok_s_low", 1000.0 / tpot)
    return out


def _lowest_load(speed: Speed) -> Any:
    """The sweep point of the lowest load (concurrency, or offered rate with unlimited last), first repeat."""

    def load(p: Any) -> float:
        if speed.mode == "concurrency" and p.concurrency is not None:
            return float(p.concurrency)
        r = p.offered_rate_rps
        return math.inf if r is None or isinstance(r, str) else float(r)

    return min(speed.points, key=load) if speed.points else None


def _speed_by_label(speed: Speed) -> dict[str, Any]:
    """The speed section with its sweep points keyed by their load (``rate_4``, ``rate_inf``, ``conc_16``) instead
    of list position."""
    out: dict[str, Any] = {k: v for k, v in speed.to_dict().items() if k != "points"}
    for p in speed.points:
        if p.concurrency is not None and speed.mode == "concurrency":
            label = f"conc_{p.concurrency}"
        else:
            r = p.offered_rate_rps
            label = "rate_inf" if r is None or isinstance(r, str) or math.isinf(r) else f"rate_{r:g}"
        if p.repeat:
            label += f"_rep{p.repeat}"
        out[label] = {k: v for k, v in p.to_dict().items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return out
