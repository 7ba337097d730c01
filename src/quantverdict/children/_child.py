"""Entry-point helper for stage modules that run inside a stage environment.

A stage module ends with::

    if __name__ == "__main__":
        child_main(run)

and is started by :func:`quantverdict.processes.runner.run_stage` as
``python -m quantverdict.children.<name> SPEC_JSON RESULT_JSON``. ``run(spec: dict) -> dict`` does
the work; this helper writes ``{"status": "ok", **result}`` or
``{"status": "failed", "error": ..., "traceback": ...}`` to RESULT_JSON and exits 0 / 1.
Only the standard library is imported here: the stage environments do not have our
orchestrator dependencies.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable


def progress(msg: str) -> None:
    """Print a progress line that the orchestrator shows and logs (flushed at once)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def child_main(run: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    spec_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    spec = json.loads(spec_path.read_text())
    t0 = time.perf_counter()
    try:
        result = run(spec)
        out = {"status": "ok", **result, "wall_s": round(time.perf_counter() - t0, 3)}
        code = 0
    except BaseException as exc:  # noqa: BLE001 - everything, KeyboardInterrupt too, is reported
        out = {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
            "wall_s": round(time.perf_counter() - t0, 3),
        }
        code = 1
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2, default=str))
    tmp.replace(result_path)
    sys.exit(code)
