"""Write the configuration reference (docs/reference/config.md) from the config schema and conf/.

    python tools/docs/config_reference.py            # writes docs/reference/config.md
    python tools/docs/config_reference.py --check    # exit 1 when the committed file differs

The keys, types and defaults come from the dataclasses of ``src/quantverdict/config/schema.py`` (what Hydra composes
``conf/`` against); a key's meaning is the comment written above it or beside it there. Each config group's choices
come from ``conf/<group>/*.yaml``: the first sentence of the file's header comment and the values the file sets.
Nothing here is written by hand, so the page cannot drift from the schema: ``make docs`` runs this first, and a unit
test compares the committed page with what this writes.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import io
import re
import sys
import tokenize
import typing
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from quantverdict.config import schema

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
OUT = ROOT / "docs" / "reference" / "config.md"
SCHEMA_FILE = Path(schema.__file__)

# the order of the sections: the config groups a command line picks, then the sections without a group
GROUP_ORDER = ["model", "scheme", "eval", "bench", "kv", "env", "tracking", "review"]
# subtrees a choice's summary leaves to the file itself (long recipes and architecture descriptions)
SUMMARY_SKIP = (
    "baseline_note",
    "recipe",
    "synthetic.config",
    "headline",
    "task_limits",
    "kv_cache_scheme",
    "quantize",
    "serve",
)
SUMMARY_MAX = 420  # characters of a choice's "sets" cell


def field_comments(path: Path) -> dict[tuple[str, str], str]:
    """The comment of every dataclass field of a module: the comment lines right above the field and the one
    beside it, joined into one paragraph.

    Returns:
        ``{(class name, field name): comment}``; a field without a comment is absent.
    """
    source = path.read_text()
    lines = source.splitlines()
    trailing: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].lstrip() != tok.string.lstrip():
            trailing[tok.start[0]] = tok.string.lstrip("#").strip()
    out: dict[tuple[str, str], str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            above: list[str] = []
            i = item.lineno - 2
            while i >= 0 and lines[i].lstrip().startswith("#"):
                above.insert(0, lines[i].strip().lstrip("#").strip())
                i -= 1
            parts = above + [
                trailing[ln] for ln in range(item.lineno, (item.end_lineno or item.lineno) + 1) if ln in trailing
            ]
            if parts:
                out[(node.name, item.target.id)] = " ".join(parts)
    return out


def type_words(tp: Any) -> str:
    """A field's type as a reader types it: an enum as its allowed values, ``X or null`` for an Optional."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{type_words(inner[0])} or null"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in tp)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_words(a) for a in args)}]"
    if tp is Any:
        return "any"
    return getattr(tp, "__name__", str(tp))


def default_words(f: dataclasses.Field[Any]) -> str:
    """A field's schema default as YAML would write it; ``(set by the group's file)`` where the schema has none."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(set by the group's file)"
    if value == "???":
        return "(set by the group's file)"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, list):
        value = [v if v != float("inf") else "inf" for v in value]
    return f"`{flow(value)}`"


def cell(text: str) -> str:
    """Text fit for one Markdown table cell: pipes escaped, and angle brackets outside code spans (``<job>`` would
    otherwise be read as an HTML tag and vanish)."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def key_rows(cls: type, prefix: str, comments: dict[tuple[str, str], str]) -> list[str]:
    """The table rows of a dataclass's keys, nested dataclasses flattened into dotted keys."""
    hints = typing.get_type_hints(cls)
    rows: list[str] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        nested = inner[0] if isinstance(inner[0], type) and dataclasses.is_dataclass(inner[0]) else None
        meaning = comments.get((cls.__name__, f.name), "")
        if nested is not None:
            if meaning or typing.get_origin(tp) is typing.Union:
                note = meaning + (" (null: none)" if typing.get_origin(tp) is typing.Union else "")
                rows.append(f"| `{key}` | section | | {cell(note.strip())} |")
            rows.extend(key_rows(nested, key, comments))
            continue
        if not meaning and isinstance(inner[0], type) and issubclass(inner[0], enum.Enum) and inner[0].__doc__:
            # the enum's docstring says what the choice is (less the key it opens with)
            meaning = re.sub(r"^``[^`]+``:\s*", "", " ".join(inner[0].__doc__.split()))
        rows.append(f"| `{key}` | {cell(type_words(tp))} | {cell(default_words(f))} | {cell(meaning)} |")
    return rows


def header_sentence(path: Path) -> str:
    """The first sentence of a YAML file's header comment (``# @package`` lines skipped)."""
    words: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("# @package"):
            continue
        words.append(line.lstrip("#").strip())
    text = " ".join(words)
    match = re.match(r"(.+?\.)(\s+(?=[A-Z(`])|$)", text)  # a full stop before a capital, not "et al. 2024"
    return match.group(1) if match else text


def flat(prefix: str, node: Any) -> list[tuple[str, Any]]:
    """Leaf (dotted key, value) pairs of a loaded YAML tree."""
    if isinstance(node, dict):
        out: list[tuple[str, Any]] = []
        for key, value in node.items():
            out.extend(flat(f"{prefix}.{key}" if prefix else str(key), value))
        return out
    return [(prefix, node)]


