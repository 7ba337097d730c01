"""The fidelity check's command (``tools.bench.fidelity``) without a GPU: which points a level filter
chooses (and the seed each keeps; only points the job ran), ``--report-only`` on hand-made result files
(unreadable ones skipped, an earlier error kept), the comparison written after every point, an earlier run's
files of the chosen points removed, exit code 3 for a run stopped on an error. Only the server and the CLI
processes are faked; the comparison runs as it does on the GPU. Values worked out by hand in the comments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from quantverdict.config.compose import as_dict, compose
from quantverdict.measure import sweep_plan
from quantverdict.processes.envs import StageEnv
from quantverdict.results.record import SweepPoint
from tools.bench import fidelity

IN_LEN, OUT_LEN, N = 256, 32, 8  # bench=cpu-concurrency: 256 in / 32 out, 8 prompts a point


def point(data: dict[str, Any]) -> SweepPoint:
    """A job's sweep point as its record types it."""
    return SweepPoint.model_validate(data)


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


def _record(
    tmp_path: Path, job_tok_s: dict[str, float], *overrides: str, seeds: bool = False, repeats: int | None = None
) -> Path:
    """A finished job's record.json: bench=cpu-concurrency (c = 1, 4) and its points' output tok/s (``seeds``:
    each point's seed, 100 + its index; ``repeats``: the prompt tokens that repeat inside each point)."""
    cfg = compose(["env=cpu", "bench=cpu-concurrency", *overrides])  # env given: no GPU lookup under the fake run
    points = [
        {"point": name, "num_prompts": N, "output_tok_s": tok_s, "ttft_ms_p50": 20.0}
        | ({"seed": 100 + i} if seeds else {})
        | ({"prompt_repeat_tokens": repeats, "input_tokens_total": N * IN_LEN} if repeats is not None else {})
        for i, (name, tok_s) in enumerate(job_tok_s.items())
    ]
    record = {
        "schema_version": 3,
        "tool": {"name": "quantverdict"},
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


def test_only_the_points_the_job_ran_are_chosen() -> None:
    bench = compose(["bench=gpu-concurrency"]).bench  # c = 1, 16, 64, 256, 3 repeats: 12 points
    cut = {"conc-1_r0", "conc-1_r1", "conc-1_r2", "conc-16_r0"}  # a job stopped after its 4th point
    assert [(i, p.name) for i, p in fidelity.choose(bench, ran=cut)] == [
        (0, "conc-1_r0"), (1, "conc-1_r1"), (2, "conc-1_r2"), (3, "conc-16_r0"),
    ]  # fmt: skip
    # --repeat 0: one point per level the job ran, seeds of the full plan (base 0 + 1 + index: 1 and 4)
    chosen = fidelity.choose(bench, {0}, ran=cut)
    assert [(i, p.name, sweep_plan.point_seed(bench.seed, i)) for i, p in chosen] == [
        (0, "conc-1_r0", 1), (3, "conc-16_r0", 4),
    ]  # fmt: skip
    assert fidelity.choose(bench, ran={p.name for _, p in fidelity.choose(bench)}) == fidelity.choose(bench)
    ran = r"the job ran concurrency 1 \(repeats 0, 1, 2\), 16 \(repeat 0\)$"
    with pytest.raises(ValueError, match=rf"^--concurrency 64: {ran}"):  # in the plan, never run
        fidelity.choose(bench, concurrencies={16, 64}, ran=cut)
    # repeat 1 ran (at c=1) and c=16 ran (repeat 0), but not together: one message names both flags
    with pytest.raises(ValueError, match=rf"^--repeat 1 at --concurrency 16: {ran}"):
        fidelity.choose(bench, {1}, {16}, ran=cut)
    # each value selects a point the job ran; conc-16_r1 (never run) is left out as with no filter at all
    assert [p.name for _, p in fidelity.choose(bench, {0, 1}, {1, 16}, ran=cut)] == [
        "conc-1_r0", "conc-1_r1", "conc-16_r0",
    ]  # fmt: skip
    with pytest.raises(ValueError, match=rf"^--concurrency 16 at --repeat 1 2: {ran}"):
        fidelity.choose(bench, {1, 2}, {1, 16}, ran=cut)  # c=1 has repeats 1 and 2; c=16 neither
    assert [p.name for _, p in fidelity.choose(bench, {0, 1}, {1}, ran=cut)] == ["conc-1_r0", "conc-1_r1"]
    rate = compose(["bench=cpu", "bench.repeats=2"]).bench  # rates 1, inf; 2 repeats
    cut_rate = {"rate-1_r0", "rate-1_r1", "rate-inf_r0"}
    assert [(i, p.name) for i, p in fidelity.choose(rate, {1}, ran=cut_rate)] == [(1, "rate-1_r1")]
    with pytest.raises(ValueError, match=r"^--repeat 1 at --rate inf: the job ran rates 1 \(repeats 0, 1\), inf "):
        fidelity.choose(rate, {1}, rates={sweep_plan.INF}, ran=cut_rate)
    with pytest.raises(ValueError, match=r"the record's points \(conc-1_r0\) are none of the job's plan \(rates 1"):
        fidelity.choose(rate, ran={"conc-1_r0"})


def _no_env(*_: Any, **__: Any) -> None:
    raise AssertionError("no environment or server before the levels are checked")


def test_unknown_level_stops_the_command_before_any_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fidelity.envs, "ensure", _no_env)
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


