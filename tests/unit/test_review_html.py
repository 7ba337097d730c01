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

from browser import FIRST_SCREEN, chromium, rendered_text, screenshot
from quantverdict.config.schema import ReviewConfig
from quantverdict.review import build_review, write_review
from review_records import grid

WINDOW = (1280, 2400)  # px: the screenshot's and the DOM dump's window


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
    return chromium(args, tmp, WINDOW)


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
    # what a reader sees first, and the five embedded plots (speed ratio, Pareto, memory, accuracy, latency)
    assert "Deploy gptq (W4A16)." in re.sub(r"<[^>]+>", "", dom)
    pngs = embedded_pngs(review_page.read_text())
    assert len(pngs) == 5
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


# --- the first screen: the verdict, then one line per scheme with its three numbers ----------------------


def first_screen(review_md: str) -> list[str]:
    """The lines of review.md before its first '## ' heading (what a reader sees first)."""
    return review_md.split("\n## ", 1)[0].splitlines()


def test_first_screen_lines_hand_worked(tmp_path: Path) -> None:
    """review_records.grid at a 0.22 GiB budget (gpu set: 16 requests x 288 tokens = 4,608 KV tokens x 23,040
    bytes = 0.098877 GiB; load 1 req/s): gptq needs 0.10 + 0.0989 = 0.199 GiB; word perplexity 21.0 / 20.0 =
    +5.00% (token 41.6 / 40 = +4.00%, not the worst); per-user speed at 1 req/s (the lowest load, and the load)
    TPOT 40 / 25 ms = 1.60x. awq: 0.199 GiB, 20.8 / 20 = +4.00%, 40 / 26 = 1.54x. bf16: 0.25 + 0.0989 = 0.349 GiB."""
    review = build_review(grid(), replace(ReviewConfig(log_to_mlflow=False), memory_budget_gib=0.22), "t")
    md = write_review(review, tmp_path)["md"].read_text()
    top = first_screen(md)
    assert top[0] == "# quantverdict review"
    assert top[2].startswith("> **Deploy gptq (W4A16).**")
    rows = {r.split(" | ")[0].lstrip("| "): r.strip("| ").split(" | ") for r in top if r.startswith("| ")}
    assert rows["scheme"][1:] == [
        "GiB to serve 16 concurrent requests (budget 0.22 GiB)",
        "accuracy vs bf16: worst change [95% CI]",
        "speed vs bf16 at concurrency 1 (tok/s per user)",
        "speed vs bf16 at the stated load (1 req/s)",
        "checks",
    ]
    assert rows["gptq (W4A16)"][1:] == [
        "0.199 GiB",
        "word_perplexity +5.00% (no interval, n unknown)",
        "1.60x at 1 req/s (1 run)",
        "1.60x at 1 req/s (1 run)",
        "PASS all three",
    ]
    assert rows["awq (W4A16)"][1:4] == [
        "0.199 GiB",
        "word_perplexity +4.00% (no interval, n unknown)",
        "1.54x at 1 req/s (1 run)",
    ]
    assert rows["bf16 (BF16)"][1:] == [
        "0.349 GiB",
        "the reference",
        "1x (the reference)",
        "1x (the reference)",
        "FAIL memory",
    ]
    # before any prose or constraints table: nothing but the title, the verdict and the table above the table's end
    assert "Constraints" not in "\n".join(top) and "Source:" not in "\n".join(
        top[: top.index(next(r for r in top if r.startswith("| gptq")))]
    )


def test_first_screen_speed_at_the_load_and_intervals() -> None:
    """The synthetic Llama-3.1-8B-shape grid (review_records.SYN) at concurrency 64: c=1 fp8 TPOT 5.0 / 3.0 =
    1.67x, gptq 5.0 / 2.5 = 2.00x; at c=64 fp8 9.0 / 6.5 = 1.38x, gptq 9.0 / 10.0 = 0.90x (the crossover)."""
    from review_records import synthetic_grid

    rc = replace(ReviewConfig(log_to_mlflow=False), memory_budget_gib=12.0, load_rps=None, load_concurrency=64)
    review = build_review(synthetic_grid(), rc, "t")
    hs = {sc.scheme: sc.headline for sc in review.scorecards}
    c1 = {s: h.speed_ratio_c1 for s, h in hs.items()}
    at = {s: h.speed_ratio_at_load for s, h in hs.items()}
    assert c1["fp8"].value == pytest.approx(5.0 / 3.0)
    assert c1["gptq"].value == pytest.approx(2.0)
    assert at["fp8"].value == pytest.approx(9.0 / 6.5) and at["fp8"].label == "concurrency 64"
    assert at["gptq"].value == pytest.approx(0.9)
    assert at["gptq"].repeats == 1
    assert c1["bf16"] is None and hs["gptq"].memory_need_gib == pytest.approx(7.75)


