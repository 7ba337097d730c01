"""Screenshots of what a user reads first: the docs site's home, the results page of the regime crossover and
``python -m pipelines.run --help``, each the first 1280 x 800 px, into docs/screenshots/.

    python tools/docs/screenshots.py [--root CHECKOUT] [--out docs/screenshots]

Builds the site with MkDocs into a temporary folder (``--root``: the checkout whose mkdocs.yml and docs/ to build)
and renders each page with Debian's headless ``chromium`` (``make browser``); the help text is rendered as a
terminal would show it (white on black, monospace).
"""

from __future__ import annotations

import argparse
import html
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIZE = (1280, 800)
PAGES = {"docs-home.png": "index.html", "results-regime-crossover.png": "results/regime-crossover/index.html"}


def screenshot(url: str, out: Path) -> None:
    """The first ``SIZE`` px of ``url`` as a PNG, by headless Chromium."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium: `make browser` installs it")
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={SIZE[0]},{SIZE[1]}", f"--screenshot={out}", url],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose docs to build")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
            cwd=args.root, check=True, env=env,
        )  # fmt: skip
        for name, page in PAGES.items():
            screenshot((site / page).as_uri(), args.out / name)
            print(args.out / name)
        text = subprocess.run(
            [sys.executable, "-m", "pipelines.run", "--help"],
            cwd=ROOT, check=True, capture_output=True, text=True, env={**env, "CUDA_VISIBLE_DEVICES": ""},
        ).stdout  # fmt: skip
        page = Path(tmp) / "help.html"
        page.write_text(
            "<html><body style='margin:0;background:#111;color:#eee'>"
            "<pre style='font:14px/1.35 DejaVu Sans Mono,monospace;padding:12px;margin:0'>"
            f"$ python -m pipelines.run --help\n{html.escape(text)}</pre></body></html>"
        )
        screenshot(page.as_uri(), args.out / "help.png")
        print(args.out / "help.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
