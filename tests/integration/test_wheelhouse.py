"""A wheelhouse made by the command, and venvs created offline from it (pip --no-index).

The requirement set is small on purpose: one pure-Python package that needs six (ecdsa, or rfc3339-validator where
the interpreters here already have ecdsa). The interpreter running the tests is the orchestrator's venv, which has
six: given that venv's freeze as the target's, the wheelhouse holds the package alone, and a venv that sees its base
interpreter's packages installs from it offline. Needs PyPI (the wheelhouse is made on a connected machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quantverdict.processes import venv_build, wheelhouse

pytestmark = pytest.mark.integration

THIS_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# (distribution, version, module, wheel file): pure Python, each needs six and nothing else
CANDIDATES = [
    ("ecdsa", "0.19.1", "ecdsa", "ecdsa-0.19.1-py2.py3-none-any.whl"),
    ("rfc3339-validator", "0.1.4", "rfc3339_validator", "rfc3339_validator-0.1.4-py2.py3-none-any.whl"),
]


def _has(python: str, module: str) -> bool:
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def package() -> tuple[str, str, str, str]:
    """A candidate neither this venv nor its base interpreter has (the new venv must get it from the wheels)."""
    base = getattr(sys, "_base_executable", sys.executable)
    for c in CANDIDATES:
        if not _has(sys.executable, c[2]) and not _has(base, c[2]):
            return c
    pytest.skip("the interpreters here already have every candidate package")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, package: tuple[str, str, str, str]) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("wh")
    req = tmp / "requirements.txt"
    req.write_text(f"# a pure-Python package that needs six\n{package[0]}=={package[1]}\n")
    freeze = tmp / "target.freeze"
    freeze.write_text(subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True).stdout)
    assert "six==" in freeze.read_text()
    out = tmp / "wheels"
    installed = wheelhouse.read_installed(freeze.read_text().splitlines())
    manifest = wheelhouse.make(out, {"stage": req}, installed, wheelhouse.Target(THIS_PYTHON), extra_pins=[])
    assert manifest["sets"]["stage"]["included"] == {package[0]: package[1]}
    assert manifest["sets"]["stage"]["left_out_installed"] == {"six": installed["six"]}
    return out, req


def test_the_wheelhouse_holds_only_what_the_target_lacks(
    made: tuple[Path, Path], package: tuple[str, str, str, str]
) -> None:
    out, _ = made
    assert sorted(p.name for p in out.glob("*.whl")) == [package[3]]
    manifest = json.loads((out / wheelhouse.MANIFEST).read_text())
    assert (
        manifest["python_version"] == THIS_PYTHON and manifest["bytes"] == (out / manifest["wheels"][0]).stat().st_size
    )


def test_a_venv_that_sees_its_interpreters_packages_installs_offline(
    made: tuple[Path, Path], package: tuple[str, str, str, str], tmp_path: Path
) -> None:
    out, req = made
    # the interpreter is itself a venv: its own site-packages reach the new venv through a .pth file
    python = venv_build.build(tmp_path / "v", [req], sys.executable, wheelhouse=str(out), system_site_packages=True)
    r = subprocess.run(
        [str(python), "-c", f"import {package[2]} as p, six; print(p.__file__, six.__file__)"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    own, inherited = r.stdout.split()
    assert own.startswith(str(tmp_path / "v")) and not inherited.startswith(str(tmp_path / "v"))
    assert (tmp_path / "v" / venv_build.READY).is_file()


def test_without_the_interpreters_packages_the_offline_install_names_what_is_missing(
    made: tuple[Path, Path], tmp_path: Path
) -> None:
    out, req = made
    with pytest.raises(venv_build.VenvBuildError, match=r"--no-index.*\n(.|\n)*six"):
        venv_build.build(tmp_path / "v", [req], sys.executable, wheelhouse=str(out), system_site_packages=False)
    assert not (tmp_path / "v" / venv_build.READY).exists()


def test_the_command_refuses_a_missing_freeze_and_an_unknown_env(tmp_path: Path) -> None:
    assert wheelhouse.main(["--out", str(tmp_path / "w"), "--installed", str(tmp_path / "nope")]) == 2
    assert wheelhouse.main(["--out", str(tmp_path / "w"), "--env", "gpx"]) == 2
    assert not (tmp_path / "w").exists()
