"""The versioned per-job record: config, environment, the three numbers with units, status, error.

One JSON file per job (``<job output dir>/record.json``), rewritten atomically after every stage so
a crash loses no finished result. The review and the grid table read records, never MLflow internals.
Keys carry their units (``_bytes``, ``_gib``, ``_ms``, ``_s``, ``_rps``, ``_tok_s``).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quantverdict import RECORD_SCHEMA_VERSION, __version__

RECORD_FILE = "record.json"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


@dataclass
class StageInfo:
    status: str = "pending"  # pending | running | ok | failed | interrupted | skipped | cached
    wall_s: float | None = None
    detail: str = ""


@dataclass
class Record:
    job: dict[str, Any]
    config: dict[str, Any]
    schema_version: int = RECORD_SCHEMA_VERSION
    tool: dict[str, str] = field(default_factory=lambda: {"name": "quantverdict", "version": __version__})
    environment: dict[str, Any] = field(default_factory=dict)
    status: str = "running"  # running | ok | failed | interrupted (stopped from outside: Ctrl-C, SIGTERM)
    failed_stage: str | None = None
    error: str | None = None
    traceback: str | None = None
    stages: dict[str, StageInfo] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    accuracy: dict[str, Any] = field(default_factory=dict)
    speed: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, out_dir: Path) -> Path:
        """Write ``out_dir/record.json`` atomically (temp file + rename)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / RECORD_FILE
        tmp = path.with_name(f".{RECORD_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, default=str, allow_nan=True))
        tmp.replace(path)
        return path


def load(path: Path) -> dict[str, Any]:
    """Read a record (a ``record.json`` path or the job folder holding it) as a dict.

    Raises:
        ValueError: the file is not a quantverdict record of a schema version this code reads.
    """
    if path.is_dir():
        path = path / RECORD_FILE
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("tool", {}).get("name") != "quantverdict" or "schema_version" not in data:
        raise ValueError(f"{path} is not a quantverdict record")
    if data["schema_version"] > RECORD_SCHEMA_VERSION:
        raise ValueError(
            f"{path} has schema_version {data['schema_version']}; this code reads <= {RECORD_SCHEMA_VERSION}"
        )
    return data


# MLflow's artifact store (conf/tracking: <output_root>/mlartifacts) holds copies of logged records
_NOT_JOB_DIRS = {"mlartifacts", "mlruns"}


def find_records(root: Path) -> list[Path]:
    """All job ``record.json`` files under ``root`` (a run dir, a multirun dir or the output root),
    sorted; copies inside an MLflow artifact store are left out."""
    return sorted(p for p in root.rglob(RECORD_FILE) if not _NOT_JOB_DIRS & set(p.relative_to(root).parts))


def host_environment() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }


def stopped_stage(rec: dict[str, Any]) -> str | None:
    """Where an unfinished record stopped: its ``failed_stage``, else the stage still marked running, else
    ``"after <last stage>"`` (cut between two stages); None for a record with no stages."""
    if rec.get("failed_stage"):
        return str(rec["failed_stage"])
    stages = rec.get("stages") or {}
    running = [k for k, v in stages.items() if isinstance(v, dict) and v.get("status") == "running"]
    if running:
        return running[0]
    return f"after {list(stages)[-1]}" if stages else None


def mark_interrupted(rec: dict[str, Any]) -> dict[str, Any]:
    """A record left ``running`` by a process stopped from outside (a GPU machine given back, a kill):
    status ``interrupted``, ``failed_stage`` where it stopped (:func:`stopped_stage`). Use only on
    records whose job is known to be over (a finished grid, copied results)."""
    if rec.get("status") == "running":
        rec["status"] = "interrupted"
        rec["failed_stage"] = stopped_stage(rec)
    return rec
