"""Child processes in their own process group, streamed to a log, never left behind.

Every external program a job starts (stage children, ``vllm serve``, ``vllm bench serve``) goes
through :func:`start` so that it leads its own process group; :func:`stop_group` then ends the
whole group (vLLM forks engine workers, MLflow forks gunicorn workers) with SIGTERM, then SIGKILL.

A child's whole output goes to its log file only. The console gets at most one line for it: on a terminal,
:class:`StatusLine` shows the child's latest line (a progress bar's latest state: tqdm redraws with ``\r``) in
place, and clears it when the child ends; elsewhere (a file, a pipe, CI) nothing.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import psutil

log = logging.getLogger(__name__)

_LIVE: set[subprocess.Popen[bytes]] = set()
_LOCK = threading.Lock()
# each started process's reader thread (the one that writes its log), for :func:`log_written`
_READERS: weakref.WeakKeyDictionary[subprocess.Popen[bytes], threading.Thread] = weakref.WeakKeyDictionary()


def start(
    cmd: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    echo: bool = True,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` as the leader of a new process group, its stdout+stderr appended to ``log_path``.

    With ``echo`` its latest line is shown on the console's status line (:class:`StatusLine`, a terminal only)
    by the reader thread that writes the log. The process is registered so that :func:`stop_all` can end it on
    SIGTERM / Ctrl-C.
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
    status = StatusLine(log_path.stem) if echo else None
    reader = threading.Thread(target=_pump, args=(proc, fh, status), daemon=True)
    reader.start()
    with _LOCK:
        _READERS[proc] = reader
    return proc


def log_written(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    """Wait until the log of ``proc`` (started by :func:`start`) holds everything it printed: its reader thread
    reaches the end of the output, which follows the process's exit; at most ``timeout_s`` (a child of it that
    still holds the output open keeps the end away). A process that has ended may otherwise have its last lines,
    the cause of its death among them, still in the pipe when its log is read."""
    with _LOCK:
        reader = _READERS[proc] if proc in _READERS else None
    if reader is not None:
        reader.join(timeout_s)


def _pump(proc: subprocess.Popen[bytes], fh: IO[bytes], status: StatusLine | None) -> None:
    assert proc.stdout is not None
    with fh:
        for line in iter(proc.stdout.readline, b""):
            fh.write(line)
            fh.flush()
            if status is not None:
                status.show(line.decode(errors="replace"))
    if status is not None:
        status.clear()


class StatusLine:
    """One console line for a child's output: its latest line, redrawn in place on a terminal (``stream.isatty()``),
    nothing elsewhere. A progress bar's line holds its redraws separated by ``\r``; the last one is shown.

    Args:
        tag: the child's name, shown before its line (``[evaluate] ...``).
        stream: where to draw (default ``sys.stderr``).
    """

    def __init__(self, tag: str, stream: IO[str] | None = None):
        self.tag = tag
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.active = self.stream.isatty()
        except (AttributeError, ValueError):
            self.active = False
        self.shown = False

    @staticmethod
    def latest(raw: str) -> str:
        """The text a terminal would show for ``raw``: after its last ``\r``, colour codes removed, stripped."""
        parts = [p for p in _ANSI.sub("", raw).rstrip("\r\n").split("\r") if p.strip()]
        return parts[-1].strip() if parts else ""

    def show(self, raw: str) -> None:
        text = self.latest(raw)
        if not self.active or not text:
            return
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        self.stream.write("\r\x1b[2K" + f"[{self.tag}] {text}"[:width])
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.active and self.shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self.shown = False


def wait(proc: subprocess.Popen[bytes], timeout_s: float | None = None) -> int:
    """Wait for ``proc``, then for its log to hold what it printed (:func:`log_written`); on timeout or
    interruption stop its group and re-raise."""
    try:
        rc = proc.wait(timeout=timeout_s)
    except BaseException:
        stop_group(proc)
        raise
    _forget(proc)
    log_written(proc)
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
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError):
            continue
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


class Interrupted(KeyboardInterrupt):
    """The job was stopped from outside by ``signum`` (SIGINT: Ctrl-C, SIGTERM: a kill); not a failure of its own.

    Attributes:
        signum: the signal's number; :attr:`exit_code` is the shell's ``128 + signum`` (130 for SIGINT).
    """

    def __init__(self, signum: int):
        super().__init__(f"received signal {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def interrupt_signal(exc: BaseException) -> str:
    """The signal name of an interruption: that of an :class:`Interrupted`, SIGINT for a plain KeyboardInterrupt."""
    return exc.signal_name if isinstance(exc, Interrupted) else "SIGINT"


def install_signal_handlers() -> None:
    """Turn SIGINT and SIGTERM into :class:`Interrupted` (a KeyboardInterrupt) so that cleanup (``finally``) runs
    as for Ctrl-C, and the job is recorded as interrupted by that signal."""

    def _raise(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGINT, _raise)


# vLLM prefixes every line of a child process with "(<process name> pid=<pid>) " and its own log lines with
# "<LEVEL> <mm-dd hh:mm:ss> [<file>:<line>] "
_PROC_PREFIX = re.compile(r"^\((?P<proc>[^()]+?) pid=\d+\)\s*")
_LEVEL_PREFIX = re.compile(
    r"^(?:ERROR|WARNING|INFO|DEBUG|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s*"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# the last line of a Python traceback: "[module.]Name[Error|Exception|...][: message]", or a bare "Exception"
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure)(?::\s.*)?$")
# errors that only point elsewhere ("See root cause above"): vLLM's API-server side of an engine failure
_WRAPPER = re.compile(r"root cause|stack trace \(above\)|EngineDeadError|EngineGenerateError", re.IGNORECASE)
# processes whose error is the cause rather than its echo: vLLM's engine core and its workers
_CAUSE_PROCS = re.compile(r"EngineCore|Worker", re.IGNORECASE)
# printed at interpreter exit after the real error: nanobind's leak report (xgrammar's bindings), the
# multiprocessing resource tracker's leaked-semaphore warning
SHUTDOWN_NOISE = re.compile(
    r"nanobind: |^\s*- leaked (?:instance|type|function)|resource_tracker|leaked semaphore|^\s*warnings\.warn\("
)


def _log_lines(text: str) -> list[tuple[str, str]]:
    """``(process name, message)`` per non-empty line, vLLM's prefixes and colour codes removed."""
    out = []
    for raw in text.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        m = _PROC_PREFIX.match(line)
        proc = m.group("proc") if m else ""
        msg = _LEVEL_PREFIX.sub("", line[m.end() :] if m else line).strip()
        if msg:
            out.append((proc, msg))
    return out


