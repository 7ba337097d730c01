"""The fidelity check's command (``pipelines.fidelity``, issue 16) without a GPU: which points a level filter
chooses (and the seed each keeps), ``--report-only`` on hand-made result files, and the comparison written
after every point. Only the server and the CLI processes are faked; the comparison runs as it does on the GPU.
Values worked out by hand in the comments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipelines import fidelity
from quantverdict.config.compose import as_dict, compose
from quantverdict.measure import sweep_plan
from quantverdict.processes.envs import StageEnv

IN_LEN, OUT_LEN, N = 256, 32, 8  # bench=cpu-concurrency: 256 in / 32 out, 8 prompts a point


def _result(out_tok_s: float, ttft_ms_p50: float = 20.0) -> dict[str, Any]:
    """A ``vllm bench serve`` result of N requests (no per-request lists) whose output throughput is
    ``out_tok_s``: N x 32 = 256 output tokens in 256 / out_tok_s seconds (100 tok/s: 2.56 s)."""
    duration = N * OUT_LEN / out_tok_s
    return {
        "completed": N,
        "failed": 0,
        "num_prompts": N,
        "duration": duration,
        "total_input_tokens": N * IN_LEN,
        "total_output_tokens": N * OUT_LEN,
        "request_throughput": N / duration,
        "output_throughput": out_tok_s,
        "total_token_throughput": N * (IN_LEN + OUT_LEN) / duration,
        "median_ttft_ms": ttft_ms_p50,
        "p50_ttft_ms": ttft_ms_p50,
    }


def _record(tmp_path: Path, job_tok_s: dict[str, float], *overrides: str, seeds: bool = False) -> Path:
    """A finished job's record.json: bench=cpu-concurrency (c = 1, 4) and its points' output tok/s."""
    cfg = compose(["bench=cpu-concurrency", *overrides])
    points = [
        {"point": name, "num_prompts": N, "output_tok_s": tok_s, "ttft_ms_p50": 20.0}
        | ({"seed": 100 + i} if seeds else {})
        for i, (name, tok_s) in enumerate(job_tok_s.items())
    ]
    record = {
        "config": as_dict(cfg),
        "checkpoint": {"path": str(tmp_path / "ckpt")},
        "speed": {"points": points, "served_model": "m"},
    }
    job = tmp_path / "job"
    job.mkdir(exist_ok=True)
    (job / "record.json").write_text(json.dumps(record))
    return job / "record.json"


# --- which points: level filters -----------------------------------------------------------------------------


def test_level_filters_keep_the_seed_of_the_full_plan() -> None:
    bench = compose(["bench=gpu-concurrency"]).bench  # c = 1, 16, 64, 256, 3 repeats: 12 points, seeds 1..12
    chosen = fidelity.choose(bench, {0}, {64, 256})
    # index = level x 3 + repeat: conc-64_r0 is the 7th point (index 6), conc-256_r0 the 10th (index 9)
    assert [(i, p.name) for i, p in chosen] == [(6, "conc-64_r0"), (9, "conc-256_r0")]
    assert [sweep_plan.point_seed(bench.seed, i) for i, _ in chosen] == [7, 10]  # the H200 job's seeds of them
    assert [(i, p.name) for i, p in fidelity.choose(bench, {1}, {16})] == [(4, "conc-16_r1")]
    assert len(fidelity.choose(bench)) == 12 and len(fidelity.choose(bench, None, {1})) == 3
    rate = compose(["bench=cpu"]).bench  # rates 1, inf; 1 repeat
    assert [(i, p.name) for i, p in fidelity.choose(rate, rates={sweep_plan.INF})] == [(1, "rate-inf_r0")]
    assert [p.name for _, p in fidelity.choose(rate, rates={1.0})] == ["rate-1_r0"]


def test_an_unknown_level_names_the_flag_and_the_levels_the_job_ran() -> None:
    bench = compose(["bench=gpu-concurrency"]).bench
    with pytest.raises(ValueError, match=r"^--concurrency 32: the job ran concurrency 1, 16, 64, 256$"):
        fidelity.choose(bench, concurrencies={32, 64})
    with pytest.raises(ValueError, match=r"--rate 4: the job ran a concurrency sweep \(concurrency 1, 16, 64, 256\)"):
        fidelity.choose(bench, rates={4.0})
    with pytest.raises(ValueError, match=r"--repeat 3: the job ran repeats \[0, 1, 2\] of each level; --concurrency"):
        fidelity.choose(bench, {3}, {8})  # both problems in one message
    rate = compose(["bench=cpu"]).bench
    with pytest.raises(ValueError, match=r"^--rate 2: the job ran rates 1, inf req/s$"):
        fidelity.choose(rate, rates={2.0})
    with pytest.raises(
        ValueError, match=r"--concurrency 4: the job ran a rate sweep \(rates 1, inf req/s\); use --rate"
    ):
        fidelity.choose(rate, concurrencies={4})


def test_unknown_level_stops_the_command_before_any_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_env(*_: Any, **__: Any) -> None:
        raise AssertionError("no environment or server before the levels are checked")

    monkeypatch.setattr(fidelity.envs, "ensure", no_env)
    record = _record(tmp_path, {"conc-1_r0": 100.0, "conc-4_r0": 400.0})
    assert fidelity.main([str(record), "--concurrency", "4", "--concurrency", "16"]) == 2
    assert "--concurrency 16: the job ran concurrency 1, 4" in capsys.readouterr().err
    assert fidelity.main([str(record), "--rate", "inf"]) == 2
    assert "use --concurrency" in capsys.readouterr().err
    assert fidelity.main([str(record), "--repeat", "1", "--report-only"]) == 2  # one repeat: only 0
    assert "--repeat 1: the job ran repeats [0] of each level" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse: not a rate
        fidelity.main([str(record), "--rate", "fast"])
    assert exc.value.code == 2
    assert not (tmp_path / "job" / "fidelity").exists()


# --- --report-only ----------------------------------------------------------------------------------------


def test_report_only_rebuilds_the_comparison_from_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fidelity, "VLLMServer", None)  # no server in this mode
    record = _record(tmp_path, {"conc-1_r0": 102.0, "conc-4_r0": 90.0})
    out = tmp_path / "job" / "fidelity"
    out.mkdir()
    (out / "conc-1_r0.json").write_text(json.dumps(_result(100.0)))
    (out / "conc-1_r0.checks.json").write_text(json.dumps({"prefix_cache_hit_rate": 0.0, "server_invalid_reasons": []}))
    (out / "warmup").mkdir()
    (out / "warmup" / "conc-4_r0.json").write_text(json.dumps(_result(50.0)))  # a warm-up: never read

    # only c=1 by hand: 102 vs 100 -> |102 - 100| / 100 = 2.0%, within 5%; c=4 not run (a stopped run)
    assert fidelity.main([str(record), "--report-only"]) == 0
    text = capsys.readouterr().out
    assert "| conc-1_r0 | 102.0 | 100.0 | 2.0% | 20 | 20 | 0.00% |" in text
    assert "1 of 2 chosen points compared; no by-hand result: conc-4_r0" in text
    doc = json.loads((out / "fidelity.json").read_text())
    assert doc["complete"] is False and [r["point"] for r in doc["rows"]] == ["conc-1_r0"]
    assert doc["rows"][0]["rel_diff"] == pytest.approx(0.02) and doc["rows"][0]["within"] is True
    assert doc["by_hand"][0]["output_tok_s"] == 100.0 and doc["by_hand"][0]["num_prompts"] == N

    # c=4 by hand as well, no checks file: 90 vs 100 -> 10%, outside 5% -> exit 1; its hit rate "-"
    (out / "conc-4_r0.json").write_text(json.dumps(_result(100.0)))
    assert fidelity.main([str(record), "--report-only"]) == 1
    captured = capsys.readouterr()
    assert "| conc-4_r0 | 90.0 | 100.0 | 10.0% **> 5%** | 20 | 20 | - |" in captured.out
    assert "outside +-5%: conc-4_r0" in captured.err
    doc = json.loads((out / "fidelity.json").read_text())
    assert doc["complete"] is True and [r["within"] for r in doc["rows"]] == [True, False]
    assert doc["rows"][1]["rel_diff"] == pytest.approx(0.10) and doc["rows"][1]["by_hand_hit_rate"] is None

    # a level filter reads only its points: c=1 alone, within
    assert fidelity.main([str(record), "--report-only", "--concurrency", "1"]) == 0
    assert json.loads((out / "fidelity.json").read_text())["complete"] is True  # the one chosen point is there


def test_report_only_without_a_matching_file_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = _record(tmp_path, {"conc-1_r0": 102.0, "conc-4_r0": 90.0})
    out = tmp_path / "elsewhere"
    out.mkdir()
    (out / "rate-1_r0.json").write_text(json.dumps(_result(100.0)))  # not a point of this job
    assert fidelity.main([str(record), "--report-only", "--out", str(out)]) == 2
    assert "no by-hand result of a point the job ran (looked for conc-1_r0.json, conc-4_r0.json)" in (
        capsys.readouterr().err
    )
    assert not (out / "fidelity.json").exists()
    (out / "conc-1_r0.json").write_text('{"completed": 8, "dur')  # cut off mid-write
    assert fidelity.main([str(record), "--report-only", "--out", str(out)]) == 2
    assert "conc-1_r0.json: not a vLLM bench result" in capsys.readouterr().err


# --- a run: the comparison written after every point -------------------------------------------------------


class FakeServer:
    """The server's part: counters that the fake CLI advances by its point's tokens; no process."""

    instances: list[FakeServer] = []

    def __init__(self, *_: Any, **__: Any) -> None:
        self.base_url, self.served_model_name = "http://127.0.0.1:9", "m"
        self.started = self.stopped = False
        self.totals = {"vllm:prefix_cache_queries": 0.0, "vllm:prefix_cache_hits": 0.0, "vllm:prompt_tokens": 0.0}
        self.totals |= {"vllm:generation_tokens": 0.0, "vllm:num_preemptions": 0.0}
        FakeServer.instances.append(self)

    def __enter__(self) -> FakeServer:
        self.started = True
        return self

    def __exit__(self, *_: Any) -> None:
        self.stopped = True

    def reset_prefix_cache(self) -> bool:
        return True

    def counters(self) -> dict[str, float]:
        return dict(self.totals)


def _fake_cli(tok_s: dict[str, float], fail: set[str], calls: list[list[str]]) -> Any:
    """``subprocess.run`` for ``vllm bench serve``: writes the point's result (``tok_s``), counts its tokens on
    the server; exits 1 at a point in ``fail``."""

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        arg = {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1)}
        name = arg["--result-filename"].removesuffix(".json")
        if Path(arg["--result-dir"]).name == "warmup":
            return subprocess.CompletedProcess(cmd, 0, "", "")
        if name in fail:
            return subprocess.CompletedProcess(cmd, 1, "", "RuntimeError: Server disconnected")
        Path(arg["--result-dir"], arg["--result-filename"]).write_text(json.dumps(_result(tok_s[name])))
        totals = FakeServer.instances[-1].totals  # every prompt token looked up, none served from the cache
        totals["vllm:prefix_cache_queries"] += N * IN_LEN
        totals["vllm:prompt_tokens"] += N * IN_LEN
        totals["vllm:generation_tokens"] += N * OUT_LEN
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


@pytest.fixture
def fake_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeServer.instances.clear()
    monkeypatch.setattr(fidelity.envs, "ensure", lambda *_, **__: StageEnv("serve", sys.executable))
    monkeypatch.setattr(fidelity, "supported_optional_flags", lambda _: frozenset())
    monkeypatch.setattr(fidelity, "VLLMServer", FakeServer)
    monkeypatch.setattr(fidelity, "COUNTER_SETTLE_S", 0.0)


@pytest.mark.usefixtures("fake_processes")
def test_a_point_that_fails_leaves_the_finished_ones_compared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = _record(tmp_path, {"conc-1_r0": 102.0, "conc-4_r0": 400.0})
    calls: list[list[str]] = []
    monkeypatch.setattr(fidelity.subprocess, "run", _fake_cli({"conc-1_r0": 100.0}, {"conc-4_r0"}, calls))
    with pytest.raises(RuntimeError, match="vllm bench serve failed at conc-4_r0"):
        fidelity.main([str(record)])
    out = tmp_path / "job" / "fidelity"
    doc = json.loads((out / "fidelity.json").read_text())
    assert doc["complete"] is False and "RuntimeError after 1 of 2 points" in doc["error"]
    (row,) = doc["rows"]  # the first point: 102 vs 100, 2.0%, within
    assert row["point"] == "conc-1_r0" and row["rel_diff"] == pytest.approx(0.02) and row["within"] is True
    assert row["by_hand_hit_rate"] == 0.0  # 2,048 tokens looked up, none served from the cache
    checks = json.loads((out / "conc-1_r0.checks.json").read_text())
    assert checks["prefix_cache_queries"] == 2048 and checks["prompt_tokens_rel_diff"] == 0.0
    assert checks["server_invalid_reasons"] == [] and not (out / "conc-4_r0.checks.json").exists()
    (server,) = FakeServer.instances
    assert server.started and server.stopped


@pytest.mark.usefixtures("fake_processes")
def test_a_filtered_run_sends_the_full_plans_seed_and_writes_after_each_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # c = 1, 4 with 2 repeats, base seed 10: conc-1_r0, conc-1_r1, conc-4_r0, conc-4_r1 -> seeds 11..14
    record = _record(tmp_path, {"conc-1_r1": 100.0, "conc-4_r1": 380.0}, "bench.repeats=2", "bench.seed=10")
    calls: list[list[str]] = []
    seen: list[bool] = []
    monkeypatch.setattr(fidelity.subprocess, "run", _fake_cli({"conc-1_r1": 100.0, "conc-4_r1": 400.0}, set(), calls))
    write = fidelity.write_report

    def spy(out: Path, rows: list[dict[str, Any]], by_hand: list[dict[str, Any]], complete: bool, **kw: Any) -> Path:
        seen.append(complete)
        return write(out, rows, by_hand, complete, **kw)

    monkeypatch.setattr(fidelity, "write_report", spy)
    # 380 vs 400: |380 - 400| / 400 = 5.0%, within (<=); 100 vs 100: 0%
    assert fidelity.main([str(record), "--repeat", "1"]) == 0
    measured = [c for c in calls if Path(c[c.index("--result-dir") + 1]).name != "warmup"]
    assert [c[c.index("--seed") + 1] for c in measured] == ["12", "14"]  # indices 1 and 3 of the full plan
    warm = [c for c in calls if c not in measured]
    assert [c[c.index("--seed") + 1] for c in warm] == ["1000010", "1000010"]  # one warm-up a level
    assert seen == [False, False, True]  # after each point, then the whole
    doc = json.loads((tmp_path / "job" / "fidelity" / "fidelity.json").read_text())
    assert doc["complete"] is True and doc["rows"][1]["rel_diff"] == pytest.approx(0.05)

    # --concurrency 4 alone: conc-4_r0 and conc-4_r1, seeds 13 and 14 of the plan
    tok_s = {"conc-4_r0": 400.0, "conc-4_r1": 400.0}
    monkeypatch.setattr(fidelity.subprocess, "run", _fake_cli(tok_s, set(), calls))
    for seeds, want in ((False, ["13", "14"]), (True, ["100", "101"])):  # the record's own seeds win when given
        calls.clear()
        record = _record(tmp_path, tok_s, "bench.repeats=2", "bench.seed=10", seeds=seeds)
        assert fidelity.main([str(record), "--concurrency", "4"]) == 0
        measured = [c for c in calls if Path(c[c.index("--result-dir") + 1]).name != "warmup"]
        assert [c[c.index("--seed") + 1] for c in measured] == want
