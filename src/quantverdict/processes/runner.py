"""Run a child stage (``python -m quantverdict.children.<name>``) in its environment, JSON in and out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from quantverdict.processes import procs
from quantverdict.processes.envs import StageEnv


class StageError(RuntimeError):
    """A stage failed. ``stage`` names it; ``child_traceback`` holds the child's traceback, if any."""

    def __init__(self, stage: str, message: str, child_traceback: str | None = None, log_path: Path | None = None):
        hint = f" (log: {log_path})" if log_path else ""
        super().__init__(f"stage {stage} failed: {message}{hint}")
        self.stage = stage
        self.child_traceback = child_traceback
        self.log_path = log_path


class ChildOk(BaseModel):
    """A child's result file when its stage finished: ``status`` ``ok`` beside the stage's own keys (typed by the
    stage's result model, :mod:`quantverdict.results.stage_results`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    status: Literal["ok"]


class ChildFailed(BaseModel):
    """A child's result file when its stage raised: ``error`` (the exception's type and message), ``traceback``
    and ``wall_s`` (s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Literal["failed"]
    error: str
    traceback: str | None = None
    wall_s: float | None = None


# the envelope of every child's result file (quantverdict.children._child.child_main), told apart by ``status``
ChildOutcome = Annotated[ChildOk | ChildFailed, Field(discriminator="status")]
_OUTCOME: TypeAdapter[ChildOk | ChildFailed] = TypeAdapter(ChildOutcome)


def read_outcome(path: Path) -> tuple[ChildOk | ChildFailed, dict[str, Any]]:
    """The envelope of the child's result file at ``path`` (:data:`ChildOutcome`), and the file's JSON object (what
    the stage's result model reads).

    Raises:
        ValueError: the file is not JSON (:class:`json.JSONDecodeError`) or not a child's result
            (:class:`pydantic.ValidationError`, naming the key: ``status`` neither ``ok`` nor ``failed``, or a
            failure without its ``error``).
    """
    data = json.loads(path.read_text())
    return _OUTCOME.validate_python(data), data


def _wrong(exc: ValidationError) -> str:
    """The first five problems of a validation error, each ``key: message``."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors()[:5])


R = TypeVar("R", bound=BaseModel)


def run_stage(
    env: StageEnv,
    stage: str,
    spec: dict[str, Any],
    workdir: Path,
    result_type: type[R],
    timeout_s: float | None = None,
) -> R:
    """Run ``quantverdict.children.<stage>`` in ``env`` with ``spec``; return its result as ``result_type``
    (a model of :mod:`quantverdict.results.stage_results`), validated where it crosses back.

    The child leads its own process group and is stopped with its group on timeout, Ctrl-C or
    SIGTERM. Files: ``workdir/<stage>.spec.json``, ``<stage>.result.json``, ``<stage>.log``.

    Raises:
        StageError: the child reported a failure (its exception line), or died without writing a result (the
            root cause from its log, :func:`quantverdict.processes.procs.root_cause`, when there is one), or
            wrote a file that is not a child's result (:data:`ChildOutcome`) or does not match ``result_type``
            (the keys named).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / f"{stage}.spec.json"
    result_path = workdir / f"{stage}.result.json"
    log_path = workdir / f"{stage}.log"
    result_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec, indent=2, default=str))
    cmd = env.module(f"quantverdict.children.{stage}", str(spec_path), str(result_path))
    proc = procs.start(cmd, log_path, env=env.env)
    rc = procs.wait(proc, timeout_s)
    if not result_path.exists():
        how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
        cause = procs.log_root_cause(log_path)
        raise StageError(
            stage, f"the child process died without a result ({how}){': ' + cause if cause else ''}", log_path=log_path
        )
    try:
        outcome, result = read_outcome(result_path)
    except ValidationError as exc:
        raise StageError(
            stage, f"its result ({result_path}) is not a child's result: {_wrong(exc)}", log_path=log_path
        ) from exc
    except ValueError as exc:  # json.JSONDecodeError
        raise StageError(stage, f"its result ({result_path}) is not JSON: {exc}", log_path=log_path) from exc
    if isinstance(outcome, ChildFailed):
        raise StageError(stage, outcome.error, outcome.traceback, log_path)
    try:
        return result_type.model_validate(result)
    except ValidationError as exc:
        raise StageError(
            stage, f"its result ({result_path}) does not match {result_type.__name__}: {_wrong(exc)}", log_path=log_path
        ) from exc
