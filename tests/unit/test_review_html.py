"""The HTML review renders in headless Chromium: a screenshot is taken, and the page has no console
error, no uncaught exception and no failed resource (plots are embedded, nothing is loaded from outside).

Needs Debian's ``chromium`` (``apt-get install -y chromium``). Outside CI the tests skip without it;
in CI (``CI=true``) a missing browser fails them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from review_records import grid

from quantverdict.config import ReviewConfig
from quantverdict.review import build_review, write_review

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
if CHROMIUM is None and os.environ.get("CI"):
    pytest.fail("chromium not found: install it with `apt-get install -y chromium`", pytrace=False)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")

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
# injected first into a copy of the page: records uncaught errors, console.error calls and failed
# resources (capture phase: an <img> that fails to decode), and writes them into the DOM on load
PROBE = """<script>window.__qv=[];
addEventListener('error',function(e){var t=e.target;window.__qv.push(t&&t!==window&&t.tagName?
 ('resource '+t.tagName+' failed to load'):('uncaught '+e.message));},true);
(function(){var o=console.error;console.error=function(){window.__qv.push('console.error '+
 [].join.call(arguments,' '));o.apply(console,arguments);};})();
addEventListener('load',function(){document.documentElement.setAttribute('data-qv-errors',
 JSON.stringify(window.__qv));});</script>"""


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run(
        [CHROMIUM or "chromium", *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def page_problems(page: Path, tmp: Path, screenshot: Path) -> tuple[list[str], str]:
    """Open ``page`` in headless Chromium twice: a screenshot (console messages read from Chromium's log)
    and a DOM dump of a copy with :data:`PROBE` injected. Returns (problems, the rendered DOM)."""
    shot = _chromium([f"--screenshot={screenshot}", "--window-size=1280,2400", page.resolve().as_uri()], tmp)
    problems = [line for line in shot.stderr.splitlines() if ":CONSOLE" in line]  # the page has no script at all
    if shot.returncode != 0 or not screenshot.is_file():
        problems.append(f"screenshot failed (rc {shot.returncode}): {shot.stderr[-2000:]}")
    probed = tmp / f"probed-{page.name}"
    text = page.read_text()
    probed.write_text(text.replace("<head>", "<head>" + PROBE, 1) if "<head>" in text else PROBE + text)
    dom = _chromium(["--dump-dom", probed.resolve().as_uri()], tmp)
    m = re.search(r'data-qv-errors="([^"]*)"', dom.stdout)
    if m is None:
        problems.append("the page never finished loading (no load event)")
    else:
        problems += json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return problems, dom.stdout


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def review_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("review")
    review = build_review(grid(), replace(ReviewConfig(log_to_mlflow=False), memory_budget_gib=0.22), "test grid")
    return write_review(review, out)["html"]


def test_review_html_renders_without_errors(review_page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "review.png"
    problems, dom = page_problems(review_page, tmp_path, shot)
    assert problems == []
    width, height = _png_size(shot)
    assert (width, height) == (1280, 2400)
    assert shot.stat().st_size > 50_000  # a rendered page with tables and plots, not a blank one
    # what a reader sees first, and the four embedded plots
    assert "Deploy gptq (W4A16)." in re.sub(r"<[^>]+>", "", dom)
    assert dom.count('src="data:image/png;base64,') == 4
    if os.environ.get("QV_SCREENSHOT_DIR"):  # keep the picture for a person to look at
        shutil.copy(shot, Path(os.environ["QV_SCREENSHOT_DIR"]) / "review.png")


def test_review_html_is_self_contained(review_page: Path) -> None:
    html = review_page.read_text()
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert refs and all(r.startswith("data:") for r in refs)
    assert "<script" not in html.lower() and "@import" not in html and "url(" not in html


def test_a_page_with_a_javascript_error_fails(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><head><title>x</title></head><body><p>x</p>"
        "<script>undefinedFunction();</script></body></html>"
    )
    problems, _ = page_problems(bad, tmp_path, tmp_path / "bad.png")
    assert any("undefinedFunction is not defined" in p for p in problems)
    # both channels saw it: Chromium's console log and the injected probe
    assert any(":CONSOLE" in p for p in problems) and any(p.startswith("uncaught") for p in problems)


def test_a_broken_embedded_image_fails(tmp_path: Path) -> None:
    bad = tmp_path / "broken.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><title>x</title></head><body><img src="data:image/png;base64,AAAA"></body></html>'
    )
    problems, _ = page_problems(bad, tmp_path, tmp_path / "broken.png")
    assert "resource IMG failed to load" in problems