def root_cause(text: str) -> str | None:
    """The line of a child's log that says why it failed, or None.

    That is the last exception line (``NotImplementedError: ...``, ``torch.OutOfMemoryError: ...``: the
    last line of a Python traceback), preferring, in this order: one raised in vLLM's engine core or a
    worker (``(EngineCore_DP0 pid=..)``, ``(Worker pid=..)``) that does not merely point elsewhere; any
    other that does not point elsewhere (``EngineDeadError``, "See root cause above" are vLLM's API
    server echoing the engine's failure); any exception line. Shutdown noise printed after the error
    (:data:`SHUTDOWN_NOISE`: ``nanobind: leaked ...``) is skipped, and vLLM's line prefixes removed.

    Args:
        text: the log (stdout + stderr of the child).

    Returns:
        The exception line, at most 500 characters; None when the log holds none.
    """
    found = [
        (proc, msg) for proc, msg in _log_lines(text) if _EXCEPTION_LINE.match(msg) and not SHUTDOWN_NOISE.search(msg)
    ]
    for keep in (
        lambda p, m: bool(_CAUSE_PROCS.search(p)) and not _WRAPPER.search(m),
        lambda p, m: not _WRAPPER.search(m),
        lambda p, m: True,
    ):
        picked = [m for p, m in found if keep(p, m)]
        if picked:
            return picked[-1][:500]
    return None


def clean_tail(text: str, lines: int = 12) -> str:
    """The last ``lines`` lines of a log without :data:`SHUTDOWN_NOISE` (vLLM's prefixes kept)."""
    kept = [line.rstrip() for line in text.splitlines() if line.strip() and not SHUTDOWN_NOISE.search(line)]
    return "\n".join(kept[-lines:])


def read_log(path: Path, max_bytes: int = 4 * 2**20) -> str:
    """The last ``max_bytes`` of a log file as text; '' when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - max_bytes))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def log_root_cause(path: Path) -> str | None:
    """:func:`root_cause` of the log file at ``path`` (its last 4 MiB); None when unreadable or none."""
    return root_cause(read_log(path))
