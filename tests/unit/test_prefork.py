"""The integration tier's pool of pre-imported interpreters (tests/prefork): a module run through the launcher
behaves as ``python -m`` would, in a worker forked from the zygote.

A zygote of this interpreter (importing ``json`` only) and a probe package on ``PYTHONPATH``; each case runs the
launcher as the product would run a stage environment's ``bin/python``. Expected by hand: the exit status, output,
arguments, folder and environment the launcher was given; SIGTERM to the launcher reaches the worker's handler;
a variable a pre-imported module may have read (``HF_HUB_OFFLINE``) set apart from the zygote's is refused and
the real interpreter runs the module in the launcher's own process (same pid); a launcher killed takes its worker
with it; a worker killed by SIGKILL ends its launcher by SIGKILL (return code -9, as a plain child's).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PREFORK = Path(__file__).resolve().parents[1] / "prefork"

PROBE = """
import os, signal, sys, time

mode = sys.argv[1]
print("pid", os.getpid(), flush=True)
if mode == "echo":
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "x", os.environ.get("QV_PROBE_X"), flush=True)
    sys.exit(7)
if mode == "term":
    signal.signal(signal.SIGTERM, lambda *_: (print("got term", flush=True), sys.exit(3)))
    print("waiting", flush=True)
    time.sleep(60)
if mode == "sleep":
    time.sleep(60)
"""


class Zygote:
    def __init__(self, sock: str, log: Path, env: dict[str, str]) -> None:
        self.sock, self.log, self.env = sock, log, env

    def launch(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen[str]:
        code = (
            f"import sys; sys.path.insert(0, {str(PREFORK)!r}); from launcher import main; "
            f"main({sys.executable!r}, {self.sock!r}, 'qvpf_probe.')"
        )
        return subprocess.Popen(
            [sys.executable, "-SE", "-c", code, "-m", "qvpf_probe.child", *args],
            env=env or self.env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[Zygote]:
    pkg = tmp_path / "pkg" / "qvpf_probe"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "child.py").write_text(PROBE)
    short = tempfile.mkdtemp(prefix="qvpf-")  # a Unix socket's path holds at most 107 bytes
    sock = os.path.join(short, "z.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"PYTHONPATH": str(pkg.parent), "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "zygote.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(PREFORK / "zygote.py"), sock, "json"], env=env, stdout=fh, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield Zygote(sock, log, env)
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(short, ignore_errors=True)


def pid_of(output: str) -> int:
    return int(output.split("pid ", 1)[1].split()[0])


def test_a_forked_module_gets_the_launchers_arguments_folder_environment_and_exit_status(
    zygote: Zygote, tmp_path: Path
) -> None:
    proc = zygote.launch("echo", "a b", env={**zygote.env, "QV_PROBE_X": "42"}, cwd=tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 7, out
    assert f"argv ['echo', 'a b'] cwd {tmp_path} x 42" in out
    worker = pid_of(out)
    assert worker != proc.pid and f"forked {worker}: qvpf_probe.child echo a b" in zygote.log.read_text()


def test_sigterm_to_the_launcher_reaches_the_worker(zygote: Zygote) -> None:
    proc = zygote.launch("term")
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    assert lines[1] == "waiting\n", lines
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "got term" in out


def test_an_import_time_variable_set_apart_is_run_by_the_real_interpreter(zygote: Zygote) -> None:
    proc = zygote.launch("echo", env={**zygote.env, "HF_HUB_OFFLINE": "1"})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 7, out
    assert pid_of(out) == proc.pid  # the launcher exec'd the interpreter: no worker
    assert "refused qvpf_probe.child: its environment differs in ['HF_HUB_OFFLINE']" in zygote.log.read_text()


def test_a_killed_launcher_takes_its_worker_with_it(zygote: Zygote) -> None:
    proc = zygote.launch("sleep")
    assert proc.stdout is not None
    worker = pid_of(proc.stdout.readline())
    assert worker != proc.pid
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(worker, signal.SIGKILL)
        pytest.fail(f"worker {worker} outlived its launcher")


def test_a_worker_killed_by_a_signal_ends_its_launcher_by_the_same_signal(zygote: Zygote) -> None:
    proc = zygote.launch("sleep")
    assert proc.stdout is not None
    worker = pid_of(proc.stdout.readline())
    os.kill(worker, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
