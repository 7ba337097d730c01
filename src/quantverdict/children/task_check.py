"""lm-eval task names (child, serve environment): every name of ``eval.tasks`` lm-eval knows, and what its config
says (output type, metrics and their direction), before any model is loaded or any dataset read.

Run by the pipeline as ``python -m quantverdict.children.task_check SPEC RESULT`` for the names the project has no
offline copy of (:data:`quantverdict.children.offline_data.OFFLINE_TASKS`), and by the evaluate stage as its first
step. lm-eval's ``TaskManager`` indexes the YAML configs (``include_path``, then its own ~14,000) without loading
a dataset; a name of ``include_path`` is looked up there first, so the built-in index is built only when needed.

Spec::

    {"tasks": [str], "include_path": str | null}

Result (besides ``status`` and ``wall_s`` added by ``child_main``)::

    {"tasks": {name: {"kind": "task" | "group", "output_type": str | null, "metrics": [str],
                      "higher_is_better": {metric: bool}, "source": "include_path" | "lm-eval"}},
     "unknown": {name: [closest names]},     # not an lm-eval task, group or tag
     "tags": {name: [its tasks]},            # an lm-eval tag: no aggregate metric, so not one task
     "lm_eval": str}                         # lm-eval's version

Imports only the standard library at module level (lm-eval inside the functions), so that the orchestrator can
use :func:`problems` on a result.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from quantverdict.children._child import child_main

# lm-eval 0.4.13 lm_eval/api/registry.py DEFAULT_METRIC_REGISTRY: a task config without metric_list gets these
DEFAULT_METRICS = {
    "loglikelihood": ["perplexity", "acc"],
    "loglikelihood_rolling": ["word_perplexity", "byte_perplexity", "bits_per_byte"],
    "multiple_choice": ["acc", "acc_norm"],
    "generate_until": ["exact_match"],
}
# datasets' packaged builders that read the files named in dataset_kwargs.data_files (no hub dataset)
FILE_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
CLOSE_NAMES = 5


class TaskLookup:
    """lm-eval's task index for ``include_path``: the folder's own tasks first (``include_defaults=False``, fast),
    then lm-eval's built-in ones with the folder's on top (built on first need).

    Args:
        include_path: a folder of task YAMLs (``eval.include_path``), or None.
    """

    def __init__(self, include_path: str | None):
        self.include_path = include_path
        self._own: Any = None
        self._all: Any = None

    def own(self) -> Any:
        """The ``TaskManager`` of ``include_path`` alone (None without one)."""
        if self.include_path and self._own is None:
            from lm_eval.tasks import TaskManager

            self._own = TaskManager(include_path=self.include_path, include_defaults=False)
        return self._own

    def full(self) -> Any:
        """The ``TaskManager`` of lm-eval's built-in tasks plus ``include_path`` (which wins on a name clash)."""
        if self._all is None:
            from lm_eval.tasks import TaskManager

            self._all = TaskManager(include_path=self.include_path) if self.include_path else TaskManager()
        return self._all

    def find(self, name: str) -> tuple[Any, Any] | None:
        """``(task_manager, entry)`` that knows ``name`` (the include path's own manager first), or None."""
        own = self.own()
        if own is not None and name in own.task_index:
            return own, own.task_index[name]
        full = self.full()
        entry = full.task_index.get(name)
        return (full, entry) if entry is not None else None

    def manager_for(self, name: str) -> Any:
        """The ``TaskManager`` to evaluate ``name`` with: the include path's own for its tasks and for its groups
        whose members are all its own, else the full one (also for a name lm-eval does not know, so that lm-eval
        raises its own error)."""
        found = self.find(name)
        if found is None:
            return self.full()
        manager, entry = found
        if manager is self._own and _kind(entry) == "group":
            members = [t if isinstance(t, str) else (t or {}).get("task") for t in (entry.cfg or {}).get("task") or []]
            if not all(isinstance(m, str) and m in manager.task_index for m in members):
                return self.full()
        return manager


