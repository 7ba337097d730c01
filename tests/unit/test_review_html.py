"""The HTML review renders in headless Chromium: no console error, no uncaught exception, no failed
resource (plots are embedded, nothing is loaded from outside), every plot decodes, the page fits a
1280 px window, and the screenshot shows the verdict box first.

The tests that start it are marked ``browser``: they need Debian's ``chromium`` (``make browser``, or
``apt-get install -y chromium``) and fail without it; leave the tier out with ``-m "not browser"``
(``make test-unit`` does).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import struct
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from quantverdict.config.schema import ReviewConfig
from quantverdict.review import build_review, write_review
from review_records import grid

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
WINDOW = (1280, 2400)  # px: the screenshot's and the DOM dump's window


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
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
]
# injected first into a copy of the page: records uncaught errors, console.error calls and failed
# resources (capture phase: an <img> that fails to decode), and writes them into the DOM on load, with
# the layout: the page's scroll width, the window's inner width, each image's decoded and shown size
PROBE = """<script>window.__qv=[];
addEventListener('error',function(e){var t=e.target;window.__qv.push(t&&t!==window&&t.tagName?
 ('resource '+t.tagName+' failed to load'):('uncaught '+e.message));},true);
(function(){var o=console.error;console.error=function(){window.__qv.push('console.error '+
 [].join.call(arguments,' '));o.apply(console,arguments);};})();
addEventListener('load',function(){var d=document.documentElement;
 d.setAttribute('data-qv-errors',JSON.stringify(window.__qv));
 d.setAttribute('data-qv-layout',JSON.stringify({scroll_width:d.scrollWidth,inner_width:innerWidth,
  images:[].map.call(document.images,function(i){return [i.naturalWidth,i.naturalHeight,i.clientWidth];})}));
});</script>"""


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run(
        [require_chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def page_problems(page: Path, tmp: Path, screenshot: Path) -> tuple[list[str], str]:
    """Open ``page`` in headless Chromium twice: a screenshot (console messages read from Chromium's log)
    and a DOM dump of a copy with :data:`PROBE` injected. Returns (problems, the rendered DOM)."""
    shot = _chromium([f"--screenshot={screenshot}", page.resolve().as_uri()], tmp)
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
        problems += json.loads(_unescape(m.group(1)))
    return problems, dom.stdout


def _unescape(attr: str) -> str:
    return attr.replace("&quot;", '"').replace("&amp;", "&")


def layout(dom: str) -> dict:
    """What the probe measured on load: ``scroll_width``, ``inner_width`` (px) and ``images``, one
    ``[natural width, natural height, shown width]`` (px) per <img> in page order."""
    m = re.search(r'data-qv-layout="([^"]*)"', dom)
    assert m is not None, "the probe wrote no layout (page never loaded)"
    return json.loads(_unescape(m.group(1)))


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in px from a PNG's IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def embedded_pngs(html: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]


def pixels_of(png: Path, rgb: str) -> int:
    """How many pixels of the screenshot have exactly the colour ``rgb`` (``"#3a7d44"``)."""
    import matplotlib.image
    import numpy as np

    img = np.round(matplotlib.image.imread(png)[..., :3] * 255).astype(int)
    want = [int(rgb[i : i + 2], 16) for i in (1, 3, 5)]
    return int((img == want).all(axis=-1).sum())


@pytest.fixture(scope="module")
def review_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("review")
    review = build_review(grid(), replace(ReviewConfig(log_to_mlflow=False), memory_budget_gib=0.22), "test grid")
    return write_review(review, out)["html"]


@pytest.mark.browser
def test_review_html_renders_without_errors(review_page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "review.png"
    problems, dom = page_problems(review_page, tmp_path, shot)
    assert problems == []
    # what a reader sees first, and the four embedded plots
    assert "Deploy gptq (W4A16)." in re.sub(r"<[^>]+>", "", dom)
    pngs = embedded_pngs(review_page.read_text())
    assert len(pngs) == 4
    lay = layout(dom)
    # nothing wider than the window: the body is at most 1200 px (CSS max-width) inside 1280 px
    assert lay["inner_width"] == WINDOW[0] and lay["scroll_width"] <= WINDOW[0]
    # each plot decoded at the size matplotlib wrote, and shown no wider than the body's 1200 px
    assert [tuple(i[:2]) for i in lay["images"]] == [png_size(p) for p in pngs]
    assert all(0 < i[2] <= 1200 for i in lay["images"])
    # the verdict box (green left border #3a7d44, 5 px wide: the verdict is "ok") is drawn, in the first
    # screen (900 px) of the screenshot
    import matplotlib.image

    top = tmp_path / "top.png"
    matplotlib.image.imsave(top, matplotlib.image.imread(shot)[:900])
    assert pixels_of(top, "#3a7d44") >= 5 * 20  # 5 px x at least one 20 px line of text
    if os.environ.get("QV_SCREENSHOT_DIR"):  # keep the picture for a person to look at
        shutil.copy(shot, Path(os.environ["QV_SCREENSHOT_DIR"]) / "review.png")


def test_review_html_is_self_contained(review_page: Path) -> None:
    html = review_page.read_text()
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert refs and all(r.startswith("data:") for r in refs)
    assert "<script" not in html.lower() and "@import" not in html and "url(" not in html


@pytest.mark.browser
def test_the_review_with_one_plot_corrupted_is_caught(review_page: Path, tmp_path: Path) -> None:
    """The review page itself with its second plot's bytes cut to a PNG signature: the render test
    above would fail on it (the plot fails to load and decodes to 0 x 0), the other three still show."""
    html = review_page.read_text()
    b64 = re.findall(r'src="data:image/png;base64,([^"]+)"', html)[1]
    bad = tmp_path / "review.html"
    bad.write_text(html.replace(b64, base64.b64encode(b"\x89PNG\r\n\x1a\n").decode(), 1))
    problems, dom = page_problems(bad, tmp_path, tmp_path / "review.png")
    assert problems == ["resource IMG failed to load"]
    natural = [tuple(i[:2]) for i in layout(dom)["images"]]
    assert natural[1] == (0, 0) and all(w > 0 and h > 0 for i, (w, h) in enumerate(natural) if i != 1)
