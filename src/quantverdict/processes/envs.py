"""Stage environments: where the quantize and serve stages run.

llm-compressor (compressed-tensors 0.19.0) and vLLM (compressed-tensors 0.17.0) cannot share one
environment, so each stage runs in its own: either a virtual environment this project creates from
a pinned requirements file (``kind: venv``; idempotent, reused when its requirements are
unchanged), or an existing interpreter plus ``PYTHONPATH`` (``kind: python``; e.g. the prebuilt
targets on the GPU machine). The orchestrator never imports from them.

Run ``python -m quantverdict.processes.envs`` to create both environments of the default ``env`` config.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from quantverdict.config.compose import compose
from quantverdict.config.schema import Config, EnvConfig, StageEnvConfig

log = logging.getLogger(__name__)

SRC_DIR = Path(__file__).resolve().parents[2]  # .../src, put on the stage's PYTHONPATH


@dataclass(frozen=True)
class StageEnv:
    """A ready interpreter for one stage: ``python`` plus the environment variables it needs."""

    name: str
    python: str
    env: dict[str, str] = field(default_factory=dict)

    def module(self, module: str, *args: str) -> list[str]:
        """Command line running ``python -m module args...`` in this environment."""
        return [self.python, "-m", module, *args]

    def versions(self, *dists: str) -> dict[str, str]:
        """Installed versions of ``dists`` in this environment (missing ones are left out)."""
        code = (
            "import json,sys\nfrom importlib.metadata import version,PackageNotFoundError\nout={}\n"
            "for d in sys.argv[1:]:\n try: out[d]=version(d)\n except PackageNotFoundError: pass\n"
            "print(json.dumps(out))"
        )
        out = subprocess.run(
            [self.python, "-c", code, *dists],
            capture_output=True,
            text=True,
            env={**os.environ, **self.env},
            check=True,
        )
        import json

        return json.loads(out.stdout.strip().splitlines()[-1])


def _pythonpath(extra: list[str]) -> str:
    return os.pathsep.join([str(SRC_DIR), *extra])


def venv_dir(root: Path, stage: str, requirements: Path, base_python: str) -> Path:
    """``root/<stage>-<hash>``: the hash covers the requirements text and the base interpreter version."""
    ver = subprocess.run(
        [base_python, "-c", "import sys;print(sys.version)"], capture_output=True, text=True, check=True
    ).stdout
    digest = hashlib.sha256((requirements.read_text() + ver).encode()).hexdigest()[:10]
    return root / f"{stage}-{digest}"


def ensure(stage: str, cfg: StageEnvConfig, env_cfg: EnvConfig, project_root: Path) -> StageEnv:
    """Return the environment for ``stage``, creating the venv first if it does not exist yet.

    Creation is guarded by a file lock (two grids may start at once) and marked complete by a
    ``.ready`` file written last, so a half-built venv is rebuilt rather than used.

    Raises:
        RuntimeError: the install failed; the message holds the tail of pip's output.
    """
    extra = {"PYTHONPATH": _pythonpath(cfg.pythonpath), **cfg.env_vars}
    if cfg.kind == "python":
        return StageEnv(stage, cfg.python, extra)
    assert cfg.requirements is not None
    req = project_root / cfg.requirements
    root = Path(env_cfg.root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    target = venv_dir(root, stage, req, env_cfg.base_python)
    python = str(target / "bin" / "python")
    ready = target / ".ready"
    if ready.exists():
        return StageEnv(stage, python, extra)
    with open(root / f".{stage}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            _build(stage, target, req, cfg.uninstall, env_cfg.base_python)
    return StageEnv(stage, python, extra)


def _build(stage: str, target: Path, req: Path, uninstall: list[str], base_python: str) -> None:
    log.info("creating the %s environment in %s from %s (first time only; minutes)", stage, target, req)
    steps = [
        [base_python, "-m", "venv", "--clear", str(target)],
        [str(target / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "-r", str(req)],
    ]
    if uninstall:
        steps.append([str(target / "bin" / "pip"), "uninstall", "-y", "-q", *uninstall])
    for cmd in steps:
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-25:])
            raise RuntimeError(f"creating the {stage} environment failed at `{shlex.join(cmd)}`:\n{tail}")
    (target / ".ready").write_text(req.read_text())


def setup_config(overrides: list[str]) -> Config:
    """The config whose stage environments ``make setup`` builds: ``overrides`` composed with no data folder.

    Building environments reads no data, so the offline folder is neither needed nor checked: ``data.offline_root``
    is null whatever ``QV_DATA_ROOT`` or an override says.

    Raises:
        ConfigError: another problem of the config (:func:`quantverdict.config.compose.compose`).
    """
    kept = [o for o in overrides if not o.lstrip("+~").startswith("data.offline_root")]
    return compose([*kept, "data.offline_root=null"])


def main() -> None:
    """Create the stage environments of the default config (``make setup``)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    cfg = setup_config(sys.argv[1:])
    root = Path(cfg.paths.project_root)
    for stage in ("quantize", "serve"):
        env = ensure(stage, getattr(cfg.env, stage), cfg.env, root)
        print(f"{stage}: {env.python}")


if __name__ == "__main__":
    main()
