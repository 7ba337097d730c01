"""`make setup` (quantverdict.processes.envs.main) builds the two stage environments at once and reports each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from quantverdict.config.schema import EnvConfig, Installer
from quantverdict.processes import envs, venv_build

pytestmark = pytest.mark.unit


def test_one_failing_environment_fails_setup_and_the_other_still_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "wheels"
    empty.mkdir()
    argv = [
        "envs",
        f"env.root={tmp_path / 'envs'}",
        f"env.wheelhouse={empty}",  # a venv from a folder without wheels is refused before pip runs
        "env.quantize.kind=python",
        f"env.quantize.python={sys.executable}",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    assert envs.main() == 1
    out, err = capsys.readouterr()
    assert f"quantize: {sys.executable}" in out.splitlines()
    assert "serve: " in err and "holds no wheels" in err
    assert not (tmp_path / "envs").exists() or not any((tmp_path / "envs").glob("serve-*"))


def test_index_lines_are_dropped_and_included_files_named_by_absolute_path(tmp_path: Path) -> None:
    src = tmp_path / "req"
    src.mkdir()
    (src / "serve.txt").write_text(
        "# CPU torch\n--extra-index-url https://download.pytorch.org/whl/cpu\n--index-url https://mirror/simple\n"
        "-i https://other/simple\ntorch==2.13.0+cpu\n-r base.txt\n-c pins.txt\n"
    )
    out = venv_build.without_indexes(src / "serve.txt", tmp_path)
    assert out == tmp_path / "serve.txt"
    assert out.read_text().splitlines() == [
        "# CPU torch",
        "torch==2.13.0+cpu",
        f"-r {src / 'base.txt'}",
        f"-c {src / 'pins.txt'}",
    ]


def test_install_commands_of_pip_and_uv(tmp_path: Path) -> None:
    py, req = tmp_path / "v" / "bin" / "python", [tmp_path / "a.txt"]
    pip = venv_build.install_command(py, "pip", req, None, ["https://idx/simple"])
    assert pip == [
        str(py), "-m", "pip", "--disable-pip-version-check", "install", "-q",
        "--extra-index-url", "https://idx/simple", "-r", str(req[0]),
    ]  # fmt: skip
    uv = venv_build.install_command(py, "/opt/uv", req, "/wh", ["https://idx/simple"])
    # a wheelhouse installs offline: no index at all, the extra ones dropped
    assert uv == [
        "/opt/uv", "pip", "install", "--python", str(py), "--index-strategy", "unsafe-best-match",
        "--compile-bytecode", "-q",
        "--no-index", "--find-links", "/wh", "-r", str(req[0]),
    ]  # fmt: skip


def test_the_installer_setting_picks_pip_uv_or_fails_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    uv = fake / "uv"
    uv.write_text("#!/bin/sh\n")
    uv.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "nowhere" / "python"))
    monkeypatch.setenv("PATH", str(fake))
    assert envs.installer_of(EnvConfig(name="cpu", installer=Installer.auto)) == str(uv)
    assert envs.installer_of(EnvConfig(name="cpu", installer=Installer.pip)) == "pip"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert envs.installer_of(EnvConfig(name="cpu", installer=Installer.auto)) == "pip"
    with pytest.raises(RuntimeError, match=r"env.installer=uv .*allowed: auto, pip, uv"):
        envs.installer_of(EnvConfig(name="cpu", installer=Installer.uv))


def test_how_the_environments_are_installed_does_not_change_a_jobs_id() -> None:
    from quantverdict.config.compose import compose
    from quantverdict.orchestrate.resume import config_hash

    same = compose(["env.installer=pip", "env.extra_index_urls=[https://mirror/whl/cpu]"])
    assert config_hash(same) == config_hash(compose([]))
    assert config_hash(compose(["env.base_python=python3.11"])) != config_hash(compose([]))  # a hashed env key
