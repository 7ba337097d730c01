"""Create a virtual environment from requirement files: from an index, or offline from a wheelhouse.

Standard library only, so that it also builds the orchestrator's own venv before anything else is installed
(``make setup``: ``python3 src/quantverdict/processes/venv_build.py .venv requirements/orchestrator.txt ...``).

Two options matter on GPU hosts:

- ``wheelhouse``: install with ``pip install --no-index --find-links WHEELHOUSE`` (an air-gapped host; the wheels
  come from ``python -m quantverdict.processes.wheelhouse`` run on a connected machine).
- ``system_site_packages``: the venv sees the interpreter's own packages (a CUDA torch that an NGC container or a
  cluster module provides), and pip installs only what they do not already satisfy. When the interpreter that
  creates the venv is itself a venv (``sys.prefix != sys.base_prefix``, as in many containers), Python's
  ``--system-site-packages`` exposes the *base* installation, not that venv's packages; the parent venv's
  site-packages folders are then added through a ``.pth`` file (:data:`PARENT_PTH`), so the new venv sees what
  the interpreter sees.

The installer is pip (``python -m pip`` of the new venv) or uv (``uv pip install --python``: the same requirement
files, resolved with ``--index-strategy unsafe-best-match``, pip's rule of taking the best version over all
indexes, and compiled to bytecode as pip does). The venv itself is always made by ``python -m venv``, so it has
pip for a stage's own installs.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PARENT_PTH = "_quantverdict_parent_site.pth"
READY = ".ready"

_SITE_CODE = (
    "import json,sys,sysconfig,site\n"
    "p=sysconfig.get_paths()\n"
    "print(json.dumps({'in_venv': sys.prefix != sys.base_prefix, 'version': sys.version,"
    " 'site': sorted({p['purelib'], p['platlib']})}))"
)


class VenvBuildError(RuntimeError):
    """A step of the build failed; the message names the command and holds the tail of its output."""


@dataclass(frozen=True)
class Interpreter:
    """What :func:`interpreter_info` reads off an interpreter."""

    in_venv: bool  # sys.prefix != sys.base_prefix
    version: str  # sys.version
    site: list[str]  # its site-packages folders (purelib, platlib)


def interpreter_info(python: str) -> Interpreter:
    """Whether the interpreter ``python`` runs in a venv, its version and its site-packages folders.

    Raises:
        VenvBuildError: the interpreter cannot be run.
    """
    try:
        out = subprocess.run([python, "-c", _SITE_CODE], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise VenvBuildError(f"cannot run the interpreter {python!r}: {exc}") from None
    data = json.loads(out.strip().splitlines()[-1])
    return Interpreter(bool(data["in_venv"]), str(data["version"]), [str(s) for s in data["site"]])


INDEX_OPTIONS = ("--extra-index-url", "--index-url", "-i ")  # requirement-file lines that name a package index


def without_indexes(req: Path, folder: Path) -> Path:
    """A copy of the requirements file ``req`` in ``folder`` without its index lines (:data:`INDEX_OPTIONS`); a
    ``-r``/``-c`` line names its file by absolute path (relative ones resolve against ``req``'s folder)."""
    lines = []
    for line in req.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith(INDEX_OPTIONS):
            continue
        if stripped.startswith(("-r ", "-c ")):
            flag, name = stripped.split(maxsplit=1)
            line = f"{flag} {(req.parent / name).resolve()}"
        lines.append(line)
    out = folder / req.name
    out.write_text("\n".join(lines) + "\n")
    return out


def pip_install_args(
    requirements: Sequence[Path], wheelhouse: str | None, extra_index_urls: Sequence[str] = ()
) -> list[str]:
    """The arguments after ``pip`` (or ``uv pip``) that install ``requirements``: offline from ``wheelhouse`` when
    given, else from PyPI and ``extra_index_urls``."""
    args = ["install", "-q"]
    if wheelhouse:
        args += ["--no-index", "--find-links", str(wheelhouse)]
    else:
        args += [a for url in extra_index_urls for a in ("--extra-index-url", url)]
    for req in requirements:
        args += ["-r", str(req)]
    return args


def install_command(
    python: Path, installer: str, requirements: Sequence[Path], wheelhouse: str | None, extra_index_urls: Sequence[str]
) -> list[str]:
    """The command that installs ``requirements`` into the venv of ``python``: ``installer`` is ``pip`` or the path
    of a uv executable."""
    args = pip_install_args(requirements, wheelhouse, extra_index_urls)
    if installer == "pip":
        return [str(python), "-m", "pip", "--disable-pip-version-check", *args]
    uv = [installer, "pip", args[0], "--python", str(python), "--index-strategy", "unsafe-best-match"]
    return [*uv, "--compile-bytecode", *args[1:]]  # as pip does: a read-only venv still starts fast


def build(
    target: Path,
    requirements: Sequence[Path],
    base_python: str = sys.executable,
    *,
    wheelhouse: str | None = None,
    system_site_packages: bool = False,
    uninstall: Sequence[str] = (),
    marker_text: str = "",
    installer: str = "pip",
    extra_index_urls: Sequence[str] | None = None,
) -> Path:
    """Create (or re-create) the venv ``target`` and install ``requirements`` into it.

    The file ``target/.ready`` (holding ``marker_text``) is written last: a venv without it is incomplete.

    Args:
        target: the venv folder; emptied first.
        requirements: requirement files for one ``pip install``.
        base_python: the interpreter that creates the venv.
        wheelhouse: a folder of wheels: install offline from it (``--no-index --find-links``).
        system_site_packages: let the venv see the interpreter's packages (see the module docstring).
        uninstall: distributions removed after the install.
        marker_text: written into ``.ready``.
        installer: ``pip``, or the path of a uv executable (:func:`install_command`).
        extra_index_urls: the indexes asked besides PyPI instead of the requirement files' own index lines; None
            keeps those lines.

    Returns:
        The venv's python.

    Raises:
        VenvBuildError: a step failed (venv creation, pip); the message has the command and pip's last lines.
    """
    info = interpreter_info(base_python)
    create = [base_python, "-m", "venv", "--clear"]
    if system_site_packages:
        create.append("--system-site-packages")
    _step([*create, str(target)])
    python = target / "bin" / "python"
    if system_site_packages and info.in_venv:
        own_site = interpreter_info(str(python)).site[0]
        Path(own_site, PARENT_PTH).write_text("".join(f"{s}\n" for s in info.site))
    with tempfile.TemporaryDirectory() as tmp:
        if extra_index_urls is not None:
            requirements = [without_indexes(req, Path(tmp)) for req in requirements]
        _step(install_command(python, installer, requirements, wheelhouse, extra_index_urls or ()))
    if uninstall:
        _step([str(python), "-m", "pip", "uninstall", "-y", "-q", *uninstall])
    (target / READY).write_text(marker_text)
    return python


def _step(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-25:])
        raise VenvBuildError(f"`{shlex.join(cmd)}` failed (exit {res.returncode}):\n{tail}")


def main(argv: Sequence[str] | None = None) -> int:
    """``venv_build.py TARGET REQUIREMENTS... [--wheelhouse DIR] [--system-site-packages] [--python PY]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("target", type=Path)
    ap.add_argument("requirements", type=Path, nargs="+")
    ap.add_argument("--wheelhouse", default=None, help="install offline from this folder of wheels")
    ap.add_argument("--system-site-packages", action="store_true", help="see the interpreter's own packages")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that creates the venv")
    a = ap.parse_args(argv)
    try:
        build(
            a.target,
            a.requirements,
            a.python,
            wheelhouse=a.wheelhouse or None,
            system_site_packages=a.system_site_packages,
            marker_text="".join(p.read_text() for p in a.requirements),
        )
    except VenvBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
