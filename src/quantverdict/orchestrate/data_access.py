"""Where a job's evaluation and calibration data come from, checked before any work.

Each dataset is read from the offline folder (``data.offline_root``: the offline copies of
:data:`~quantverdict.children.offline_data.OFFLINE_TASKS` and the calibration text), from files a task of
``eval.include_path`` names, or from the Hugging Face hub (lm-eval's hub tasks, the WikiText-2 test text of the
token perplexity, ``scheme.calibration.hf_dataset``). :func:`problems` says, in one message, when some of them need
the hub and the hub is not reachable; :func:`check_task_names` asks lm-eval (in the serve environment) whether it
knows every other name of ``eval.tasks``.

"Not reachable" is decided so: ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` set in this process's environment
(certain: ``huggingface_hub`` and ``datasets`` then refuse every download), else one request to the hub's endpoint
(``$HF_ENDPOINT``, default https://huggingface.co) that gets no HTTP answer within :data:`HUB_PROBE_TIMEOUT_S`
(any HTTP status counts as reachable). The request is made only when some dataset needs the hub, once per process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from quantverdict.children import task_check
from quantverdict.children.offline_data import OFFLINE_TASKS
from quantverdict.config import schemes
from quantverdict.config.schema import KNOWN_TASKS, Config, ConfigError
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import run_stage
from quantverdict.results.stage_results import TaskCheckResult

log = logging.getLogger(__name__)

OFFLINE_ENV_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
HUB_PROBE_TIMEOUT_S = 5.0
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = ("1", "true", "yes", "on")
TASK_CHECK_TIMEOUT_S = 900.0  # lm-eval indexes ~14,000 task YAMLs before it answers: tens of seconds on a small host


def offline_env_var() -> str | None:
    """``NAME=value`` of the first of :data:`OFFLINE_ENV_VARS` set to a true value in this environment, or None."""
    for name in OFFLINE_ENV_VARS:
        value = os.environ.get(name, "")
        if value.strip().lower() in _TRUE:
            return f"{name}={value}"
    return None


@functools.lru_cache(maxsize=8)
def hub_probe(endpoint: str, timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """One HEAD request to ``endpoint``: None when it answers (any HTTP status), else why not (once per process).

    Args:
        endpoint: the hub's address, e.g. ``https://huggingface.co``.
        timeout_s: seconds to wait for the connection and the answer.
    """
    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s):  # noqa: S310
            return None
    except urllib.error.HTTPError:
        return None  # it answered
    except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
        return f"no answer from {endpoint} within {timeout_s:g} s: {getattr(exc, 'reason', exc)}"


def hub_unreachable() -> str | None:
    """Why the Hugging Face hub is not reachable from here (an offline variable set, or no answer), or None."""
    var = offline_env_var()
    if var:
        return f"{var} is set"
    endpoint = os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/") or DEFAULT_ENDPOINT
    return hub_probe(endpoint)


class _Lenient(yaml.SafeLoader):
    """A YAML loader that reads lm-eval's task files without their Python (``!function`` and other tags -> None)."""


_Lenient.add_multi_constructor("!", lambda loader, suffix, node: None)


def _load_task_yaml(path: Path, depth: int = 0) -> dict[str, Any]:
    """A task YAML with its ``include:`` (a file beside it, as lm-eval resolves it) merged under it."""
    try:
        cfg = yaml.load(path.read_text(encoding="utf-8"), Loader=_Lenient)  # noqa: S506 - a SafeLoader subclass
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    inc = cfg.pop("include", None)
    if isinstance(inc, str) and depth < 5:
        base = _load_task_yaml(path.parent / inc, depth + 1)
        cfg = {**base, **cfg}
    return cfg


def include_path_tasks(folder: str | Path) -> dict[str, dict[str, Any]]:
    """The tasks and groups the YAMLs under ``folder`` define, by name (their configs, ``!function`` values None)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(folder).expanduser().rglob("*.yaml")):
        cfg = _load_task_yaml(path)
        name = cfg.get("group") if "group" in cfg else cfg.get("task")
        if isinstance(name, str):
            out.setdefault(name, cfg)
    return out


def _reads_local_files(cfg: dict[str, Any]) -> bool:
    """Whether a task config reads files on this machine (a packaged builder such as ``json`` over ``data_files``, a
    folder, or a dataset its own Python makes), not a hub dataset."""
    path = cfg.get("dataset_path")
    if path is None:
        return True  # custom_dataset (Python): nothing this check can tell
    return str(path) in task_check.FILE_BUILDERS or Path(str(path)).expanduser().is_dir()


def _own_needs_hub(name: str, own: dict[str, dict[str, Any]], seen: frozenset[str] = frozenset()) -> bool | None:
    """Whether the include path's task or group ``name`` reads the hub (None: not one of its names)."""
    cfg = own.get(name)
    if cfg is None or name in seen:
        return None
    if "group" in cfg:
        members = [t if isinstance(t, str) else (t or {}).get("task") for t in cfg.get("task") or []]
        # a member the include path does not define is lm-eval's own (a hub dataset)
        return any(_own_needs_hub(str(m), own, seen | {name}) is not False for m in members)
    return not _reads_local_files(cfg)


