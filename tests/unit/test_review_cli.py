"""`python -m pipelines.review` on a folder, and the end-of-grid review (an MLflow experiment as the
source: tests/integration/test_mlflow_store.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pipelines.review import compose_review, main
from quantverdict.config.schema import ConfigError, ReviewConfig, TrackingConfig
from quantverdict.orchestrate.hydra_callbacks import GridSummary, run_grid_review
from review_records import grid


def write_grid(root: Path, records: list[dict], uri: str = "") -> Path:
    for rec in records:
        d = root / f"m_{rec['job']['scheme']}"
        d.mkdir(parents=True)
        rec["job"]["output_dir"] = str(d)
        if uri:
            rec["config"]["tracking"] = {"name": "t", "enabled": True, "uri": uri, "experiment": "exp"}
        (d / "record.json").write_text(json.dumps(rec))
    return root


def test_compose_review_overrides_and_errors() -> None:
    rc, tracking, _ = compose_review(
        ["review.memory_budget_gib=0.2", "review.load_rps=null", "review.load_concurrency=4"]
    )
    assert isinstance(rc, ReviewConfig) and rc.memory_budget_gib == 0.2 and rc.load_concurrency == 4
    assert isinstance(tracking, TrackingConfig)
    with pytest.raises(ConfigError, match="did you mean 'memory_budget_gib'"):
        compose_review(["review.memory_budgt_gib=1"])
    with pytest.raises(ConfigError, match="set only one of review.load_rps and review.load_concurrency"):
        compose_review(["review.load_concurrency=4"])
    with pytest.raises(ConfigError, match="only review"):
        compose_review(["bench.rates=[1]"])


def test_cli_on_a_folder_three_constraint_sets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_grid(tmp_path / "multirun", grid())
    outputs = tmp_path / "outputs"  # this checkout's paths.output_root
    assert main([str(src), "review.log_to_mlflow=false", f"paths.output_root={outputs}"]) == 0
    assert "Do not quantize: keep bf16 (BF16)." in capsys.readouterr().out
    # no device in these records: the gpu set; a new folder under the output root, named after the time, this
    # process and the set with its hash; nothing written next to the records
    (review_dir,) = (outputs / "reviews").iterdir()
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d_\d\d-\d\d-\d\d-{os.getpid()}_gpu-[0-9a-f]{{8}}", review_dir.name)
    assert sorted(p.name for p in src.iterdir()) == sorted(f"m_{r['job']['scheme']}" for r in grid())
    for name in (
        "review.md",
        "review.html",
        "review.json",
        "plots/memory.png",
        "plots/accuracy.png",
        "plots/speed_ratio.png",
        "plots/pareto.png",
        "plots/latency.png",
    ):
        assert (review_dir / name).is_file(), name
    assert json.loads((review_dir / "review.json").read_text())["verdicts"][0]["decision"] == "do not quantize"
    out = tmp_path / "tight"
    assert main([str(src), "review.memory_budget_gib=0.22", "review.log_to_mlflow=false", "--out", str(out)]) == 0
    assert "Deploy gptq (W4A16)." in capsys.readouterr().out
    assert "**Deploy gptq (W4A16).**" in (out / "review.md").read_text()
    # a third constraint set (strict accuracy floor) is in test_review_verdict: same code path after composing


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing" / "dir")]) == 2
    assert main([str(tmp_path)]) == 2  # a folder without records
    assert "no record.json" in capsys.readouterr().err


def test_grid_summary_runs_the_review(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = grid()
    records[-1]["status"], records[-1]["failed_stage"] = "failed", "benchmark"
    src = write_grid(tmp_path / "multirun", records)
    cfg = OmegaConf.create(
        {
            "hydra": {"sweep": {"dir": str(src)}},
            "review": OmegaConf.structured(ReviewConfig(log_to_mlflow=False, memory_budget_gib=0.22)),
            "tracking": OmegaConf.structured(TrackingConfig(name="t", enabled=False, uri="", experiment="x")),
        }
    )
    assert run_grid_review(cfg, src)
    assert "Deploy gptq (W4A16)." in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:  # one job failed: the grid still fails
        GridSummary().on_multirun_end(cfg)
    assert exc.value.code == 1
    assert (src / "table.md").is_file() and (src / "review" / "review.md").is_file()


def test_overrides_may_follow_out(tmp_path: Path) -> None:
    # a new user wrote the overrides after --out and got "unrecognized arguments"
    folder = write_grid(tmp_path / "grid", grid())
    out = tmp_path / "rev"
    main([str(folder), "--out", str(out), "review.log_to_mlflow=false", "review.concurrent_requests=64"])
    assert "| review.concurrent_requests | 64 | **set** (gpu.yaml: 16) |" in (out / "review.md").read_text()


def test_a_mapping_key_composes_with_or_without_plus() -> None:
    # the review's header prints "review.gpu_price_per_hour={H200: 3.5}" (no '+'): pasted back, it must compose
    for o in ("review.gpu_price_per_hour={H200: 3.5}", "+review.gpu_price_per_hour={H200: 3.5}"):
        rc, _, _ = compose_review([o])
        assert dict(rc.gpu_price_per_hour) == {"H200": 3.5}
    rc, _, _ = compose_review([])
    assert dict(rc.gpu_price_per_hour) == {}
