"""``review.md`` and ``review.html`` from the typed document (:class:`quantverdict.review.document.Review`).

One template body (``templates/body.j2``) is written against block macros (headings, paragraphs, lists, tables,
images) that ``templates/md.j2`` writes as Markdown and ``templates/html.j2`` as autoescaped HTML (plots embedded as
base64 PNGs, nothing loaded from outside). The filters here only format: every number printed is a document field.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup, escape

from quantverdict.results.format import DASH, number
from quantverdict.review.document import Review

TEMPLATES = Path(__file__).resolve().parent / "templates"


def usd(v: float | None) -> str:
    """``$0.057`` under a dollar, ``$1.25`` from one; ``–`` for None."""
    return DASH if v is None else f"${v:,.3f}" if v < 1 else f"${v:,.2f}"


def gb(v: float | None, fmt: str = ".2f") -> str:
    """A byte count in GB (10^9 bytes), as :func:`quantverdict.results.format.number` writes it."""
    return number(None if v is None else v / 1e9, fmt)


def interval(low: float | None, high: float | None, fmt: str = "+.3f") -> str:
    """``[low, high]`` in ``fmt``; ``''`` when either end is missing."""
    return "" if low is None or high is None else f"[{low:{fmt}}, {high:{fmt}}]"


def value(v: object) -> str:
    """A config value as the constraints table shows it: ``null`` for None, else Python's ``str``."""
    return "null" if v is None else str(v)


def short_error(error: str | None, limit: int = 160) -> str:
    """The first line of an error message, cut to ``limit`` characters."""
    line = error.strip().splitlines()[0] if error and error.strip() else "no error message"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def md_cell(s: object) -> str:
    """Text for a Markdown table cell: pipes escaped, newlines as spaces."""
    return str(s).replace("|", "\\|").replace("\n", " ")


def oneline(s: object) -> str:
    """Whitespace runs (the template's line breaks) as one space, ends trimmed; HTML already escaped stays so."""
    out = " ".join(str(s).split())
    return Markup(out) if isinstance(s, Markup) else out


def inline(text: object) -> Markup:
    """HTML of one line of review text: escaped once (a macro's ``Markup`` is unescaped first), ``**bold**`` and
    ```code``` as tags, PASS and FAIL coloured."""
    s = str(escape(text.unescape() if isinstance(text, Markup) else text))
    s = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)
    s = re.sub(r"`(.+?)`", r"<code>\1</code>", s)
    s = re.sub(r"\bPASS\b", '<span class="pass">PASS</span>', s)
    return Markup(re.sub(r"\bFAIL\b", '<span class="fail">FAIL</span>', s))


@cache
def environment(fmt: str) -> Environment:
    """The Jinja2 environment of one format (``md`` or ``html``: autoescaped), with the formatting filters."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        undefined=StrictUndefined,
        autoescape=fmt == "html",
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(num=number, gb=gb, usd=usd, interval=interval, value=value, md_cell=md_cell, oneline=oneline)
    env.filters.update(short_error=short_error, inline=inline if fmt == "html" else str)
    env.globals["fmt"] = fmt
    return env


def markdown(document: Review) -> str:
    """``review.md``: Markdown; images refer to ``plots/<name>.png`` beside the file."""
    return environment("md").get_template("review.md.j2").render(doc=document, images={}).rstrip("\n") + "\n"


def console(document: Review) -> str:
    """The verdicts for the terminal: each model's verdict sentence, then one ``binding:`` line per constraint its
    baseline fails (Markdown emphasis kept)."""
    return environment("md").get_template("console.j2").render(doc=document)


def html(document: Review, pngs: Mapping[str, bytes]) -> str:
    """``review.html``: one self-contained page, inline CSS, plots as ``data:image/png;base64`` images, no script."""
    images = {name: base64.b64encode(data).decode("ascii") for name, data in pngs.items()}
    return environment("html").get_template("review.html.j2").render(doc=document, images=images)