def test_a_level_the_cut_short_job_never_ran_stops_the_command_before_any_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fidelity.envs, "ensure", _no_env)
    record = _record(tmp_path, {"conc-1_r0": 100.0})  # the plan has c = 1 and 4; the job stopped after c=1
    for extra in ([], ["--report-only"]):
        assert fidelity.main([str(record), "--concurrency", "4", *extra]) == 2
        assert capsys.readouterr().err == "--concurrency 4: the job ran concurrency 1\n"  # from the record
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
    assert doc["chosen"] == ["conc-1_r0", "conc-4_r0"] and "error" not in doc
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

    # a level filter reads only its points: c=1 alone, within. "chosen" says which points the report covers
    # (complete: the one chosen point has its row); an earlier run's error (as a stopped run leaves it) is kept
    doc["error"] = "RuntimeError after 1 of 2 points: vllm bench serve failed at conc-4_r0"
    (out / "fidelity.json").write_text(json.dumps(doc))
    assert fidelity.main([str(record), "--report-only", "--concurrency", "1"]) == 0
    assert "kept the earlier run's error: RuntimeError after 1 of 2 points" in capsys.readouterr().err
    doc = json.loads((out / "fidelity.json").read_text())
    assert doc["chosen"] == ["conc-1_r0"] and doc["complete"] is True
    assert [r["point"] for r in doc["rows"]] == ["conc-1_r0"] and doc["rows"][0]["rel_diff"] == pytest.approx(0.02)
    assert doc["error"] == "RuntimeError after 1 of 2 points: vllm bench serve failed at conc-4_r0"


def test_report_only_without_a_matching_file_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = _record(tmp_path, {"conc-1_r0": 102.0, "conc-4_r0": 90.0})
    out = tmp_path / "elsewhere"
    out.mkdir()
    (out / "rate-1_r0.json").write_text(json.dumps(_result(100.0)))  # not a point of this job
    assert fidelity.main([str(record), "--report-only", "--out", str(out)]) == 2
    assert "no readable by-hand result of a point the job ran (looked for conc-1_r0.json, conc-4_r0.json)" in (
        capsys.readouterr().err
    )
    assert not (out / "fidelity.json").exists()
    (out / "conc-1_r0.json").write_text('{"completed": 8, "dur')  # cut off mid-write: the only file, nothing read
    assert fidelity.main([str(record), "--report-only", "--out", str(out)]) == 2
    assert f"skipped {out / 'conc-1_r0.json'}: not a vLLM bench result" in capsys.readouterr().err
    assert not (out / "fidelity.json").exists()