def test_speed_ratio_interval_over_repeats() -> None:
    """Baseline TPOT p50 40 ms (repeats 38-42), scheme 25 ms (24-26), 3 repeats each: 40 / 25 = 1.60x,
    range [38 / 26, 42 / 24] = [1.46, 1.75]."""
    from quantverdict.review import document as doc
    from quantverdict.review.headline import mlflow_metrics, speed_ratio

    def pt(t: float, lo: float, hi: float, reps: int = 3) -> doc.SpeedPoint:
        need = dict.fromkeys(k for k, f in doc.SpeedPoint.model_fields.items() if f.is_required())
        spread = {"tpot_ms_p50": doc.MinMax(min=lo, max=hi)}
        fields = {
            "tpot_ms_p50": t,
            "spread": spread,
            "valid_repeats": reps,
            "repeats": reps,
            "load": 1.0,
            "label": "c=1",
        }
        return doc.SpeedPoint.model_validate(need | fields)

    r = speed_ratio(pt(25.0, 24.0, 26.0), pt(40.0, 38.0, 42.0))
    assert r is not None
    assert (r.value, r.low, r.high) == pytest.approx((1.6, 38 / 26, 1.75))
    assert (r.label, r.repeats) == ("c=1", 3)
    one = speed_ratio(pt(25.0, 24.0, 26.0, reps=1), pt(40.0, 38.0, 42.0))
    assert one is not None and one.low is None and one.high is None and one.repeats == 1
    h = doc.Headline(memory_need_gib=0.2, accuracy=None, speed_ratio_c1=r, speed_ratio_at_load=None, speed_note="")
    assert mlflow_metrics(h) == pytest.approx(
        {"mem_gib": 0.2, "speed_ratio_c1": 1.6, "speed_ratio_c1_low": 38 / 26, "speed_ratio_c1_high": 1.75}
    )


def test_pareto_front_hand_worked() -> None:
    from quantverdict.review.plots import pareto_front

    # (per-user tok/s, total tok/s): (150, 400) is beaten by (200, 500); the rest each win on one axis
    pts = [(300.0, 100.0), (200.0, 500.0), (150.0, 400.0), (50.0, 900.0)]
    assert pareto_front(pts) == [(50.0, 900.0), (200.0, 500.0), (300.0, 100.0)]


@pytest.mark.browser
def test_review_first_screen_in_the_browser(tmp_path: Path) -> None:
    """Chromium at 1280 x 800 px, as a laptop shows the page before any scrolling: the verdict and every
    scheme's line are on it (the probe lists the text whose box starts inside the first 800 px)."""
    review = build_review(grid(), replace(ReviewConfig(log_to_mlflow=False), memory_budget_gib=0.22), "t")
    page = write_review(review, tmp_path / "review")["html"]
    probed = tmp_path / "first.html"
    probe = """<script>addEventListener('load',function(){var w=document.createTreeWalker(document.body,
NodeFilter.SHOW_TEXT),n,out=[];while((n=w.nextNode())){var r=document.createRange();r.selectNodeContents(n);
var b=r.getBoundingClientRect();if(b.height>0&&b.top<innerHeight&&n.textContent.trim())out.push(n.textContent.trim());}
document.documentElement.setAttribute('data-qv-first',JSON.stringify(out));});</script>"""
    probed.write_text(page.read_text().replace("<head>", "<head>" + probe, 1))
    dom = chromium(["--dump-dom", probed.resolve().as_uri()], tmp_path, FIRST_SCREEN).stdout
    m = re.search(r'data-qv-first="([^"]*)"', dom)
    assert m is not None, "the page never finished loading"
    first = " ".join(json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&")))
    assert "Deploy gptq (W4A16)." in first
    for scheme in ("bf16 (BF16)", "int8 (W8A16)", "fp8 (FP8_DYNAMIC)", "w8a8 (W8A8)", "gptq (W4A16)", "awq (W4A16)"):
        assert scheme in first, scheme
    assert "0.199 GiB word_perplexity +5.00% (no interval, n unknown) 1.60x at 1 req/s (1 run)" in first
    assert "Constraints" not in first  # the constraints table comes after the answer
    text = rendered_text(page.resolve().as_uri(), tmp_path)
    assert text.index("Deploy gptq (W4A16).") < text.index("gptq (W4A16) 0.199 GiB") < text.index("Source:")
    screenshot(page.resolve().as_uri(), tmp_path / "review-first-screen.png", tmp_path)