def _kind(entry: Any) -> str:
    return str(getattr(entry.kind, "name", entry.kind)).lower()  # TASK, PY_TASK, GROUP, TAG


def _metric_names(items: Any) -> list[str]:
    return [m["metric"] for m in items or [] if isinstance(m, dict) and isinstance(m.get("metric"), str)]


def _higher_is_better(metric: str, items: Any) -> bool | None:
    """A metric's direction: the task config's ``higher_is_better``, else lm-eval's metric registry."""
    for m in items or []:
        if isinstance(m, dict) and m.get("metric") == metric and isinstance(m.get("higher_is_better"), bool):
            return bool(m["higher_is_better"])
    try:
        import lm_eval.api.metrics  # noqa: F401  (registers lm-eval's metrics and their direction)
        from lm_eval.api.registry import is_higher_better

        value = is_higher_better(metric)
    except Exception:  # noqa: BLE001 - a metric lm-eval has no direction for
        return None
    return bool(value) if isinstance(value, bool) else None


def entry_info(entry: Any, source: str) -> dict[str, Any]:
    """What a task's or group's config says: kind, output type, metrics in its order and their direction.

    A task's metrics are its ``metric_list`` (else lm-eval's defaults for its ``output_type``, :data:`DEFAULT_METRICS`);
    a group's its ``aggregate_metric_list``. A Python-defined task (``class:``) names its metrics only when it runs:
    ``metrics`` is empty then.
    """
    cfg = dict(entry.cfg or {})
    kind = _kind(entry)
    if kind == "group":
        items = cfg.get("aggregate_metric_list")
        if isinstance(items, dict):
            items = [items]
        return {
            "kind": "group",
            "output_type": None,
            "metrics": _metric_names(items),
            "higher_is_better": {m: _higher_is_better(m, items) for m in _metric_names(items)},
            "source": source,
        }
    output_type = cfg.get("output_type") or ("generate_until" if kind == "task" else None)
    items = cfg.get("metric_list")
    metrics = _metric_names(items) or (list(DEFAULT_METRICS.get(output_type or "", [])) if kind == "task" else [])
    return {
        "kind": "task",
        "output_type": output_type,
        "metrics": metrics,
        "higher_is_better": {m: _higher_is_better(m, items) for m in metrics},
        "source": source,
    }


def check(names: Iterable[str], lookup: TaskLookup) -> dict[str, Any]:
    """Look ``names`` up in lm-eval's task index (no dataset is read).

    Returns:
        ``{"tasks": {name: entry_info}, "unknown": {name: closest names}, "tags": {name: its tasks}, "lm_eval"}``.
    """
    out: dict[str, Any] = {"tasks": {}, "unknown": {}, "tags": {}, "lm_eval": _lm_eval_version()}
    for name in names:
        found = lookup.find(name)
        if found is None:
            known = list(lookup.full().all_tasks)
            out["unknown"][name] = difflib.get_close_matches(name, known, n=CLOSE_NAMES, cutoff=0.6)
            continue
        manager, entry = found
        if _kind(entry) == "tag":
            out["tags"][name] = sorted(entry.tags)
            continue
        own = lookup.own()
        out["tasks"][name] = entry_info(entry, "include_path" if own is not None and manager is own else "lm-eval")
    return out