def test_report_only_skips_an_unreadable_point_and_reports_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = _record(tmp_path, {"conc-1_r0": 102.0, "conc-4_r0": 90.0})
    out = tmp_path / "job" / "fidelity"
    out.mkdir()
    (out / "conc-1_r0.json").write_text(json.dumps(_result(100.0)))
    (out / "conc-1_r0.checks.json").write_text('{"prefix_cache_hit_')  # cut off: the row stays, without checks
    (out / "conc-4_r0.json").write_text('{"completed": 8, "dur')  # cut off mid-write
    # c=1: 102 vs 100 -> 2.0%, within -> exit 0; c=4 skipped with a warning and listed as missing
    assert fidelity.main([str(record), "--report-only"]) == 0
    captured = capsys.readouterr()
    assert f"skipped {out / 'conc-4_r0.json'}: not a vLLM bench result (JSONDecodeError" in captured.err
    assert f"skipped {out / 'conc-1_r0.checks.json'}: not the server's checks (JSONDecodeError" in captured.err
    assert "| conc-1_r0 | 102.0 | 100.0 | 2.0% | 20 | 20 | - |" in captured.out
    assert "1 of 2 chosen points compared; no by-hand result: conc-4_r0 (unreadable)" in captured.out
    doc = json.loads((out / "fidelity.json").read_text())
    assert doc["complete"] is False and doc["chosen"] == ["conc-1_r0", "conc-4_r0"]
    assert [r["point"] for r in doc["rows"]] == ["conc-1_r0"] and doc["rows"][0]["by_hand_hit_rate"] is None

    (out / "conc-4_r0.json").write_text("[]")  # JSON, not a result: skipped alike
    assert fidelity.main([str(record), "--report-only"]) == 0
    assert f"skipped {out / 'conc-4_r0.json'}: not a vLLM bench result" in capsys.readouterr().err


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


