"""Offline benchmark files -> lm-eval tasks that read them (no Hugging Face hub).

The source files under ``offline_root`` (see its ``SOURCES.md``) are converted into normalized jsonl
files holding the fields of the hub datasets that lm-eval's built-in tasks read, so that the task
YAMLs in ``quantverdict/lmeval_tasks/`` keep the built-in prompts, targets and metrics verbatim:

==============  =========================================  =============================================
task            source                                     normalized row (hub dataset it stands for)
==============  =========================================  =============================================
wikitext        ``wikitext-2-raw/wiki.test.raw``           ``{"page"}`` (EleutherAI/wikitext_document_level)
arc_easy        ``arc_genmc/arc_easy_official_test.jsonl`` ``{"id","question","choices":{"text","label"},
arc_challenge   ``arc_genmc/arc_challenge_..._test.jsonl`` ``"answerKey"}`` (allenai/ai2_arc)
piqa            ``piqa/valid.jsonl`` + ``valid-labels.lst``  ``{"goal","sol1","sol2","label"}`` (baber/piqa)
hellaswag       ``hellaswag/hellaswag_val_full.txt.bz2``   ``{"query","choices","label"}`` (Rowan/hellaswag
                                                           after lm-eval's ``process_docs``)
boolq           ``boolq/val.jsonl``                        ``{"question","passage","idx","label"}``
                                                           (aps/super_glue boolq; label 0 false, 1 true)
==============  =========================================  =============================================

Two sources differ from the hub copies in ways that are repaired here (measured, see the functions):
the WikiText-2 raw file lacks its whitespace-only separator lines, and the HellaSwag text file lacks
the ``capitalize()`` that lm-eval applies to ``ctx_b``. Everything is written below ``cache_dir``,
keyed by the sources' sha256 and :data:`CONVERTER_VERSION`, never into the repository.

Standard library only: imported by the evaluate stage (serve environment) and by unit tests.
"""

from __future__ import annotations

import bz2
import hashlib
import json
import os
import re
import shutil
import string
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantverdict.children.task_check import sha256_file

__all__ = [
    "CONVERTER_VERSION",
    "OFFLINE_TASKS",
    "OfflineTasks",
    "arc_docs",
    "boolq_docs",
    "hellaswag_docs",
    "hellaswag_query",
    "piqa_docs",
    "prepare",
    "restore_wikitext_lines",
    "wikitext_hf_rows",
    "wikitext_pages",
]

CONVERTER_VERSION = "1"
TEMPLATE_DIR = Path(__file__).resolve().parent / "lmeval_tasks"
WIKITEXT_TEST = "wikitext-2-raw/wiki.test.raw"


@dataclass(frozen=True)
class _Source:
    files: tuple[str, ...]  # relative to offline_root
    split: str  # the split name lm-eval's built-in task evaluates
    note: str = ""


OFFLINE_TASKS: dict[str, _Source] = {
    "wikitext": _Source(
        (WIKITEXT_TEST,),
        "test",
        "document level; whitespace-only separator lines restored (58/60 articles byte-exact on WikiText-2 valid)",
    ),
    "arc_easy": _Source(("arc_genmc/arc_easy_official_test.jsonl",), "test"),
    "arc_challenge": _Source(
        ("arc_genmc/arc_challenge_official_test.jsonl",), "test", "1,170 of the official 1,172 items"
    ),
    "piqa": _Source(("piqa/valid.jsonl", "piqa/valid-labels.lst"), "validation"),
    "hellaswag": _Source(
        ("hellaswag/hellaswag_val_full.txt.bz2",),
        "validation",
        "ctx_b capitalization restored where the context ends in a lower-case fragment",
    ),
    "boolq": _Source(("boolq/val.jsonl",), "validation"),
}


# --------------------------------------------------------------------------------------------------
# WikiText-2


def _is_heading(line: str) -> bool:
    s = line.strip()
    return len(s) > 1 and s.startswith("=") and s.endswith("=")


