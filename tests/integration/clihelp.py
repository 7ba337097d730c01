"""Helpers to run the real command line (``python -m pipelines.run``) from integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from quantverdict.config.compose import PROJECT_ROOT

# small enough for CI on 2 cores, large enough to exercise every stage for real
TINY = [
    "eval.limit=4",
    "eval.task_limits={wikitext: 1, hellaswag: 4}",
    "eval.token_perplexity.seq_len=256",
    "eval.token_perplexity.stride=256",
    "eval.token_perplexity.max_tokens=512",
    "bench.num_prompts=2",
    "bench.min_duration_s=0",  # the request count alone: no window to fill in CI (issue 16)
    "bench.warmup_prompts=1",
    "bench.input_len=64",
    "bench.output_len=8",
    "bench.rates=[2,inf]",
    "scheme.calibration.num_samples=16",
    "scheme.calibration.seq_len=128",
    "bench.server.port=8777",  # apart from the default 8765 of `make run`
]


def command(output_root: Path, *overrides: str, multirun: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "pipelines.run"]
    if multirun:
        cmd.append("-m")
    return [*cmd, f"paths.output_root={output_root}", *overrides]


def run_cli(
    output_root: Path, *overrides: str, multirun: bool = False, timeout: float = 1800
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(output_root, *overrides, multirun=multirun),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def pids_matching(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            out.append(int(entry.name))
    return out