def _fake_cli(tok_s: dict[str, float], fail: set[str], calls: list[list[str]], hits: int = 0) -> Any:
    """``subprocess.run`` for ``vllm bench serve``: writes the point's result (``tok_s``), counts its tokens on
    the server (``hits`` of them served from the prefix cache); exits 1 at a point in ``fail``."""

    def run(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        arg = {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1)}
        name = arg["--result-filename"].removesuffix(".json")
        if Path(arg["--result-dir"]).name == "warmup":
            return subprocess.CompletedProcess(cmd, 0, "", "")
        if name in fail:
            return subprocess.CompletedProcess(cmd, 1, "", "RuntimeError: Server disconnected")
        Path(arg["--result-dir"], arg["--result-filename"]).write_text(json.dumps(_result(tok_s[name])))
        totals = FakeServer.instances[-1].totals  # every prompt token looked up, `hits` served from the cache
        totals["vllm:prefix_cache_queries"] += N * IN_LEN
        totals["vllm:prefix_cache_hits"] += hits
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
def test_a_point_that_fails_leaves_the_finished_ones_compared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    record = _record(tmp_path, {"conc-1_r0": 102.0, "conc-4_r0": 400.0})
    calls: list[list[str]] = []
    monkeypatch.setattr(fidelity.subprocess, "run", _fake_cli({"conc-1_r0": 100.0}, {"conc-4_r0"}, calls))
    assert fidelity.main([str(record)]) == 3  # stopped on an error, not "a point outside the tolerance" (1)
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "RuntimeError: vllm bench serve failed at conc-4_r0" in err
    assert "stopped: RuntimeError after 1 of 2 points" in err.splitlines()[-1]
    out = tmp_path / "job" / "fidelity"
    doc = json.loads((out / "fidelity.json").read_text())
    assert doc["complete"] is False and "RuntimeError after 1 of 2 points" in doc["error"]
    assert doc["chosen"] == ["conc-1_r0", "conc-4_r0"]
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

    def spy(out: Path, rows: list[dict[str, Any]], by_hand: list[dict[str, Any]], chosen: list[str], **kw: Any) -> Path:
        path = write(out, rows, by_hand, chosen, **kw)
        seen.append(json.loads(path.read_text())["complete"])
        return path

    monkeypatch.setattr(fidelity, "write_report", spy)
    # 380 vs 400: |380 - 400| / 400 = 5.0%, within (<=); 100 vs 100: 0%
    assert fidelity.main([str(record), "--repeat", "1"]) == 0
    measured = [c for c in calls if Path(c[c.index("--result-dir") + 1]).name != "warmup"]
    assert [c[c.index("--seed") + 1] for c in measured] == ["12", "14"]  # indices 1 and 3 of the full plan
    warm = [c for c in calls if c not in measured]
    assert [c[c.index("--seed") + 1] for c in warm] == ["1000010", "1000010"]  # one warm-up a level
    # empty at the start; after each point (the second completes the two chosen); then the whole
    assert seen == [False, False, True, True]
    doc = json.loads((tmp_path / "job" / "fidelity" / "fidelity.json").read_text())
    assert doc["complete"] is True and doc["rows"][1]["rel_diff"] == pytest.approx(0.05)
    assert doc["chosen"] == ["conc-1_r1", "conc-4_r1"]

    # --concurrency 4 alone: conc-4_r0 and conc-4_r1, seeds 13 and 14 of the plan
    tok_s = {"conc-4_r0": 400.0, "conc-4_r1": 400.0}
    monkeypatch.setattr(fidelity.subprocess, "run", _fake_cli(tok_s, set(), calls))
    for seeds, want in ((False, ["13", "14"]), (True, ["100", "101"])):  # the record's own seeds win when given
        calls.clear()
        record = _record(tmp_path, tok_s, "bench.repeats=2", "bench.seed=10", seeds=seeds)
        assert fidelity.main([str(record), "--concurrency", "4"]) == 0
        measured = [c for c in calls if Path(c[c.index("--result-dir") + 1]).name != "warmup"]
        assert [c[c.index("--seed") + 1] for c in measured] == want


@pytest.mark.usefixtures("fake_processes")
def test_a_cut_short_job_is_checked_on_the_points_it_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = _record(tmp_path, {"conc-1_r0": 100.0})  # the plan has c = 1 and 4; the job stopped after c=1
    calls: list[list[str]] = []
    monkeypatch.setattr(fidelity.subprocess, "run", _fake_cli({"conc-1_r0": 104.0}, set(), calls))
    assert fidelity.main([str(record)]) == 0  # |100 - 104| / 104 = 3.8%, within
    measured = [c for c in calls if Path(c[c.index("--result-dir") + 1]).name != "warmup"]
    assert [c[c.index("--result-filename") + 1] for c in measured] == ["conc-1_r0.json"]  # no c=4 run
    doc = json.loads((tmp_path / "job" / "fidelity" / "fidelity.json").read_text())
    assert doc["chosen"] == ["conc-1_r0"] and doc["complete"] is True
    assert doc["rows"][0]["rel_diff"] == pytest.approx(4 / 104)