def _is_article_title(line: str) -> bool:
    # The test of the hub script (EleutherAI/wikitext_document_level): " = Title = " but not " = = Sub = = ".
    rline = line.replace("= = =", "===").replace("= =", "==").strip()
    return rline.startswith("= ") and rline.endswith(" =")


def restore_wikitext_lines(lines: Iterable[str]) -> list[str]:
    """Put back the whitespace-only lines (``" "``) that separate headings in the original raw files.

    The offline ``wiki.test.raw`` keeps only its non-blank lines. In the original files a heading
    line is followed by one blank line and preceded by one (a sub-heading) or two (an article title;
    one at the very start of the file), and the file ends with two blank lines. Checked on the
    unmodified WikiText-2 ``valid.txt`` (same layout): 58 of its 60 articles come back byte for byte,
    the other two are 2 bytes (one blank line) off. Input that already has blank lines is returned
    with them normalized to this layout.

    Args:
        lines: the file's lines without line ends.

    Returns:
        The lines of the original layout, the last one ``""`` (the text after the final newline).
    """
    out: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        if _is_heading(line):
            if not out:
                out.append(" ")
            elif _is_article_title(line):
                out += [" ", " "]
            else:
                out.append(" ")
            out += [line, " "]
        else:
            out.append(line)
    return out + [" ", " ", ""]


def wikitext_pages(lines: list[str]) -> list[str]:
    """Articles exactly as the hub dataset ``EleutherAI/wikitext_document_level`` builds them.

    Same rule as its loading script: a new page starts at each article-title line; the lines of a
    page are joined with ``"\\n"``; pages that are only whitespace are dropped (the last one is kept).

    Args:
        lines: the raw file's lines in the original layout (see :func:`restore_wikitext_lines`).

    Returns:
        One string per article (62 for WikiText-2 test).
    """
    pages: list[str] = []
    ret: list[str] = []
    for line in lines:
        if _is_article_title(line):
            page = "\n".join(ret)
            if page.strip():
                pages.append(page)
            ret = []
        ret.append(line)
    pages.append("\n".join(ret))
    return pages


def wikitext_hf_rows(lines: list[str]) -> list[str]:
    """Rows of the hub dataset ``wikitext``/``wikitext-2-raw-v1`` (what GPTQ joins with ``"\\n\\n"``).

    The hub script yields each line with its newline, or ``""`` for a whitespace-only line.

    Args:
        lines: the raw file's lines in the original layout, the last one ``""`` (dropped).
    """
    body = lines[:-1] if lines and lines[-1] == "" else lines
    return [line + "\n" if line.strip() else "" for line in body]


def read_wikitext_lines(path: Path) -> list[str]:
    """The lines of a WikiText raw file, CRLF or LF, in the original layout."""
    with open(path, encoding="utf-8") as f:  # universal newlines: CRLF -> LF, as the hub script read it
        return restore_wikitext_lines(f.read().split("\n"))


# --------------------------------------------------------------------------------------------------
# Multiple choice


def arc_docs(path: Path) -> Iterator[dict[str, Any]]:
    """AI2 ARC jsonl (``question.stem``, ``question.choices[{text,label}]``, ``answerKey``) in hub form.

    The retrieved-passage field ``para`` of this copy is dropped. Labels stay as they are (``A``-``E``
    or ``1``-``4``), as in ``allenai/ai2_arc``; lm-eval's target is ``choices.label.index(answerKey)``.

    Raises:
        ValueError: an item whose answer key is not one of its labels.
    """
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            item = json.loads(line)
            q = item["question"]
            labels = [str(c["label"]) for c in q["choices"]]
            key = str(item["answerKey"])
            if key not in labels:
                raise ValueError(f"{path}:{n + 1}: answerKey {key!r} not among labels {labels}")
            yield {
                "id": item["id"],
                "question": q["stem"],
                "choices": {"text": [c["text"] for c in q["choices"]], "label": labels},
                "answerKey": key,
            }


