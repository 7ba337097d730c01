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
pip for a stage's own installs. ``--installer uv`` on the command line first installs uv into the new venv with its
pip (the ``uv==`` pin of the requirement files, if they hold one), then everything else with that uv: the
orchestrator's venv in a fraction of pip's time. uv reads no pip configuration file: an index or a folder of wheels
that pip's configuration names is handed to it through ``UV_INDEX_URL`` / ``UV_FIND_LINKS``.
"""

from __future__ import annotations

import argparse
import json
import re
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


# requirement-file options (pip's forms: ``-x VALUE``, ``-xVALUE``, ``--long VALUE``, ``--long=VALUE``)
INDEX_OPTIONS = ("--extra-index-url", "--index-url", "-i")  # name a package index
INCLUDE_OPTIONS = ("--requirement", "--constraint", "-r", "-c")  # name another requirements file
FIND_LINKS_OPTIONS = ("--find-links", "-f")  # a folder or page of archives; relative: to the file's folder
_COMMENT = re.compile(r"(^|\s+)#.*$")  # pip's rule: a '#' at the start or after whitespace begins a comment


def requirement_option(line: str, names: Sequence[str]) -> tuple[str, str] | None:
    """``(option, value)`` when the requirements-file ``line`` is one of the options ``names`` (as written, in any of
    pip's forms, the comment dropped); None for any other line."""
    text = _COMMENT.sub("", line).strip()
    for name in names:
        if name.startswith("--"):
            if text.startswith((f"{name}=", f"{name} ", f"{name}\t")):
                return name, text[len(name) + 1 :].strip()
        elif text.startswith(name) and not text.startswith("--") and len(text) > len(name):
            return name, text[len(name) :].strip()
    return None


def without_indexes(req: Path, folder: Path, copies: dict[Path, Path] | None = None) -> Path:
    """A copy of the requirements file ``req`` in ``folder`` without its index lines (:data:`INDEX_OPTIONS`), and so
    for every file it includes (:data:`INCLUDE_OPTIONS`), whose lines then name the copy. A relative
    ``--find-links`` folder that exists beside ``req`` is named by absolute path (pip reads it relative to the
    file); an included file given by URL is left as it is, a missing one named by absolute path (pip says so).

    The copy is ``folder/<name>``, or ``folder/<n>/<name>`` where that name is taken; ``copies`` maps the files
    copied so far (resolved) to their copies (shared by the files of one install; a file included twice is
    copied once).
    """
    copies = {} if copies is None else copies
    src = req.resolve()
    if src in copies:
        return copies[src]
    out = folder / req.name
    if out in copies.values():
        out = folder / str(len(copies)) / req.name
    copies[src] = out
    lines = []
    for line in src.read_text().splitlines():
        if requirement_option(line, INDEX_OPTIONS):
            continue
        if (included := requirement_option(line, INCLUDE_OPTIONS)) and "://" not in included[1]:
            flag, name = "-c" if included[0] in ("-c", "--constraint") else "-r", src.parent / included[1]
            line = f"{flag} {without_indexes(name, folder, copies) if name.is_file() else name.resolve()}"
        elif (links := requirement_option(line, FIND_LINKS_OPTIONS)) and (src.parent / links[1]).exists():
            line = f"--find-links {(src.parent / links[1]).resolve()}"
        lines.append(line)
    out.parent.mkdir(parents=True, exist_ok=True)
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


def uv_requirement(requirements: Sequence[Path]) -> str:
    """The requirement line that pins uv in ``requirements`` (``uv==0.13.9``), or ``uv`` when none does."""
    for req in requirements:
        for line in req.read_text().splitlines():
            text = _COMMENT.sub("", line).strip()
            if re.match(r"uv(?![\w.-])", text):
                return text
    return "uv"


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
        installer: ``pip``, the path of a uv executable (:func:`install_command`), or ``uv``: uv installed into
            the new venv by its pip first (:func:`uv_requirement`), then used for the requirements.
        extra_index_urls: the indexes asked besides PyPI instead of the requirement files' own index lines; None
            keeps those lines.

    Returns:
        The venv's python.

    Raises:
        VenvBuildError: a step failed (venv creation, pip); the message has the command and pip's last lines. Or
            uv was asked for a venv that sees the interpreter's packages: uv does not see them and would install
            them again (https://github.com/astral-sh/uv/issues/4466).
    """
    if installer != "pip" and system_site_packages:
        raise VenvBuildError(
            "uv cannot honour --system-site-packages (it installs the interpreter's packages again): use pip"
        )
    info = interpreter_info(base_python)
    create = [base_python, "-m", "venv", "--clear"]
    if system_site_packages:
        create.append("--system-site-packages")
    _step([*create, str(target)])
    python = target / "bin" / "python"
    if system_site_packages and info.in_venv:
        own_site = interpreter_info(str(python)).site[0]
        Path(own_site, PARENT_PTH).write_text("".join(f"{s}\n" for s in info.site))
    if installer == "uv":  # bootstrapped: pip brings the one wheel, uv the rest
        _step(install_command(python, "pip", [], wheelhouse, extra_index_urls or ()) + [uv_requirement(requirements)])
        installer = str(target / "bin" / "uv")
    with tempfile.TemporaryDirectory() as tmp:
        if extra_index_urls is not None:
            copies: dict[Path, Path] = {}
            requirements = [without_indexes(req, Path(tmp), copies) for req in requirements]
        _step(install_command(python, installer, requirements, wheelhouse, extra_index_urls or ()))
    if uninstall:
        _step([str(python), "-m", "pip", "uninstall", "-y", "-q", *uninstall])
    (target / READY).write_text(marker_text)
    return python


def _step(cmd: list[str]) -> None:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:  # the program, or the interpreter its first line names, cannot be started
        raise VenvBuildError(f"`{shlex.join(cmd)}` could not start: {exc}") from None
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-25:])
        raise VenvBuildError(f"`{shlex.join(cmd)}` failed (exit {res.returncode}):\n{tail}")


def main(argv: Sequence[str] | None = None) -> int:
    """``venv_build.py TARGET REQUIREMENTS... [--wheelhouse DIR] [--system-site-packages] [--python PY]
    [--installer pip|uv]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("target", type=Path)
    ap.add_argument("requirements", type=Path, nargs="+")
    ap.add_argument("--wheelhouse", default=None, help="install offline from this folder of wheels")
    ap.add_argument("--system-site-packages", action="store_true", help="see the interpreter's own packages")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that creates the venv")
    ap.add_argument(
        "--installer", choices=("pip", "uv"), default="pip", help="uv: installed into the venv first, then used"
    )
    a = ap.parse_args(argv)
    try:
        build(
            a.target,
            a.requirements,
            a.python,
            wheelhouse=a.wheelhouse or None,
            system_site_packages=a.system_site_packages,
            marker_text="".join(p.read_text() for p in a.requirements),
            installer=a.installer,
        )
    except VenvBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