@pytest.mark.usefixtures("fake_processes")
def test_by_hand_points_without_a_job_point_are_named_and_nothing_compared_is_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # a guard behind choose(): here choose is made to ignore the record's points, so c=1 runs by hand
    # although the job never ran it
    choose = fidelity.choose
    monkeypatch.setattr(fidelity, "choose", lambda bench, r=None, c=None, q=None, ran=None: choose(bench, r, c, q))
    record = _record(tmp_path, {"conc-4_r0": 400.0})
    calls: list[list[str]] = []
    monkeypatch.setattr(fidelity.subprocess, "run", _fake_cli({"conc-1_r0": 100.0, "conc-4_r0": 400.0}, set(), calls))
    assert fidelity.main([str(record)]) == 0  # c=4: 400 vs 400, 0%
    captured = capsys.readouterr()
    assert "no job point to compare with (by hand only): conc-1_r0" in captured.err
    assert "| conc-4_r0 | 400.0 | 400.0 | 0.0% |" in captured.out
    doc = json.loads((tmp_path / "job" / "fidelity" / "fidelity.json").read_text())
    assert doc["complete"] is False and [r["point"] for r in doc["rows"]] == ["conc-4_r0"]  # c=1 has no row

    assert fidelity.main([str(record), "--concurrency", "1"]) == 2  # not "all within": nothing was judged
    err = capsys.readouterr().err
    assert "no job point to compare with (by hand only): conc-1_r0" in err
    assert "nothing compared: none of the 1 by-hand points is among the job's" in err
    doc = json.loads((tmp_path / "job" / "fidelity" / "fidelity.json").read_text())
    assert doc["rows"] == [] and doc["chosen"] == ["conc-1_r0"] and doc["complete"] is False


class DyingServer(FakeServer):
    """Its counters cannot be read after the first point's CLI run: the run stops after that point's
    ``<point>.json`` and before its ``<point>.checks.json``."""

    def counters(self) -> dict[str, float]:
        if self.totals["vllm:prompt_tokens"] > 0:
            raise ConnectionError("server gone")
        return super().counters()


@pytest.mark.usefixtures("fake_processes")
def test_a_new_run_removes_the_chosen_points_files_of_an_earlier_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    record = _record(tmp_path, {"conc-1_r0": 102.0, "conc-4_r0": 90.0})
    out = tmp_path / "job" / "fidelity"
    (out / "warmup").mkdir(parents=True)
    old_checks = json.dumps({"prefix_cache_hit_rate": 0.5})  # an earlier run's checks: 50% hits
    for name in ("conc-1_r0", "conc-4_r0"):
        (out / f"{name}.json").write_text(json.dumps(_result(50.0)))
        (out / f"{name}.checks.json").write_text(old_checks)
        (out / "warmup" / f"{name}.json").write_text(json.dumps(_result(50.0)))
    (out / "fidelity.json").write_text(json.dumps({"rows": ["old"], "complete": True}))
    monkeypatch.setattr(fidelity, "VLLMServer", DyingServer)
    calls: list[list[str]] = []
    monkeypatch.setattr(fidelity.subprocess, "run", _fake_cli({"conc-1_r0": 100.0}, set(), calls))

    assert fidelity.main([str(record), "--concurrency", "1"]) == 3  # died between conc-1_r0's two files
    err = capsys.readouterr().err
    # conc-1_r0.json, conc-1_r0.checks.json, warmup/conc-1_r0.json: 3 files; c=4 (not chosen) keeps its 3
    assert f"removed 3 files of an earlier run of these points from {out}" in err
    assert "ConnectionError: server gone" in err
    assert not (out / "conc-1_r0.checks.json").exists()  # not the old 50% beside the new result
    assert json.loads((out / "conc-1_r0.json").read_text())["output_throughput"] == 100.0
    assert (out / "conc-4_r0.json").is_file() and (out / "conc-4_r0.checks.json").read_text() == old_checks
    assert (out / "warmup" / "conc-4_r0.json").is_file()
    doc = json.loads((out / "fidelity.json").read_text())
    assert doc["rows"] == [] and doc["chosen"] == ["conc-1_r0"] and "ConnectionError after 0 of 1" in doc["error"]

    # the report of that run: its own conc-1_r0 (102 vs 100 -> 2.0%), no hit rate (no checks file), not 50%
    assert fidelity.main([str(record), "--report-only", "--concurrency", "1"]) == 0
    assert "| conc-1_r0 | 102.0 | 100.0 | 2.0% | 20 | 20 | - |" in capsys.readouterr().out


