"""Child processes in their own process group, streamed to a log, never left behind.

Every external program a job starts (stage children, ``vllm serve``, ``vllm bench serve``) goes
through :func:`start` so that it leads its own process group; :func:`stop_group` then ends the
whole group (vLLM forks engine workers, MLflow forks gunicorn workers) with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

_LIVE: set[subprocess.Popen[bytes]] = set()
_LOCK = threading.Lock()


def start(
    cmd: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    echo: bool = True,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` as the leader of a new process group, its stdout+stderr appended to ``log_path``.

    With ``echo`` the lines are also logged (progress of long stages) by a reader thread.
    The process is registered so that :func:`stop_all` can end it on SIGTERM / Ctrl-C.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=full_env,
        cwd=cwd,
        start_new_session=True,
    )
    with _LOCK:
        _LIVE.add(proc)
    fh = open(log_path, "ab")  # noqa: SIM115 - closed by the reader thread
    fh.write(f"$ {shlex.join(cmd)}\n".encode())  # quoted: a path with a space can be pasted into a shell
    threading.Thread(target=_pump, args=(proc, fh, echo, log_path.stem), daemon=True).start()
    return proc


def _pump(proc: subprocess.Popen[bytes], fh: IO[bytes], echo: bool, tag: str) -> None:
    assert proc.stdout is not None
    with fh:
        for line in iter(proc.stdout.readline, b""):
            fh.write(line)
            fh.flush()
            if echo:
                text = line.decode(errors="replace").rstrip()
                if text:
                    log.info("[%s] %s", tag, text)


def wait(proc: subprocess.Popen[bytes], timeout_s: float | None = None) -> int:
    """Wait for ``proc``; on timeout or interruption stop its group and re-raise."""
    try:
        rc = proc.wait(timeout=timeout_s)
    except BaseException:
        stop_group(proc)
        raise
    _forget(proc)
    return rc


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """End the process group led by ``proc``: SIGTERM, wait ``grace_s``, then SIGKILL."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid
    for sig, pause in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + pause
        while time.monotonic() < deadline and group_alive(pgid):
            time.sleep(0.2)
            proc.poll()
        if not group_alive(pgid):
            break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.warning("process %d did not exit after SIGKILL", proc.pid)
    _forget(proc)


def group_alive(pgid: int) -> bool:
    """True while any process of group ``pgid`` exists (zombies of our own children excluded)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # fields after the ")" that closes comm: state ppid pgrp ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_all() -> None:
    """Stop every process group started through :func:`start` that is still alive."""
    with _LOCK:
        procs = list(_LIVE)
    for proc in procs:
        stop_group(proc)


def _forget(proc: subprocess.Popen[bytes]) -> None:
    with _LOCK:
        _LIVE.discard(proc)


def install_signal_handlers() -> None:
    """Turn SIGTERM into KeyboardInterrupt so that cleanup (``finally``) runs as for Ctrl-C."""

    def _raise(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"received signal {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, _raise)
