"""``python -m tools.bench.bench_gpu --report-only`` as a command: what it cannot read is refused with an exit code
and a line naming it, and nothing is written. Real processes (the table logic itself: test_bench_gpu.py beside it)."""

from __future__ import annotations


def test_report_only_refuses_what_it_cannot_read(tmp_path) -> None:
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "tools.bench.bench_gpu", "--report-only", *args, "--results", str(tmp_path / "res")],
            capture_output=True,
            text=True,
        )

    missing = run("--out", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such folder of runs" in missing.stderr
    (tmp_path / "empty").mkdir()
    empty = run("--out", str(tmp_path / "empty"))
    assert empty.returncode == 1 and "no job records under" in empty.stderr
    # the home-made stream scheduler is gone: grids run on Ray (hydra/launcher=ray), this only reports
    layout = run("--out", str(tmp_path / "empty"), "--streams", "qwen")
    assert layout.returncode == 2 and "unrecognized arguments: --streams" in layout.stderr
    assert not (tmp_path / "res").exists()  # nothing written
