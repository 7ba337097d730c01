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

Importing this module sets OpenMP's wait policy of the stage child to passive (``OMP_WAIT_POLICY=PASSIVE``, unless
the environment names one): a stage child computes beside other processes (the job's vLLM server, the other jobs of a
Ray grid, whatever else the host runs), and OpenMP's default policy spins a thread at every barrier, taking the cycles
the threads it waits for need. Measured on 2 CPU cores, the evaluation of SmolLM2-135M (four tasks, 512 tokens of
perplexity): alone 27.0 s active and 28.1 s passive; beside one busy process 39.5 s and 31.1 s; beside two 76.5 s and
46.3 s. One 576 x 576 GPTQ layer: 0.30 s passive, 5.7-11 s active on 2 busy cores. libgomp reads the variable when
torch loads it, so the stage modules import torch inside their functions, after this module. The vLLM server is not
a stage child: its engine binds its threads to cores of their own, where spinning is what it wants.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


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