def piqa_docs(jsonl: Path, labels: Path) -> Iterator[dict[str, Any]]:
    """PIQA ``goal``/``sol1``/``sol2`` with the gold index (0/1) from the same line of the labels file.

    Raises:
        ValueError: the two files have different numbers of items, or a label is not 0/1.
    """
    with open(jsonl, encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    with open(labels, encoding="utf-8") as f:
        golds = [line.strip() for line in f if line.strip()]
    if len(items) != len(golds):
        raise ValueError(f"{jsonl} has {len(items)} items but {labels} has {len(golds)} labels")
    for item, gold in zip(items, golds):
        if gold not in ("0", "1"):
            raise ValueError(f"{labels}: label {gold!r} is not 0 or 1")
        yield {"goal": item["goal"], "sol1": item["sol1"], "sol2": item["sol2"], "label": int(gold)}


# The last sentence boundary of a context, and the fragment after it (HellaSwag's ctx_b).
_CTX_B = re.compile(r"^(.*[.!?\"')])\s+(\S[^.!?]*)$", re.DOTALL)


def hellaswag_query(line: str) -> str:
    """lm-eval's HellaSwag query from a line ``activity_label: ctx`` of the llama.cpp text file.

    lm-eval builds ``preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize())``; the text
    file holds ``ctx = ctx_a + " " + ctx_b`` without the ``capitalize()``. In the ActivityNet items
    ``ctx_b`` is the lower-case start of the last sentence (``"... on a roof. he"``); in the WikiHow
    items it is empty. So when the text after the last sentence end starts with a lower-case letter,
    that fragment is taken as ``ctx_b`` and capitalized (``str.capitalize``, as lm-eval does, which
    also lower-cases the rest). 3,239 of the 10,042 validation items get this repair.
    """
    label, sep, ctx = line.partition(": ")
    if not sep:
        return line
    m = _CTX_B.match(ctx)
    if m and m.group(2)[:1].islower():
        ctx = f"{m.group(1)} {m.group(2).capitalize()}"
    return f"{label}: {ctx}"


def hellaswag_docs(path: Path) -> Iterator[dict[str, Any]]:
    """HellaSwag items from the bz2 text file: 6 lines each (query, gold 0-3, four endings).

    The file is already preprocessed the way lm-eval's ``process_docs`` does (brackets removed);
    only the query's ``ctx_b`` capitalization is restored (:func:`hellaswag_query`).

    Raises:
        ValueError: the file is not a whole number of 6-line items, or a gold label is not 0-3.
    """
    with bz2.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise ValueError(f"{path}: {len(lines)} lines is not a multiple of 6")
    for i in range(0, len(lines), 6):
        query, gold, *endings = lines[i : i + 6]
        if gold.strip() not in ("0", "1", "2", "3"):
            raise ValueError(f"{path}:{i + 2}: gold label {gold!r} is not 0-3")
        yield {"query": hellaswag_query(query), "choices": endings, "label": int(gold)}


def boolq_docs(path: Path) -> Iterator[dict[str, Any]]:
    """BoolQ with the string label ``"true"``/``"false"`` turned into super_glue's 1/0.

    Raises:
        ValueError: a label other than true/false.
    """
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            item = json.loads(line)
            label = str(item["label"]).strip().lower()
            if label not in ("true", "false"):
                raise ValueError(f"{path}: label {item['label']!r} is not true/false")
            yield {
                "question": item["question"],
                "passage": item["passage"],
                "idx": item.get("idx"),
                "label": int(label == "true"),
            }


def _docs(task: str, root: Path) -> Iterator[dict[str, Any]]:
    files = [root / f for f in OFFLINE_TASKS[task].files]
    if task == "wikitext":
        for page in wikitext_pages(read_wikitext_lines(files[0])):
            yield {"page": page}
    elif task in ("arc_easy", "arc_challenge"):
        yield from arc_docs(files[0])
    elif task == "piqa":
        yield from piqa_docs(files[0], files[1])
    elif task == "hellaswag":
        yield from hellaswag_docs(files[0])
    elif task == "boolq":
        yield from boolq_docs(files[0])
    else:  # pragma: no cover - guarded by prepare()
        raise KeyError(task)


# --------------------------------------------------------------------------------------------------
# Task directory for lm-eval's TaskManager(include_path=...)


@dataclass(frozen=True)
class OfflineTasks:
    """What :func:`prepare` made: ``include_path`` for lm-eval and, per task, its data file and notes."""

    include_path: Path
    data_files: dict[str, Path]
    info: dict[str, dict[str, Any]]  # task -> {"sources": {rel: sha256}, "n_docs", "split", "note"}


def prepare(tasks: Iterable[str], offline_root: str | Path, cache_dir: str | Path) -> OfflineTasks:
    """Convert the offline sources of ``tasks`` and write lm-eval task YAMLs that read them.

    Layout: ``cache_dir/lmeval-offline/<key>/{data/<task>.jsonl, tasks/<task>.yaml, tasks/utils.py,
    info.json}``, ``key`` hashing the converter version, the template texts and the sources' sha256.
    An existing complete directory is reused; a new one is written to a temporary name and renamed,
    so concurrent jobs never see half a directory. YAML data paths are absolute (lm-eval resolves
    ``data_files`` against the working directory).

    Args:
        tasks: task names, each a key of :data:`OFFLINE_TASKS`.
        offline_root: the folder described by its ``SOURCES.md``.
        cache_dir: where converted files may be written.

    Returns:
        The task directory and per-task data files and provenance.

    Raises:
        KeyError: a task with no offline source (the message lists the known ones).
        FileNotFoundError: a source file is missing.
    """
    tasks = list(dict.fromkeys(tasks))
    unknown = [t for t in tasks if t not in OFFLINE_TASKS]
    if unknown:
        raise KeyError(f"no offline source for task(s) {unknown}; known: {', '.join(OFFLINE_TASKS)}")
    root = Path(offline_root).resolve()
    sources: dict[str, dict[str, str]] = {}
    for task in tasks:
        sources[task] = {}
        for rel in OFFLINE_TASKS[task].files:
            p = root / rel
            if not p.is_file():
                raise FileNotFoundError(f"offline source for task {task!r} not found: {p}")
            sources[task][rel] = sha256_file(p)
    templates = {t: (TEMPLATE_DIR / f"{t}.yaml.in").read_text() for t in tasks}
    utils_text = (TEMPLATE_DIR / "utils.py").read_text()
    key_src = json.dumps([CONVERTER_VERSION, str(root), sources, templates, utils_text], sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    base = Path(cache_dir).resolve() / "lmeval-offline"
    final = base / key
    if not (final / "info.json").is_file():
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=base))
        tmp.chmod(0o755)
        try:
            (tmp / "data").mkdir()
            (tmp / "tasks").mkdir()
            info: dict[str, dict[str, Any]] = {}
            for task in tasks:
                data_file = final / "data" / f"{task}.jsonl"
                n = 0
                with open(tmp / "data" / f"{task}.jsonl", "w", encoding="utf-8") as f:
                    for doc in _docs(task, root):
                        f.write(json.dumps(doc, ensure_ascii=False) + "\n")
                        n += 1
                yaml = string.Template(templates[task]).substitute(data_file=json.dumps(str(data_file)))
                (tmp / "tasks" / f"{task}.yaml").write_text(yaml)
                src = OFFLINE_TASKS[task]
                info[task] = {"sources": sources[task], "n_docs": n, "split": src.split, "note": src.note}
            (tmp / "tasks" / "utils.py").write_text(utils_text)
            (tmp / "info.json").write_text(json.dumps(info, indent=2))
            try:
                os.rename(tmp, final)
            except OSError:  # another job won the race: use its copy
                if not (final / "info.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    info = json.loads((final / "info.json").read_text())
    return OfflineTasks(
        include_path=final / "tasks",
        data_files={t: final / "data" / f"{t}.jsonl" for t in tasks},
        info={t: info[t] for t in tasks},
    )