def flow(value: Any) -> str:
    """A YAML value on one line: lists in brackets, mappings in braces, strings as written."""
    if isinstance(value, list):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if value == "":
        return '""'
    return str(value)


def choice_summary(path: Path) -> str:
    """The values a group file sets, ``key=value`` (its ``name`` and long subtrees left out)."""
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert isinstance(data, dict)
    parts = []
    for key, value in flat("", data):
        if key in ("name", "_target_", "defaults") or any(key == s or key.startswith(s + ".") for s in SUMMARY_SKIP):
            continue
        parts.append(f"{key}={flow(value)}")
    text = ", ".join(parts)
    return text if len(text) <= SUMMARY_MAX else text[: SUMMARY_MAX - 1].rsplit(", ", 1)[0] + ", …"


def default_choices() -> dict[str, str]:
    """The group choices conf/config.yaml's defaults list makes."""
    data = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"), resolve=False)
    assert isinstance(data, dict)
    out: dict[str, str] = {}
    for entry in data.get("defaults", []):
        if isinstance(entry, dict):
            for key, value in entry.items():
                out[str(key)] = str(value)
    return out


def choices_table(group: str, defaults: dict[str, str]) -> list[str]:
    """The table of a group's files: choice, what it is, the values it sets."""
    rows = ["| choice | what it is | sets |", "|---|---|---|"]
    for path in sorted((CONF / group).glob("*.yaml"), key=lambda p: p.stem):
        name = path.stem + (" (default)" if defaults.get(group) == path.stem else "")
        rows.append(f"| `{name}` | {cell(header_sentence(path))} | {cell(choice_summary(path))} |")
    return rows


def class_doc(cls: type) -> list[str]:
    """A schema class's docstring as one paragraph (none for the signature dataclasses write by themselves)."""
    doc = cls.__doc__ or ""
    if not doc or doc.startswith(cls.__name__ + "("):
        return []
    return [" ".join(doc.split()), ""]


def render() -> str:
    """The whole reference page, Markdown."""
    comments = field_comments(SCHEMA_FILE)
    defaults = default_choices()
    hints = typing.get_type_hints(schema.Config)
    fields = {f.name: f for f in dataclasses.fields(schema.Config)}
    key_head = ["| key | type | default | meaning |", "|---|---|---|---|"]
    out = [
        "# Configuration reference",
        "",
        "<!-- generated by tools/docs/config_reference.py from src/quantverdict/config/schema.py and conf/;"
        " edit those, then run `make docs` -->",
        "",
        "Every key a job or a review reads, with its type, the schema's default and what it means. A command line",
        "picks one file per config group (`GROUP=CHOICE`, e.g. `bench=gpu-concurrency`) and overrides any key",
        "(`KEY=VALUE`, e.g. `bench.repeats=5`); the group's file sets its own values over the schema defaults",
        "listed here. Hydra checks every key and type against the schema before any work, and",
        "`quantverdict.config.validate` then checks the values (allowed values, paths, what the device can run),",
        "naming the key, the allowed values and the closest match. `python -m pipelines.run --cfg job [overrides]`",
        "prints the composed config of a command line.",
        "",
    ]
    for name in GROUP_ORDER:
        cls: type = hints[name]
        out += [f"## {name}", "", *class_doc(cls)]
        if (CONF / name).is_dir():
            out += [f"Choices (`{name}=CHOICE`, files in `conf/{name}/`):", ""] + choices_table(name, defaults) + [""]
        out += ["Keys:", ""] + key_head + key_rows(cls, name, comments) + [""]
    rest = [n for n in fields if n not in GROUP_ORDER]
    nested = [n for n in rest if dataclasses.is_dataclass(hints[n])]
    top = [n for n in rest if n not in nested]
    for name in nested:
        cls = hints[name]
        out += [f"## {name}", "", *class_doc(cls)]
        out += key_head + key_rows(cls, name, comments) + [""]
    out += ["## Top-level keys", "", *key_head]
    for name in top:
        f = fields[name]
        meaning = comments.get(("Config", name), "")
        out.append(f"| `{name}` | {cell(type_words(hints[name]))} | {cell(default_words(f))} | {cell(meaning)} |")
    out += [
        "",
        "## target",
        "",
        " ".join((schema.TargetConfig.__doc__ or "").split()),
        "Not chosen as a group: `review.target=NAME` reads `conf/target/NAME.yaml`.",
        "",
        *choices_table("target", defaults),
        "",
        *key_head,
        *key_rows(schema.TargetConfig, "target", comments),
        "",
        "## hydra/launcher",
        "",
        "Where a grid's jobs run (`-m hydra/launcher=NAME`); without one they run here, one after another. Both",
        "ask for `bench.server.tensor_parallel_size` GPUs per job (none on CPU). See the clusters guide.",
        "",
        "| choice | what it is |",
        "|---|---|",
    ]
    for path in sorted((CONF / "hydra" / "launcher").glob("*.yaml"), key=lambda p: p.stem):
        out.append(f"| `{path.stem}` | {cell(header_sentence(path))} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed page differs")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        if not same:
            print(f"{args.out} is out of date: run python tools/docs/config_reference.py", file=sys.stderr)
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
