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
import subprocess
from pathlib import Path

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
    docs/results/*-first-screen.png are made)."""
    budget = [f"--virtual-time-budget={wait_ms}"] if wait_ms else []
    out = chromium([*budget, f"--screenshot={png}", url], tmp, window)
    assert out.returncode == 0 and png.is_file(), out.stderr[-2000:]
    keep = os.environ.get("QV_SCREENSHOT_DIR")
    if keep:
        shutil.copy(png, Path(keep) / png.name)
