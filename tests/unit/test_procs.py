"""Process groups: a stopped job leaves no process behind, grandchildren included. A child's output goes to its log
file; the console shows at most its latest line, in place, on a terminal."""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import sys
import time
from pathlib import Path

import pytest

from quantverdict.processes import procs
from quantverdict.serving.server import listening_pids, port_is_free


def test_stop_group_kills_grandchildren(tmp_path: Path) -> None:
    # the child starts a grandchild that ignores SIGTERM: only the group's SIGKILL ends it
    code = (
        "import subprocess,sys,time;"
        "subprocess.Popen([sys.executable,'-c','import signal,time;signal.signal(signal.SIGTERM,signal.SIG_IGN);"
        'print("grandchild up",flush=True);time.sleep(600)\']);time.sleep(600)'
    )
    proc = procs.start([sys.executable, "-c", code], tmp_path / "p.log", echo=False)
    pgid = os.getpgid(proc.pid)
    assert pgid == proc.pid  # leads its own group
    deadline = time.monotonic() + 20
    while "grandchild up" not in (tmp_path / "p.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert procs.group_alive(pgid)
    t0 = time.monotonic()
    procs.stop_group(proc, grace_s=1.0)
    assert not procs.group_alive(pgid)
    assert time.monotonic() - t0 < 10


def test_wait_timeout_stops_the_group(tmp_path: Path) -> None:
    proc = procs.start([sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "q.log", echo=False)
    try:
        procs.wait(proc, timeout_s=0.5)
    except Exception as exc:  # subprocess.TimeoutExpired
        assert "timed out" in str(exc)
    else:
        raise AssertionError("expected a timeout")
    assert not procs.group_alive(proc.pid)


def test_log_gets_command_and_output(tmp_path: Path) -> None:
    proc = procs.start([sys.executable, "-c", "print('hello')"], tmp_path / "r.log", echo=False)
    assert procs.wait(proc) == 0
    time.sleep(0.2)
    text = (tmp_path / "r.log").read_text()
    assert text.startswith("$ ") and "hello" in text


def test_listening_pids_names_this_process_while_it_listens() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert os.getpid() not in listening_pids(port)  # bound, not yet listening
        sock.listen()
        assert os.getpid() in listening_pids(port)
        assert not port_is_free("127.0.0.1", port)
    assert os.getpid() not in listening_pids(port)


def test_a_sweep_client_that_died_alone_takes_its_worker_with_it(tmp_path: Path) -> None:
    # the client (group leader) starts a worker, then is killed alone (as by the OOM killer): the worker lives on
    # in the client's group until SweepClient.stop ends the group
    from quantverdict.serving.benchmark import SweepClient

    code = (
        "import subprocess,sys,time;"
        "subprocess.Popen([sys.executable,'-c','import time;print(\"worker up\",flush=True);time.sleep(600)']);"
        "time.sleep(600)"
    )
    proc = procs.start([sys.executable, "-c", code], tmp_path / "c.log", echo=False)
    deadline = time.monotonic() + 20
    while "worker up" not in (tmp_path / "c.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(proc.pid, 9)
    proc.wait(timeout=10)
    assert procs.group_alive(proc.pid)  # the worker, alone in the group
    client = SweepClient(proc, [], tmp_path, tmp_path / "s", tmp_path / "r", tmp_path / "c.log", tmp_path / "go")
    client.stop()
    assert not procs.group_alive(proc.pid)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_status_line_shows_the_latest_redraw_of_a_progress_bar_in_place() -> None:
    # tqdm redraws its bar with "\r" and ends the line with "\n" once: one line read holds every redraw
    bar = "\r  0%|          | 0/3 [00:00<?, ?it/s]\r 33%|###3      | 1/3\r100%|##########| 3/3 [00:01<00:00]\n"
    term = _Terminal()
    status = procs.StatusLine("evaluate", term)
    status.show(bar)
    status.show("\x1b[32mINFO\x1b[0m model loaded\n")
    status.clear()
    # each drawing starts at the line's beginning and erases it ("\r" + ESC[2K); only the latest redraw is drawn
    assert term.getvalue() == (
        "\r\x1b[2K[evaluate] 100%|##########| 3/3 [00:01<00:00]" + "\r\x1b[2K[evaluate] INFO model loaded" + "\r\x1b[2K"
    )


def test_status_line_draws_nothing_off_a_terminal() -> None:
    out = io.StringIO()  # a file or a pipe: isatty() is False
    status = procs.StatusLine("quantize", out)
    status.show("100%|##########| 3/3\n")
    status.clear()
    assert out.getvalue() == ""


def test_child_output_goes_to_its_log_not_to_the_console(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # 50 lines and a progress bar of 20 redraws: all in the log file, none logged (the console shows no child line)
    code = (
        "import sys\n"
        "for i in range(50): print(f'line {i}', flush=True)\n"
        "for i in range(20): sys.stdout.write(f'\\r{i * 5}%|bar|'); sys.stdout.flush()\n"
        "print()\n"
    )
    caplog.set_level(logging.DEBUG)
    proc = procs.start([sys.executable, "-c", code], tmp_path / "child.log")
    assert procs.wait(proc) == 0
    deadline = time.monotonic() + 10
    while "95%|bar|" not in (tmp_path / "child.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    text = (tmp_path / "child.log").read_text()
    assert [f"line {i}" for i in range(50)] == [ln for ln in text.splitlines() if ln.startswith("line ")]
    # every redraw (the "\r" read back as a line break), 0% .. 95%
    assert [ln for ln in text.splitlines() if re.fullmatch(r"\d+%\|bar\|", ln)] == [f"{i * 5}%|bar|" for i in range(20)]
    assert not [r for r in caplog.records if "line " in r.getMessage() or "bar|" in r.getMessage()]
