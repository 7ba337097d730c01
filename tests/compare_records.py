"""Compare the records of two grids field by field: the check that a refactor changed no result.

    python tests/compare_records.py OUTPUTS/multirun/GRID_BEFORE OUTPUTS/multirun/GRID_AFTER

Records are paired by (model, scheme). Every leaf field is compared exactly, except:

* ignored: ``schema_version``, times and paths (``job.output_dir``, ``job.started_at``/``finished_at``, any
  field under ``stages`` named ``wall_s``, any value that contains either grid's folder, the vLLM log
  lines quoted under ``memory.server.evidence``), and wall-clock durations (fields ending in ``_s`` or
  ``_ms`` outside ``speed``, the CPU probe's FP8 GEMM timings);
* measured: ``speed`` values that are timings or rates of a live server (throughput, latency percentiles,
  durations, steady-state windows), which differ between two runs of the same code; they are listed with
  their relative difference, not counted as differences. Counts in ``speed`` (completed, failed, prompts,
  tokens, repeats) and every label are compared exactly.

Exit status: 0 when no compared field differs, 1 otherwise (each difference is printed).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

IGNORED = re.compile(
    r"^(schema_version|job\.(output_dir|started_at|finished_at)|stages\.[^.]+\.wall_s|memory\.server\.evidence\..*"
    r"|environment\.cpu\.fp8_gemm\.(scaled_mm_ms|float32_ms|slowdown))$"
)
TIMING = re.compile(r"(_s|_ms|_s_min|_s_max)$")
SPEED_EXACT = re.compile(
    r"(\.|^)(point|mode|served_model|offered_rate_rps|concurrency|repeat|repeats|num_prompts|warmup_requests|completed|"
    r"failed|input_tokens_total|output_tokens_total|output_tokens_requested|requests_in_result|short_requests|"
    r"metrics_source|throughput_basis|saturation_basis|output_valid|valid|valid_repeats|kind|n|value|chosen_by|why|"
    r"scheme_label|effective_label|kernels\[\d+\]|comparable_for_speed|reason|itl_per_token)$"
)


def leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts/lists to ``{"a.b[0].c": value}``."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list):
        out = {}
        for i, v in enumerate(obj):
            out.update(leaves(v, f"{prefix}[{i}]"))
        return out if obj else {prefix: []}
    return {prefix: obj}


def records(grid: Path) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in sorted(grid.rglob("record.json")):
        rec = json.loads(path.read_text())
        out[(rec["job"]["model"], rec["job"]["scheme"])] = rec
    return out


def classify(key: str, a: Any, b: Any, folders: tuple[str, ...]) -> str:
    """``ignored``, ``measured`` or ``exact`` for one leaf."""
    if IGNORED.match(key) or any(isinstance(v, str) and f in v for v in (a, b) for f in folders):
        return "ignored"
    if key.startswith("speed."):
        return "exact" if SPEED_EXACT.search(key) else "measured"
    if key.startswith("stages.") and key.endswith(".detail") and ("s " in str(a) or "s)" in str(a)):
        return "measured"  # stage details that quote a duration
    if TIMING.search(key.split("[")[0]):
        return "ignored"
    return "exact"


def compare(before: Path, after: Path) -> int:
    ra, rb = records(before), records(after)
    folders = (str(before), str(after))
    problems = 0
    if set(ra) != set(rb):
        print(f"jobs differ: only before {sorted(set(ra) - set(rb))}, only after {sorted(set(rb) - set(ra))}")
        problems += 1
    for job in sorted(set(ra) & set(rb)):
        la, lb = leaves(ra[job]), leaves(rb[job])
        exact = measured = ignored = 0
        worst: tuple[float, str] = (0.0, "")
        for key in sorted(set(la) | set(lb)):
            a, b = la.get(key, "<absent>"), lb.get(key, "<absent>")
            kind = classify(key, a, b, folders)
            if kind == "ignored":
                ignored += 1
            elif kind == "measured":
                measured += 1
                if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a:
                    worst = max(worst, (abs(b - a) / abs(a), key))
                elif (a is None) != (b is None) or type(a) is not type(b):
                    print(f"{job}: {key}: {a!r} -> {b!r} (measured field changed kind)")
                    problems += 1
            else:
                exact += 1
                if a != b:
                    print(f"{job}: {key}: {a!r} -> {b!r}")
                    problems += 1
        print(
            f"{job[0]}/{job[1]}: {exact} fields equal-checked, {measured} measured speed fields (largest relative "
            f"difference {worst[0]:.1%} at {worst[1] or '-'}), {ignored} ignored (times, paths, schema_version)"
        )
    print("no difference" if not problems else f"{problems} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(compare(Path(sys.argv[1]), Path(sys.argv[2])))
