"""Tests act only on processes they started, whatever else runs on the host and wherever the checkout lies.

:func:`clihelp.marked_pids` finds a test's processes by the marker in their environment, then by their whole
command line: another job's ``vllm_cli serve`` with the same command line is never found (so never killed or
waited for), and a word far into a long command line (a checkout under a long path) is still found. CI
(``.ci/run``) runs the whole suite, this file included, from a copy of the checkout under a path of more than
150 characters.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clihelp import marked_env, marked_pids, new_marker

pytestmark = pytest.mark.integration

SERVER_WORDS = ["quantverdict.children.vllm_cli", "serve"]  # what a job's vLLM server has in its command line
# a process that starts one grandchild with its own command line (so two processes carry it), writes the
# grandchild's pid to argv[1] and sleeps until ended
TREE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', *sys.argv[2:]])\n"
    "open(sys.argv[1], 'w').write(str(child.pid))\n"
    "time.sleep(120)\n"
)
SLEEP = "import time; time.sleep(120)"


def _wait(predicate, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_test_finds_its_own_processes_and_no_other_job(tmp_path: Path, marker: str) -> None:
    # another job on the host: the same server command line, another marker
    other = subprocess.Popen(
        [sys.executable, "-c", SLEEP, *SERVER_WORDS], env=marked_env(new_marker()), start_new_session=True
    )
    # this test's job: a server process and its worker, under an output folder with a long name, "mlflow"
    # past the 120th character of the command line
    long_dir = str(tmp_path / ("runs-" + "d" * 150))
    pid_file = tmp_path / "grandchild.pid"
    ours = subprocess.Popen(
        [sys.executable, "-c", TREE, str(pid_file), long_dir, "mlflow", *SERVER_WORDS],
        env=marked_env(marker),
        start_new_session=True,
    )
    try:
        _wait(lambda: pid_file.exists() and pid_file.read_text(), 30, "the grandchild")
        grandchild = int(pid_file.read_text())
        _wait(lambda: len(marked_pids(marker)) == 2, 30, "both processes to carry the marker")
        assert len(" ".join([sys.executable, "-c", SLEEP, long_dir])) > 120  # "mlflow" comes after
        assert set(marked_pids(marker, " ".join(SERVER_WORDS))) == {ours.pid, grandchild}  # not the other job's
        assert set(marked_pids(marker, "mlflow")) == {ours.pid, grandchild}  # found however far in
        assert not marked_pids(marker, "no such word")
        for pgid in {os.getpgid(pid) for pid in marked_pids(marker, " ".join(SERVER_WORDS))}:  # as a fault test does
            os.killpg(pgid, signal.SIGKILL)
        _wait(lambda: not marked_pids(marker), 30, "this test's processes to end")
        ours.wait(timeout=10)
        assert other.poll() is None  # the other job's server lives on
    finally:
        for proc in (ours, other):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