def test_json_goes_through_a_temporary_file_of_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "fid"
    replaced: list[tuple[Path, Path]] = []
    replace = fidelity.os.replace

    def spy(src: Path, dst: Path) -> None:
        replaced.append((Path(src), Path(dst)))
        replace(src, dst)

    monkeypatch.setattr(fidelity.os, "replace", spy)
    row = {"point": "conc-1_r0", "within": True}
    path = fidelity.write_report(out, [row], [], ["conc-1_r0", "conc-4_r0"])
    assert replaced == [(out / f"fidelity.json.{os.getpid()}.tmp", out / "fidelity.json")]  # same folder, pid
    doc = json.loads(path.read_text())
    assert doc == {"rows": [row], "by_hand": [], "chosen": ["conc-1_r0", "conc-4_r0"], "complete": False}
    assert json.loads(fidelity.write_report(out, [row], [], ["conc-1_r0"]).read_text())["complete"] is True

    def fail(src: Path, dst: Path) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(fidelity.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        fidelity.write_report(out, [], [], ["conc-1_r0"], error="x")
    assert sorted(p.name for p in out.iterdir()) == ["fidelity.json"]  # no temporary file left
    assert json.loads((out / "fidelity.json").read_text())["complete"] is True  # the last whole one


def test_by_hand_hits_are_judged_beyond_the_jobs_repeated_prompts() -> None:
    # an H200 run, c=256 r0: 2,376 requests x 256 tokens = 608,256 looked up by hand, 13,856 hits
    # (2.28%); the job's run of the same prompts (seed 10) counted 14,848 repeated tokens: nothing beyond them
    job = {"point": "conc-256_r0", "output_tok_s": 8240.9, "prompt_repeat_tokens": 14848, "input_tokens_total": 608256}
    hand = {
        "point": "conc-256_r0",
        "output_tok_s": 8394.3,
        "prefix_cache_hits": 13856,
        "prefix_cache_queries": 608256,
        "prefix_cache_hit_rate": 13856 / 608256,
        "input_tokens_total": 608256,
    }
    (row,) = fidelity.compare([point(job)], [hand])
    assert row["by_hand_excess_hit_rate"] == 0.0
    assert "| 2.28% (0.00%) |" in fidelity.render([row])
    # 7,000 hits, 1,000 repeated tokens, 200,000 looked up: 6,000 beyond the repeats = 3%
    more = hand | {"prefix_cache_hits": 7000, "prefix_cache_queries": 200000, "input_tokens_total": 200000}
    assert (
        fidelity.by_hand_excess_hit_rate(
            point(job | {"prompt_repeat_tokens": 1000, "input_tokens_total": 200000}), more
        )
        == 0.03
    )
    # the same with the seeds kept (10 both); the figure of checks that counted the repeats themselves is taken
    assert fidelity.by_hand_excess_hit_rate(point(job | {"seed": 10}), hand | {"seed": 10}) == 0.0
    counted = hand | {"prompt_repeat_tokens": 14848, "prefix_cache_excess_hit_rate": 0.0}
    assert fidelity.by_hand_excess_hit_rate(point({}), counted) == 0.0
    # other prompts went out (another seed, the totals differ), or the job never counted its repeats: nothing said
    assert fidelity.by_hand_excess_hit_rate(point(job | {"seed": 10}), hand | {"seed": 11}) is None
    assert fidelity.by_hand_excess_hit_rate(point(job), hand | {"input_tokens_total": 608000}) is None
    unknown = point({k: v for k, v in job.items() if k != "prompt_repeat_tokens"})
    assert fidelity.by_hand_excess_hit_rate(unknown, hand) is None
    (old,) = fidelity.compare([point({"point": "conc-256_r0", "output_tok_s": 8240.9})], [hand])
    assert "| 2.28% |" in fidelity.render([old])


@pytest.mark.usefixtures("fake_processes")
def test_a_run_with_the_jobs_seeds_counts_the_jobs_repeats_in_its_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each point: 8 x 256 = 2,048 tokens looked up, 256 served from the cache (one prompt sent twice), and the job
    # counted 256 repeated tokens in the same prompts: nothing beyond them. Hits alone: 256 / 2,048 = 12.5%
    tok_s = {"conc-1_r0": 100.0, "conc-4_r0": 400.0}
    monkeypatch.setattr(fidelity.subprocess, "run", _fake_cli(tok_s, set(), [], hits=256))
    record = _record(tmp_path, tok_s, seeds=True, repeats=256)
    assert fidelity.main([str(record)]) == 0
    out = tmp_path / "job" / "fidelity"
    checks = json.loads((out / "conc-4_r0.checks.json").read_text())
    assert (checks["seed"], checks["prompt_repeat_tokens"]) == (101, 256)  # the job's seed of its second point
    assert checks["prefix_cache_hit_rate"] == 0.125 and checks["prefix_cache_excess_hit_rate"] == 0.0
    assert checks["server_invalid_reasons"] == []
    doc = json.loads((out / "fidelity.json").read_text())
    assert [(r["by_hand_hit_rate"], r["by_hand_excess_hit_rate"]) for r in doc["rows"]] == [(0.125, 0.0)] * 2
    # a job without seeds in its record: the plan's seeds went out, not known to be the job's prompts; every
    # hit judged in the checks (12.5% > 1%), nothing said beyond the repeats
    record = _record(tmp_path, tok_s, repeats=256)
    assert fidelity.main([str(record)]) == 0
    checks = json.loads((out / "conc-4_r0.checks.json").read_text())
    assert checks["prompt_repeat_tokens"] is None and checks["prefix_cache_excess_hit_rate"] == 0.125
    assert "prefix-cache hit rate 12.5% > 1%" in checks["server_invalid_reasons"][0]
    doc = json.loads((out / "fidelity.json").read_text())
    assert [r["by_hand_excess_hit_rate"] for r in doc["rows"]] == [None, None]


def test_fidelity_compare_flags_points_outside_five_percent() -> None:
    job = [{"point": "conc-1_r0", "output_tok_s": 102.0, "ttft_ms_p50": 20.0}]
    job += [{"point": "conc-16_r0", "output_tok_s": 1060.0, "ttft_ms_p50": 40.0}]
    hand = [{"point": "conc-1_r0", "output_tok_s": 100.0, "ttft_ms_p50": 21.0, "prefix_cache_hit_rate": 0.0}]
    hand += [{"point": "conc-16_r0", "output_tok_s": 1000.0, "ttft_ms_p50": 41.0, "prefix_cache_hit_rate": 0.0}]
    rows = fidelity.compare([SweepPoint.model_validate(p) for p in job], hand)
    assert [r["within"] for r in rows] == [True, False]  # 2% in, 6% out
    assert rows[0]["rel_diff"] == pytest.approx(0.02) and rows[1]["rel_diff"] == pytest.approx(0.06)
    text = fidelity.render(rows)
    assert "6.0% **> 5%**" in text and "| conc-1_r0 | 102.0 | 100.0 | 2.0% |" in text


def test_the_cpu_check_takes_a_factor_of_two_either_way() -> None:
    # job / by hand: 16.96 / 10.26 = 1.65 and 6.32 / 9.87 = 0.64 within a factor of 2; 20.6 / 10.0 = 2.06 and
    # 3.0 / 10.0 = 0.30 (emulated bf16 against float32: several times slower) not; a missing figure is not within
    def row(job: float | None, hand: float | None) -> dict[str, float | None]:
        return {"job_output_tok_s": job, "by_hand_output_tok_s": hand}

    within = [(16.96, 10.26), (6.32, 9.87), (20.0, 10.0), (5.0, 10.0)]
    assert [fidelity.within_factor(row(a, b)) for a, b in within] == [True] * 4
    outside = [(20.6, 10.0), (3.0, 10.0), (None, 10.0), (5.0, 0.0)]
    assert [fidelity.within_factor(row(a, b)) for a, b in outside] == [False] * 4
