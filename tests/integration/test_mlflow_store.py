"""Real sqlite MLflow stores (written under tmp_path): one run per job, finished and failed, its stages as tags and
metrics of that run, and the review logged as its own run with the verdict as tags (the job runs stay top-level,
tagged with the grid and the verdict and given the three numbers under short names) and read back from the
experiment. Needs only the orchestrator environment, no stage child. Also: a job interrupted by Ctrl-C ends its one
MLflow run KILLED, a failed one FAILED, and a job refused before any work makes no run at all."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipelines.review import main
from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError, ReviewConfig, TrackingConfig
from quantverdict.orchestrate import hardware
from quantverdict.orchestrate.job import run_job
from quantverdict.processes import procs
from quantverdict.results.record import JobRecord
from quantverdict.results.tracking import Tracker
from quantverdict.review import build_review
from quantverdict.review.core import log_review, write_review
from review_records import KV_GIB_16x288, grid

pytestmark = pytest.mark.integration


def write_grid(root: Path, records: list[dict], uri: str) -> Path:
    """One folder per job with its record.json, tracked to ``uri``."""
    for rec in records:
        d = root / f"m_{rec['job']['scheme']}"
        d.mkdir(parents=True)
        rec["job"]["output_dir"] = str(d)
        rec["config"]["tracking"] = {"name": "t", "enabled": True, "uri": uri, "experiment": "exp"}
        (d / "record.json").write_text(json.dumps(rec))
    return root


def _record(status: str) -> dict:
    return {
        "config": {"model": {"name": "m"}, "scheme": {"name": "s", "recipe": {"x": 1}}},
        "memory": {"checkpoint": {"total_weight_bytes": 3 * 2**29}},  # 1.5 GiB
        "accuracy": {"tasks": {"arc_easy": {"acc": 0.5, "acc_norm": 0.55, "headline_metric": "acc_norm"}}},
        "speed": {
            "mode": "rate",
            "points": [  # listed unlimited rate first: the lowest load is found by its rate, not its place
                {"offered_rate_rps": None, "output_tok_s": 30.0, "tpot_ms_p50": 50.0},
                {"offered_rate_rps": 1.0, "output_tok_s": 10.0, "tpot_ms_p50": 25.0},
            ],
        },
        "status": status,
        "failed_stage": None if status == "ok" else "quantize",
        "error": None if status == "ok" else "RuntimeError: boom",
    }


def test_real_store_finished_and_failed_runs(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = TrackingConfig(name="t", uri=uri, experiment="exp", artifact_location=str(tmp_path / "artifacts"))
    artifact = tmp_path / "record.json"
    artifact.write_text("{}")
    for status in ("ok", "failed"):
        tr = Tracker(cfg)
        tr.start(f"m/{status}", {"scheme": status})
        tr.stage("preflight", "ok", 0.25)  # before the run is open: kept, logged when it opens
        tr.open()
        tr.stage("quantize", "ok" if status == "ok" else "failed", 1.5)
        tr.finish(_record(status), tmp_path, [artifact])
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("exp")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"m/ok", "m/failed"}  # one run per job: no stage runs
    assert runs["m/ok"].info.status == "FINISHED"
    assert runs["m/failed"].info.status == "FAILED"
    failed = runs["m/failed"].data.tags
    assert failed["quantverdict.error"] == "RuntimeError: boom" and failed["quantverdict.status"] == "failed"
    assert failed["mlflow.note.content"] == "failed in stage quantize: RuntimeError: boom"
    assert failed["stage.quantize"] == "failed"
    ok = runs["m/ok"].data
    assert ok.tags["quantverdict.status"] == "ok" and "mlflow.note.content" not in ok.tags
    assert ok.metrics["memory.checkpoint.total_weight_bytes"] == 3 * 2**29
    assert ok.metrics["accuracy.tasks.arc_easy.acc_norm"] == 0.55
    assert ok.metrics["speed.rate_1.output_tok_s"] == 10.0
    assert ok.metrics["speed.rate_inf.output_tok_s"] == 30.0
    # the stages: status as a tag, wall time (s) as a metric of the job's run
    assert (ok.tags["stage.preflight"], ok.tags["stage.quantize"]) == ("ok", "ok")
    assert (ok.metrics["stage.preflight.wall_s"], ok.metrics["stage.quantize.wall_s"]) == (0.25, 1.5)
    # the job's own numbers under short names: 3 * 2**29 bytes = 1.5 GiB; arc_easy's headline acc_norm; the
    # highest output tok/s of the two points (30); one user at the lowest load, 1 req/s: 1000 / 25 ms = 40 tok/s
    assert ok.metrics["weights_gib"] == 1.5
    assert ok.metrics["arc_easy.acc_norm"] == 0.55
    assert ok.metrics["out_tok_s_max"] == 30.0
    assert ok.metrics["user_tok_s_low"] == 40.0
    assert ok.params["model.name"] == "m" and "scheme.recipe.x" not in ok.params
    # nothing left running
    assert all(r.info.status != "RUNNING" for r in runs.values())
    # the runs table of runs_page shows the status and the three numbers (a shared view stored on the experiment)
    view = json.loads(exp.tags["mlflow.sharedViewState.quantverdict-runs"])
    assert view["selectedColumns"][:4] == [
        "tags.`quantverdict.status`",
        "metrics.`mem_gib`",
        "metrics.`acc_delta`",
        "metrics.`speed_ratio_c1`",
    ]
    assert [a.path for a in client.list_artifacts(runs["m/ok"].info.run_id)] == ["config.yaml", "record.json"]


def test_review_run_job_numbers_and_experiment_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # artifacts under tmp_path (MLflow's default root is ./mlruns in the working directory)
    MlflowClient(tracking_uri=uri).create_experiment("exp", artifact_location=(tmp_path / "artifacts").as_uri())
    three = [r for r in grid() if r["job"]["scheme"] in ("bf16", "int8", "gptq")]
    src = write_grid(tmp_path / "multirun", three, uri)
    # the job runs, as quantverdict.orchestrate.job logs them (record.json artifact, output_dir tag)
    for d in sorted(src.iterdir()):
        rec = json.loads((d / "record.json").read_text())
        tr = Tracker(TrackingConfig(name="t", uri=uri, experiment="exp"))
        tr.start(
            f"m/{rec['job']['scheme']}",
            {"model": "m", "scheme": rec["job"]["scheme"], "config_hash": "x", "output_dir": str(d)},
        )
        tr.finish(rec, d, [d / "record.json"])
    client = MlflowClient(tracking_uri=uri)
    # an earlier review nested the gptq job under itself (as reviews did before the job runs stayed top-level)
    old_exp = client.get_experiment_by_name("exp").experiment_id
    old = client.create_run(old_exp, run_name="review/old", tags={"quantverdict.kind": "review"}).info.run_id
    client.set_terminated(old)
    gptq_run = next(r for r in client.search_runs([old_exp]) if r.data.tags.get("scheme") == "gptq").info.run_id
    client.set_tag(gptq_run, "mlflow.parentRunId", old)
    # into the store it is given (the records name the same one here), written under paths.output_root
    assert main([str(src), f"tracking.uri={uri}", "tracking.experiment=exp", f"paths.output_root={tmp_path}"]) == 0
    exp = client.get_experiment_by_name("exp")
    runs = client.search_runs([exp.experiment_id])
    reviews = [r for r in runs if r.data.tags.get("quantverdict.kind") == "review" and r.info.run_name != "review/old"]
    assert len(reviews) == 1
    rid = reviews[0].info.run_id
    assert reviews[0].info.status == "FINISHED"
    assert reviews[0].data.params["review.memory_budget_gib"] == "24.0"
    arts = {a.path for a in client.list_artifacts(rid)}
    assert {"review.md", "review.html", "review.json", "plots"} <= arts
    # the plots as written beside review.md (speed ratio, Pareto, memory, accuracy, latency)
    figs = {a.path for a in client.list_artifacts(rid, "plots")}
    assert figs == {f"plots/{n}.png" for n in ("speed_ratio", "pareto", "memory", "accuracy", "latency")}
    # the experiment opens on its runs in MLflow's UI (a model-training experiment)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    # each job a top-level run with the grid as a tag and the three numbers under short names
    jobs = {r.data.tags["scheme"]: r for r in runs if "config_hash" in r.data.tags}
    assert set(jobs) == {"bf16", "int8", "gptq"}
    assert all("mlflow.parentRunId" not in r.data.tags for r in jobs.values())
    assert all(r.data.tags["quantverdict.grid"] == str(src) for r in jobs.values())
    assert all(r.data.tags["quantverdict.review"] == rid for r in jobs.values())
    # review_records.grid, gpu set (16 requests x 288 tokens: KV 0.098877 GiB): gptq weights 0.10 GiB ->
    # 0.198877 GiB; word perplexity 21.0 / 20.0 - 1 = +5.0% (token: 41.6 / 40 = +4.0%, not the worst);
    # per-user speed at 1 req/s: TPOT 40 / 25 ms = 1.6x (the stated load 1 req/s is that point too)
    g = jobs["gptq"].data
    assert g.metrics["mem_gib"] == pytest.approx(0.10 + KV_GIB_16x288)
    assert g.metrics["acc_delta"] == pytest.approx(5.0)
    assert g.tags["acc_delta_metric"] == "word_perplexity change (%)"
    assert g.metrics["speed_ratio_c1"] == pytest.approx(1.6) and g.metrics["speed_ratio_load"] == pytest.approx(1.6)
    # the verdict: on the review's run (memory budget 24 GiB: every scheme fits, bf16 is kept), and on each job's
    review_tags = reviews[0].data.tags
    assert review_tags["verdict"] == "m: do not quantize" and review_tags["verdict.m"] == "do not quantize"
    assert review_tags["verdict.m.scheme"] == "bf16" and review_tags["verdict.m.sentence"]
    assert {s: r.data.tags["verdict.chosen"] for s, r in jobs.items()} == {"bf16": "yes", "int8": "no", "gptq": "no"}
    assert all(r.data.tags["verdict"] == "do not quantize" for r in jobs.values())
    b = jobs["bf16"].data
    assert b.metrics["mem_gib"] == pytest.approx(0.25 + KV_GIB_16x288) and "acc_delta" not in b.metrics
    capsys.readouterr()
    # the same grid, read back from the experiment
    out = tmp_path / "from-mlflow"
    assert (
        main(
            [
                "mlflow:exp",
                f"tracking.uri={uri}",
                "tracking.experiment=exp",
                "review.memory_budget_gib=0.22",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "Deploy gptq (W4A16)." in capsys.readouterr().out
    assert (out / "review.html").is_file()


def test_interrupted_job_is_recorded_interrupted_and_its_mlflow_run_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def ctrl_c(cuda_visible_devices: str | None = None) -> list:
        raise procs.Interrupted(signal.SIGINT)

    monkeypatch.setattr(hardware, "gpu_info", ctrl_c)  # Ctrl-C in the first stage of a cuda job
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = compose(["env=gpu", "scheme=fp8", f"tracking.uri={uri}", f"paths.output_root={tmp_path}"])
    with pytest.raises(KeyboardInterrupt):
        run_job(cfg, tmp_path / "job")
    rec = json.loads((tmp_path / "job" / "record.json").read_text())
    assert rec["status"] == "interrupted" and rec["failed_stage"] == "gpu_check"
    assert rec["error"] == "interrupted by SIGINT" and rec["traceback"] is None
    assert rec["stages"]["gpu_check"]["status"] == "interrupted"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    (run,) = client.search_runs([exp.experiment_id])  # the job's one run
    assert (run.info.run_name, run.info.status) == ("smollm2-135m/fp8", "KILLED")
    # MLflow draws KILLED with FAILED's icon: the status tag and the description tell them apart
    assert run.data.tags["quantverdict.status"] == "interrupted" and run.data.tags["stage.gpu_check"] == "interrupted"
    assert run.data.tags["mlflow.note.content"].startswith("interrupted by SIGINT in stage gpu_check: stopped from")


@pytest.mark.parametrize(
    ("error", "run_status"),
    [(ConfigError("this machine cannot run the job"), None), (RuntimeError("nvidia-smi crashed"), "FAILED")],
)
def test_a_job_refused_before_any_work_makes_no_run_and_a_failed_one_a_failed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, run_status: str | None
) -> None:
    def fails(cuda_visible_devices: str | None = None) -> list:
        raise error

    monkeypatch.setattr(hardware, "gpu_info", fails)  # in the first stage of a cuda job, gpu_check
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = compose(["env=gpu", "scheme=fp8", f"tracking.uri={uri}", f"paths.output_root={tmp_path}"])
    with pytest.raises(type(error)):
        run_job(cfg, tmp_path / "job")
    rec = json.loads((tmp_path / "job" / "record.json").read_text())
    assert (rec["status"], rec["failed_stage"]) == ("failed", "gpu_check")
    if run_status is None:  # bad input for this machine: the store is not even made
        assert not (tmp_path / "mlflow.db").exists()
        return
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.tracking.experiment).experiment_id])
    assert run.info.status == run_status and run.data.tags["stage.gpu_check"] == "failed"


def test_mlflow_run_is_named_after_the_constraints(tmp_path: Path) -> None:
    """The review's MLflow run is named after its constraint set (review/<set>-<hash>): two budgets, two names."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(tracking_uri=uri).create_experiment("exp", artifact_location=(tmp_path / "a").as_uri())
    trk = TrackingConfig(name="t", enabled=True, uri=uri, experiment="exp")
    names = set()
    for budget in (24.0, 0.22):
        review = build_review(
            grid(), ReviewConfig(log_to_mlflow=False, bootstrap_samples=1000, memory_budget_gib=budget, name="gpu"), "t"
        )
        records = [JobRecord.view(r) for r in grid()]
        rid = log_review(review, write_review(review, tmp_path / str(budget)), trk, records)
        names.add(MlflowClient(tracking_uri=uri).get_run(rid).info.run_name)
    assert len(names) == 2 and all(re.fullmatch(r"review/gpu-[0-9a-f]{8}", n) for n in names)