def problems(result: dict[str, Any], include_path: str | None) -> list[str]:
    """One message per name of a :func:`check` result lm-eval cannot evaluate as one task, naming ``eval.tasks``,
    the name and lm-eval's closest names."""
    where = f"lm-eval {result.get('lm_eval') or '?'}" + (
        f" with eval.include_path={include_path!r}" if include_path else ""
    )
    out = []
    for name, close in (result.get("unknown") or {}).items():
        hint = f"closest: {', '.join(close)}" if close else "no close name"
        out.append(
            f"eval.tasks: {name!r} is not a task or group of {where}; {hint} (all names: `lm-eval ls tasks` in "
            "the serve environment; a task of your own: a YAML in the folder eval.include_path names)"
        )
    for name, members in (result.get("tags") or {}).items():
        shown = ", ".join(members[:8]) + (", ..." if len(members) > 8 else "")
        out.append(
            f"eval.tasks: {name!r} is an lm-eval tag (tasks without an aggregate metric: {shown}); name its tasks, "
            "or a group, in eval.tasks"
        )
    return out


def _lm_eval_version() -> str | None:
    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return None


def sha256_file(path: Path) -> str:
    """The sha256 of a file's bytes (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _data_files(kwargs: dict[str, Any]) -> list[str]:
    files = kwargs.get("data_files")
    if isinstance(files, dict):
        files = [f for v in files.values() for f in (v if isinstance(v, list) else [v])]
    elif isinstance(files, str):
        files = [files]
    return [str(f) for f in files or []]


def lmeval_data_source(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """Where an lm-eval task's documents came from, as lm-eval reports its config (``results["configs"][name]``).

    A hub dataset: its id (``dataset_path``), subset (``dataset_name``) and the revision the config pins
    (``dataset_kwargs.revision``; None: the hub's default branch when ``datasets`` fetched it). Files read by a
    packaged builder (``dataset_path: json`` and ``dataset_kwargs.data_files``): each file's path and sha256.

    Returns:
        ``{"kind": "lm-eval hub task" | "lm-eval task over local files", "description": str, "task",
        "dataset_path", "dataset_name", "revision", "split", "files": [{"path", "sha256"}]}``.
    """
    kwargs = dict(config.get("dataset_kwargs") or {})
    path, subset = config.get("dataset_path"), config.get("dataset_name")
    split = config.get("test_split") or config.get("validation_split")
    files = []
    for f in _data_files(kwargs):
        p = Path(f).expanduser()
        p = p if p.is_absolute() else Path.cwd() / p
        files.append({"path": str(p), "sha256": sha256_file(p) if p.is_file() else None})
    local = path in FILE_BUILDERS or (isinstance(path, str) and Path(path).expanduser().is_dir())
    revision = kwargs.get("revision")
    if local:
        kind = "lm-eval task over local files"
        listed = ", ".join(f"{f['path']} (sha256 {f['sha256']})" for f in files) or str(path)
        description = f"lm-eval task {name} ({path} builder over {listed})"
    else:
        kind = "lm-eval hub task"
        pinned = f"revision {revision}" if revision else "no revision pinned: the hub's default branch when fetched"
        description = f"lm-eval hub task {name} (dataset {path}{f' {subset}' if subset else ''}, {pinned})"
    return {
        "kind": kind,
        "description": description,
        "task": name,
        "dataset_path": path,
        "dataset_name": subset,
        "revision": revision,
        "split": split,
        "files": files,
    }


def offline_data_source(name: str, offline_root: str, info: dict[str, Any]) -> dict[str, Any]:
    """Where an offline task's documents came from: the source files under ``offline_root`` with their sha256
    (:func:`quantverdict.children.offline_data.prepare`'s ``info``)."""
    files = [{"path": str(Path(offline_root) / rel), "sha256": sha} for rel, sha in (info.get("sources") or {}).items()]
    listed = ", ".join(f"{f['path']} (sha256 {f['sha256']})" for f in files)
    return {
        "kind": "offline file",
        "description": f"offline copy of {name}: {listed}",
        "task": name,
        "split": info.get("split"),
        "files": files,
        "note": info.get("note") or "",
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Check ``spec["tasks"]`` against lm-eval's index with ``spec["include_path"]`` (see the module)."""
    return check(list(spec.get("tasks") or []), TaskLookup(spec.get("include_path")))


if __name__ == "__main__":
    child_main(run)
