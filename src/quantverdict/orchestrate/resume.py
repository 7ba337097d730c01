"""Resume: a job whose identical config (same config hash) already finished is reused instead of rerun.

The config hash (:func:`config_hash`) leaves out what does not change a result (output locations, ``resume``,
the review's constraints, the server's port); :func:`find_completed` looks for a finished record with that hash under
``paths.output_root`` and :func:`reuse` copies it into the new job's folder, marked ``resumed_from``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from quantverdict.results.record import find_records, load

log = logging.getLogger(__name__)


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the resolved config, minus what does not change a result: output
    locations (``paths``, ``tracking``: its store sits under the output root), ``resume``, ``review`` and the
    server's port (``bench.server.port``, ``bench.server.strict_port``) (first 12 hex)."""
    cfg = {k: v for k, v in config.items() if k not in ("paths", "resume", "review", "tracking")}
    server = (cfg.get("bench") or {}).get("server")
    if isinstance(server, dict):
        server = {k: v for k, v in server.items() if k not in ("port", "strict_port")}
        cfg["bench"] = {**cfg["bench"], "server": server}
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:12]


def find_completed(output_root: Path, config_hash: str, exclude: Path) -> Path | None:
    """The newest finished (status ok) record under ``output_root`` with this config hash, if any."""
    best: tuple[str, Path] | None = None
    for path in find_records(output_root):
        if path.parent == exclude:
            continue
        try:
            data = load(path)
        except (ValueError, OSError, json.JSONDecodeError):
            continue  # a truncated or foreign file is not a finished job
        job = data.get("job", {})
        if data.get("status") == "ok" and job.get("config_hash") == config_hash and not job.get("resumed_from"):
            stamp = job.get("finished_at") or ""
            if best is None or stamp > best[0]:
                best = (stamp, path)
    return best[1] if best else None


def reuse(previous: Path, out_dir: Path) -> dict[str, Any]:
    """Copy a finished job's record into ``out_dir`` (marked ``resumed_from``) instead of rerunning it."""
    data = load(previous)
    data["job"]["resumed_from"] = str(previous.parent)
    data["job"]["output_dir"] = str(out_dir)
    data["notes"] = [*data.get("notes", []), f"reused the finished job in {previous.parent} (same config hash)"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "record.json").write_text(json.dumps(data, indent=2, default=str))
    log.info(
        "skipping %s: identical config finished in %s (resume=false reruns it)", data["job"]["id"], previous.parent
    )
    return data