def hub_needs(cfg: Config) -> list[str]:
    """What in this job reads the Hugging Face hub for data (the model's own source is preflight's), one phrase each.

    Eval tasks without an offline copy under ``data.offline_root`` and not over local files of
    ``eval.include_path``; the token perplexity's WikiText-2 text without ``data.offline_root``, and the sweep's
    (``bench.dataset.kind=text``); a calibrated
    scheme's text without ``data.offline_root`` (or without ``scheme.calibration.text_file``).
    """
    root = cfg.data.offline_root
    needs: list[str] = []
    synthetic = cfg.model.source == "synthetic"
    if cfg.eval.enabled and not synthetic:
        own = include_path_tasks(cfg.eval.include_path) if cfg.eval.include_path else {}
        hub_tasks = [
            str(t)
            for t in cfg.eval.tasks
            if not (root and t in OFFLINE_TASKS) and _own_needs_hub(str(t), own) is not False
        ]
        if hub_tasks:
            needs.append(f"eval.tasks {', '.join(hub_tasks)} (lm-eval's hub datasets)")
        if cfg.eval.token_perplexity.enabled and not root:
            needs.append("eval.token_perplexity (the WikiText-2 test text)")
    if cfg.bench.enabled and cfg.bench.dataset.kind == "text" and not root:
        needs.append("bench.dataset.kind=text (the WikiText-2 test paragraphs)")
    if schemes.calibrates(cfg) and not (root and cfg.scheme.calibration.text_file):
        cal = cfg.scheme.calibration
        needs.append(f"scheme.calibration ({cal.hf_dataset} {cal.hf_subset} {cal.hf_split})")
    return needs


def problems(cfg: Config) -> list[str]:
    """One message when data this job needs (:func:`hub_needs`) is neither offline nor reachable on the hub.

    The message names both ways to an offline folder (the environment variable ``QV_DATA_ROOT`` and the key
    ``data.offline_root``), the tasks' other way (``eval.include_path``) and the hub.

    Returns:
        [] when nothing needs the hub or the hub is reachable (:func:`hub_unreachable`), else one message.
    """
    needs = hub_needs(cfg)
    if not needs:
        return []
    why = hub_unreachable()
    if why is None:
        return []
    root = cfg.data.offline_root
    where = (
        "and no offline data folder is set (data.offline_root is null)"
        if not root
        else f"and data.offline_root={root!r} has offline copies of {', '.join(OFFLINE_TASKS)} only"
    )
    return [
        f"data: {'; '.join(needs)} would be read from the Hugging Face hub, which is not reachable here ({why}), "
        f"{where}. Point the job at the offline data folder (wikitext-2-raw/, arc_genmc/, piqa/, hellaswag/, "
        "boolq/; see its SOURCES.md) with the environment variable QV_DATA_ROOT=/path/to/data or the override "
        "data.offline_root=/path/to/data; for other tasks give lm-eval task YAMLs over local files in a folder "
        "named by eval.include_path; or run where the hub is reachable"
    ]


def names_to_check(cfg: Config) -> list[str]:
    """The names of ``eval.tasks`` the project does not know (:data:`KNOWN_TASKS`): lm-eval must know them."""
    if not cfg.eval.enabled or cfg.model.source == "synthetic":
        return []
    return [str(t) for t in cfg.eval.tasks if t not in KNOWN_TASKS]


def _check_key(names: list[str], include_path: str | None, env: StageEnv) -> str:
    files = []
    if include_path:
        for p in sorted(Path(include_path).rglob("*")):
            if p.is_file() and p.suffix in (".yaml", ".py"):
                files.append([str(p), hashlib.sha256(p.read_bytes()).hexdigest()])
    return hashlib.sha256(json.dumps([names, include_path, env.python, files]).encode()).hexdigest()[:16]


def check_task_names(cfg: Config, env: StageEnv, cache: Path, out: Path) -> str:
    """Ask lm-eval in the serve environment whether it knows every name of :func:`names_to_check`
    (:mod:`quantverdict.children.task_check`); a passed check is kept under ``cache/data/task-check`` for the same
    names, include path files and environment.

    Returns:
        A line for the stage's detail.

    Raises:
        ConfigError: a name lm-eval does not know (with its closest names) or that is a tag.
    """
    names = names_to_check(cfg)
    include = str(Path(cfg.eval.include_path).expanduser().resolve()) if cfg.eval.include_path else None
    key_file = cache / "data" / "task-check" / f"{_check_key(names, include, env)}.json"
    if key_file.is_file():
        result = json.loads(key_file.read_text())
    else:
        spec = {"tasks": names, "include_path": include}
        result = run_stage(env, "task_check", spec, out, TaskCheckResult, TASK_CHECK_TIMEOUT_S).model_dump()
    bad = task_check.problems(result, include)
    if bad:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(bad))
    if not key_file.is_file():
        key_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = key_file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(key_file)
    kinds = {n: f"{i['kind']} ({i['source']})" for n, i in result["tasks"].items()}
    return "lm-eval knows " + ", ".join(f"{n}: {k}" for n, k in kinds.items())
