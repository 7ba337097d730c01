"""Modules kept 16-bit: keep-16-bit patterns that match a module wherever it sits, and the check of a saved
checkpoint that every module they match stayed 16-bit (standard library only).

llm-compressor passes a modifier's ``ignore`` list to compressed-tensors, whose ``match_name`` (0.19) takes a
pattern either as a regular expression (``re:<regex>``, ``re.match`` against the module's full name, so
anchored at its start) or as a plain string that must *equal* the full name (or name the module's class).
A plain ``lm_head`` therefore misses a head that sits under a wrapper, ``language_model.lm_head`` in Llama-4
and other multimodal checkpoints, and that head is quantized. :func:`anywhere` turns a plain module name
into the regex that matches it at any depth; :func:`check_kept` reads the saved checkpoint and names every
module a pattern matches whose weight was nevertheless quantized.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from quantverdict.measure.memory import QUANT_STORAGE_DTYPES, read_header

# a class name (``Linear``, ``Embedding``, ``MllamaCrossAttentionDecoderLayer``): compressed-tensors matches a
# plain pattern against the module's class too; a module attribute name starts in lower case
_CLASS_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]*$")
REGEX_PREFIX = "re:"


def anywhere(pattern: str) -> str:
    """The form of a keep-16-bit pattern that compressed-tensors matches wherever the module sits.

    A plain module name or dotted path (``lm_head``, ``model.embed_tokens``) becomes
    ``re:(?:.*\\.)?<name>$``: the name itself or any module whose full name ends in ``.<name>``
    (``language_model.lm_head``), never a name that merely ends in the same letters (``my_lm_head``).
    A regex (``re:...``) and a class name (``Linear``: an upper-case first letter) are returned unchanged.

    Args:
        pattern: one entry of ``scheme.ignore`` or ``model.quantize_ignore``.

    Returns:
        The pattern to pass to llm-compressor.
    """
    if pattern.startswith(REGEX_PREFIX) or _CLASS_NAME.match(pattern):
        return pattern
    return f"{REGEX_PREFIX}(?:.*\\.)?{re.escape(pattern)}$"


def name_matches(name: str, pattern: str) -> bool:
    """Whether compressed-tensors 0.19 (``compressed_tensors.utils.match.match_name``) matches module ``name``
    with ``pattern`` by name: ``re.match`` of a ``re:`` pattern, else equality. Class-name matches are not
    judged here (a checkpoint stores no classes)."""
    if pattern.startswith(REGEX_PREFIX):
        return re.match(pattern[len(REGEX_PREFIX) :], name) is not None
    return pattern == name


def ignore_patterns(recipe: Any) -> list[str]:
    """Every entry of every ``ignore`` list in a resolved llm-compressor recipe, first occurrence order."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("ignore"), list):
                found.extend(str(p) for p in node["ignore"] if str(p) not in found)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(recipe)
    return found


def check_kept(path: str | Path, patterns: list[str]) -> dict[str, Any]:
    """Which modules the keep-16-bit ``patterns`` mean in a saved checkpoint, and which of them were quantized.

    A plain module name means that module wherever it sits, whatever form reached llm-compressor: each pattern
    is matched in its :func:`anywhere` form, so a plain ``lm_head`` that compressed-tensors applied to the
    top-level name only still names a quantized ``language_model.lm_head`` here.

    A module is a tensor name's prefix before ``.weight`` / ``.weight_<param>`` (safetensors headers only,
    every ``*.safetensors`` of the folder). A kept module stores a plain floating-point ``weight``; a
    quantized one stores ``weight_packed`` (int4 packed), a ``weight`` in an 8-bit or smaller dtype
    (int8 / fp8), or a ``weight_scale``.

    Args:
        path: the saved checkpoint folder.
        patterns: the ``ignore`` patterns that reached llm-compressor (:func:`ignore_patterns`).

    Returns:
        ``{"patterns": [...], "kept_16bit": [module, ...], "quantized": [module, ...]}``: the modules matched
        by a pattern that stayed 16-bit, and those that did not (empty when all is as meant).

    Raises:
        FileNotFoundError: no safetensors file in ``path``.
    """
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {path}")
    leaves: dict[str, dict[str, str]] = {}  # module -> {leaf: dtype}
    for f in files:
        for name, entry in read_header(f).items():
            module, _, leaf = name.rpartition(".")
            if leaf == "weight" or leaf.startswith("weight_"):
                leaves.setdefault(module, {})[leaf] = entry["dtype"]
    meant = [anywhere(p) for p in patterns]
    kept, quantized = [], []
    for module in sorted(leaves):
        if not any(name_matches(module, p) for p in meant):
            continue
        own = leaves[module]
        if "weight_packed" in own or "weight_scale" in own or own.get("weight") in QUANT_STORAGE_DTYPES:
            quantized.append(module)
        else:
            kept.append(module)
    return {"patterns": list(patterns), "kept_16bit": kept, "quantized": quantized}
