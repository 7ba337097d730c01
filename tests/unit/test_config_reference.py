"""The configuration reference (docs/reference/config.md) is what tools/docs/config_reference.py writes from the
config schema and conf/, so it cannot drift from them; a few of its rows, worked out from the schema by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from quantverdict.config.compose import PROJECT_ROOT


def reference_module() -> ModuleType:
    path = Path(PROJECT_ROOT) / "tools" / "docs" / "config_reference.py"
    spec = importlib.util.spec_from_file_location("config_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_reference_is_what_the_script_writes() -> None:
    text = reference_module().render()
    committed = (Path(PROJECT_ROOT) / "docs" / "reference" / "config.md").read_text()
    assert committed == text, "docs/reference/config.md is out of date: run python tools/docs/config_reference.py"


def test_rows_read_from_the_schema() -> None:
    lines = reference_module().render().splitlines()
    # BenchConfig.repeats: int, default 1, its comment beside it; ReviewConfig.floor_test: the FloorTest enum, default
    # auto, its comment above it
    assert (
        "| `bench.repeats` | int | `1` | measured runs per load level (paired by repeat against the baseline) |"
        in lines
    )
    assert any(
        line.startswith("| `review.floor_test` | one of `auto`, `point`, `interval` | `auto` | point: ")
        for line in lines
    )
    # a nested section flattened into dotted keys, its comment read from above the field
    assert any(
        line.startswith("| `bench.server.port` | int | `8765` | the server's TCP port (1-65535)") for line in lines
    )
    # every scheme file is a choice, the default marked (conf/config.yaml: scheme: bf16)
    choices = [line.split("|")[1].strip() for line in lines if line.startswith("| `") and "label=" in line]
    assert choices == [
        "`awq`",
        "`bf16 (default)`",
        "`fp8`",
        "`fp8_block`",
        "`gptq`",
        "`int8`",
        "`nvfp4`",
        "`nvfp4a16`",
        "`w4afp8`",
        "`w8a8`",
    ]
