"""Stage environments: where the quantize and serve stages run.

llm-compressor (compressed-tensors 0.19.0) and vLLM (compressed-tensors 0.17.0) cannot share one
environment, so each stage runs in its own: either a virtual environment this project creates from
a pinned requirements file (``kind: venv``; idempotent, reused when its requirements are
unchanged; offline from ``env.wheelhouse``, seeing the interpreter's own packages with
``env.system_site_packages``: :mod:`quantverdict.processes.venv_build`), or an existing interpreter
plus ``PYTHONPATH`` (``kind: python``). The orchestrator never imports from them.

Run ``python -m quantverdict.processes.envs`` to create both environments of the default ``env`` config.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from quantverdict.config.compose import compose
from quantverdict.config.schema import Config, EnvConfig, Installer, StageEnvConfig
from quantverdict.processes import venv_build

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

    def torch_build(self) -> dict[str, str | None]:
        """``{"torch": version, "cuda": the CUDA it was built for, or None for a CPU-only build}``; torch None when
        this environment has no torch; ``error`` (the last lines it printed) when importing it fails."""
        code = (
            "import json\ntry:\n import torch\n print(json.dumps({'torch': torch.__version__, "
            "'cuda': torch.version.cuda}))\nexcept ImportError:\n print(json.dumps({'torch': None, 'cuda': None}))"
        )
        out = subprocess.run([self.python, "-c", code], capture_output=True, text=True, env={**os.environ, **self.env})
        import json

        if out.returncode != 0 or not out.stdout.strip():
            tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-5:])
            return {"torch": None, "cuda": None, "error": tail or f"exit {out.returncode}"}
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

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


def venv_dir(
    root: Path, stage: str, requirements: Path, base_python: str, wheelhouse: bool = False, system_site: bool = False
) -> Path:
    """``root/<stage>-<hash>``: the hash covers the requirements text, the base interpreter's version and whether the
    venv sees the interpreter's own packages. Not where the wheels came from: the same pins make the same venv,
    so a later job without ``env.wheelhouse`` reuses one made offline."""
    ver = subprocess.run(
        [base_python, "-c", "import sys;print(sys.version)"], capture_output=True, text=True, check=True
    ).stdout
    flags = f"system_site_packages={system_site}" if system_site else ""
    digest = hashlib.sha256((requirements.read_text() + ver + flags).encode()).hexdigest()[:10]
    return root / f"{stage}-{digest}"


def stage_env_vars(cfg: StageEnvConfig, env_cfg: EnvConfig) -> dict[str, str]:
    """The variables a stage's processes get: ``PYTHONPATH`` (this checkout's src), the stage's own, and with a
    wheelhouse ``PIP_NO_INDEX``/``PIP_FIND_LINKS`` (a stage's own pip call, e.g. the embedded model's package,
    then installs from it too)."""
    extra = {"PYTHONPATH": _pythonpath(cfg.pythonpath), **cfg.env_vars}
    if env_cfg.wheelhouse:
        extra |= {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(Path(env_cfg.wheelhouse).expanduser().resolve())}
    return extra


def installer_of(env_cfg: EnvConfig) -> str:
    """``pip`` or the path of the uv executable that ``env.installer`` picks: the one beside the orchestrator's
    python (a venv's ``bin``: the version requirements/dev.txt pins), else uv on ``PATH``. With
    ``env.system_site_packages`` ``auto`` picks pip: uv reads only the venv's own site-packages, so it would install
    again what the interpreter provides (a container's CUDA torch), or fail offline where the wheelhouse leaves it
    out (https://github.com/astral-sh/uv/issues/4466).

    Raises:
        RuntimeError: ``env.installer=uv`` and no uv is found, or ``env.system_site_packages`` is set as well.
    """
    if env_cfg.installer == Installer.pip:
        return "pip"
    if env_cfg.system_site_packages:
        if env_cfg.installer == Installer.uv:
            raise RuntimeError(
                "env.installer=uv cannot honour env.system_site_packages=true (uv does not see the interpreter's "
                "packages and installs them again): env.installer=pip or auto (allowed: auto, pip, uv)"
            )
        return "pip"
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None and env_cfg.installer == Installer.uv:
        raise RuntimeError(
            "env.installer=uv but no uv executable is on PATH or beside this python: `pip install uv`, or "
            "env.installer=pip (allowed: auto, pip, uv)"
        )
    return uv or "pip"


def ensure(stage: str, cfg: StageEnvConfig, env_cfg: EnvConfig, project_root: Path) -> StageEnv:
    """Return the environment for ``stage``, creating the venv first if it does not exist yet.

    Creation is guarded by a file lock (two grids may start at once) and marked complete by a
    ``.ready`` file written last, so a half-built venv is rebuilt rather than used.

    Raises:
        RuntimeError: the install failed (the message holds the command and the tail of its output), the base
            interpreter cannot be run, or ``env.installer`` cannot be honoured (:func:`installer_of`).
    """
    extra = stage_env_vars(cfg, env_cfg)
    if cfg.kind == "python":
        return StageEnv(stage, cfg.python, extra)
    assert cfg.requirements is not None
    req = project_root / cfg.requirements
    wheelhouse = str(Path(env_cfg.wheelhouse).expanduser().resolve()) if env_cfg.wheelhouse else None
    if wheelhouse and not Path(wheelhouse, "wheelhouse.json").is_file() and not any(Path(wheelhouse).glob("*.whl")):
        raise RuntimeError(
            f"env.wheelhouse={env_cfg.wheelhouse!r} holds no wheels: make it on a connected machine with "
            "`python -m quantverdict.processes.wheelhouse --out DIR` and give its folder"
        )
    root = Path(env_cfg.root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    try:
        target = venv_dir(root, stage, req, env_cfg.base_python, bool(wheelhouse), env_cfg.system_site_packages)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(f"env.base_python={env_cfg.base_python!r} cannot be run: {exc}") from None
    python = str(target / "bin" / "python")
    ready = target / venv_build.READY
    if ready.exists():
        return StageEnv(stage, python, extra)
    installer = installer_of(env_cfg)
    with open(root / f".{stage}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            log.info(
                "creating the %s environment in %s from %s with %s (first time only; minutes)",
                stage,
                target,
                req,
                "pip" if installer == "pip" else "uv",
            )
            try:
                venv_build.build(
                    target,
                    [req],
                    env_cfg.base_python,
                    wheelhouse=wheelhouse,
                    system_site_packages=env_cfg.system_site_packages,
                    uninstall=cfg.uninstall,
                    marker_text=req.read_text(),
                    installer=installer,
                    extra_index_urls=env_cfg.extra_index_urls,
                )
            except venv_build.VenvBuildError as exc:
                raise RuntimeError(f"creating the {stage} environment failed: {exc}") from None
    return StageEnv(stage, python, extra)


def setup_config(overrides: list[str]) -> Config:
    """The config whose stage environments ``make setup`` builds: ``overrides`` composed with no data folder.

    Building environments reads no data, so the offline folder is neither needed nor checked: ``data.offline_root``
    is null whatever ``QV_DATA_ROOT`` or an override says.

    Raises:
        ConfigError: another problem of the config (:func:`quantverdict.config.compose.compose`).
    """
    kept = [o for o in overrides if not o.lstrip("+~").startswith("data.offline_root")]
    return compose([*kept, "data.offline_root=null"])


def main() -> int:
    """Create the stage environments of the default config (``make setup``), both at once: each install spends
    most of its time downloading and unpacking wheels, so the two overlap. Exit status 1 when either fails (its
    error printed; the other still finishes)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    cfg = setup_config(sys.argv[1:])
    root = Path(cfg.paths.project_root)
    stages = ("quantize", "serve")
    with ThreadPoolExecutor(max_workers=len(stages)) as pool:
        jobs = {stage: pool.submit(ensure, stage, getattr(cfg.env, stage), cfg.env, root) for stage in stages}
    failed = False
    for stage, job in jobs.items():
        try:
            print(f"{stage}: {job.result().python}")
        except RuntimeError as exc:
            print(f"{stage}: {exc}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
