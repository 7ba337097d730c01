"""Headless Chromium for the tests that look at a page as a person sees it (marker ``browser``): the review's
HTML (tests/unit/test_review_html.py) and MLflow's UI served by a real ``mlflow server``
(tests/integration/test_mlflow_ui.py). Debian's ``chromium`` (``make browser``); a ``browser`` test fails, not
skips, without it.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
WINDOW = (1280, 2400)  # px: the screenshot's and the DOM dump's window
FIRST_SCREEN = (1280, 800)  # px: what a laptop shows before any scrolling


def require_chromium() -> str:
    """The browser's path; a test of the ``browser`` tier fails (not skips) without one."""
    if CHROMIUM is None:
        pytest.fail('chromium not found: `make browser` (apt-get install -y chromium), or -m "not browser"')
    return CHROMIUM


FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]


def chromium(args: list[str], tmp: Path, window: tuple[int, int] = WINDOW) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium once with a fresh profile under ``tmp`` (no state from an earlier run: a first
    visit, as a new user's)."""
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run(
        [require_chromium(), *FLAGS, f"--window-size={window[0]},{window[1]}", f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def visible_text(dom: str) -> str:
    """The text of a dumped DOM: scripts and styles dropped, tags removed, entities decoded, spaces collapsed."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S | re.I)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom))).strip()


def rendered_text(url: str, tmp: Path, wait_ms: int = 0) -> str:
    """The visible text of ``url`` after its scripts ran for ``wait_ms`` of virtual time (a JS app needs it)."""
    budget = [f"--virtual-time-budget={wait_ms}"] if wait_ms else []
    out = chromium([*budget, "--dump-dom", url], tmp)
    assert out.returncode == 0, out.stderr[-2000:]
    return visible_text(out.stdout)


def screenshot(url: str, png: Path, tmp: Path, window: tuple[int, int] = FIRST_SCREEN, wait_ms: int = 0) -> None:
    """A PNG of the first ``window`` of ``url``; copied into ``$QV_SCREENSHOT_DIR`` when that is set (how
    docs/screenshots/*-first-screen.png are made)."""
    budget = [f"--virtual-time-budget={wait_ms}"] if wait_ms else []
    out = chromium([*budget, f"--screenshot={png}", url], tmp, window)
    assert out.returncode == 0 and png.is_file(), out.stderr[-2000:]
    keep = os.environ.get("QV_SCREENSHOT_DIR")
    if keep:
        shutil.copy(png, Path(keep) / png.name)


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def mlflow_server(uri: str, workdir: Path, timeout_s: float = 120.0) -> Iterator[str]:
    """``mlflow server`` (one worker) over the tracking store ``uri`` on a free port; yields its address once
    ``/health`` answers. On exit the whole process tree (uvicorn, MLflow's job runner and its consumers) is
    stopped, SIGTERM then SIGKILL, and checked gone.

    Raises:
        AssertionError: the server exited or did not answer within ``timeout_s``; or left a process behind.
    """
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    log_path = workdir / f"mlflow-server-{port}.log"
    cmd = [str(mlflow), "server", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*cmd, "--workers", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as one
            cwd=workdir,
        )
        address = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    with urllib.request.urlopen(f"{address}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, f"mlflow server did not answer /health in {timeout_s:g} s"
                time.sleep(0.5)
            yield address
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    tree = [proc]
    try:
        tree += psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        pass
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    others = [p for p in tree[1:] if p.is_running()]
    _, alive = psutil.wait_procs(others, timeout=10)
    for p in alive:
        p.kill()
    assert not alive, f"mlflow server left processes behind: {[p.pid for p in alive]}"
