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
    venv_bin = tmp_path / "venv" / "bin"  # the pinned uv beside the orchestrator's python wins over PATH's
    venv_bin.mkdir(parents=True)
    (venv_bin / "uv").write_text("#!/bin/sh\n")
    (venv_bin / "uv").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    assert envs.installer_of(EnvConfig(name="cpu", installer=Installer.auto)) == str(venv_bin / "uv")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "nowhere" / "python"))
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


def test_included_files_lose_their_index_lines_too_and_relative_find_links_stay_found(tmp_path: Path) -> None:
    src, pins, out = tmp_path / "req", tmp_path / "pins", tmp_path / "out"
    for folder in (src / "wheels", src / "extra", pins, out):
        folder.mkdir(parents=True)
    (src / "top.txt").write_text(
        "--requirement=base.txt  # shared pins\n-rextra/base.txt\n--find-links wheels\n-f https://host/links\n"
        "six==1.17.0\n"
    )
    (src / "base.txt").write_text(
        "--extra-index-url https://download.pytorch.org/whl/cpu\ntorch==2.13.0+cpu\n--constraint ../pins/pins.txt\n"
    )
    (src / "extra" / "base.txt").write_text("-i https://mirror/simple\n-r ../base.txt\ngguf==0.19.0\n")
    (pins / "pins.txt").write_text("--index-url=https://mirror/simple\nnumpy==2.3.0\n")

    top = venv_build.without_indexes(src / "top.txt", out)
    # copied in the order met: top.txt, base.txt (from line 1), pins.txt (base.txt's -c), then extra/base.txt,
    # whose name is taken, under out/3 (three files copied before it); its -r ../base.txt is req/base.txt again,
    # copied once
    assert top == out / "top.txt"
    assert top.read_text().splitlines() == [
        f"-r {out / 'base.txt'}",
        f"-r {out / '3' / 'base.txt'}",
        f"--find-links {(src / 'wheels').resolve()}",  # pip reads a relative folder against the file's own
        "-f https://host/links",  # a URL: as written
        "six==1.17.0",
    ]
    assert (out / "base.txt").read_text().splitlines() == ["torch==2.13.0+cpu", f"-c {out / 'pins.txt'}"]
    assert (out / "pins.txt").read_text().splitlines() == ["numpy==2.3.0"]
    assert (out / "3" / "base.txt").read_text().splitlines() == [f"-r {out / 'base.txt'}", "gguf==0.19.0"]
    assert len(list(out.rglob("*.txt"))) == 4


def test_uv_is_not_picked_where_the_venv_sees_the_interpreters_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "uv").write_text("#!/bin/sh\n")
    (fake / "uv").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    # uv reads the venv's own site-packages only: it would install a container's CUDA torch again
    auto = EnvConfig(name="gpu", system_site_packages=True, installer=Installer.auto)
    assert envs.installer_of(auto) == "pip"
    with pytest.raises(RuntimeError, match=r"env.installer=uv cannot honour env.system_site_packages=true"):
        envs.installer_of(EnvConfig(name="gpu", system_site_packages=True, installer=Installer.uv))


def test_an_installer_that_cannot_start_is_a_build_error_naming_the_command(tmp_path: Path) -> None:
    broken = tmp_path / "uv"
    broken.write_text("#!/nowhere/interpreter\n")  # the file exists; the interpreter its first line names does not
    broken.chmod(0o755)
    with pytest.raises(venv_build.VenvBuildError, match=rf"`{broken} pip install -r a.txt` could not start"):
        venv_build._step([str(broken), "pip", "install", "-r", "a.txt"])


def test_a_base_interpreter_that_cannot_run_fails_both_environments_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "python3"
    monkeypatch.setattr(sys, "argv", ["envs", f"env.root={tmp_path / 'envs'}", f"env.base_python={missing}"])
    assert envs.main() == 1
    err = capsys.readouterr().err.splitlines()
    for stage in ("quantize", "serve"):
        assert any(line.startswith(f"{stage}: env.base_python='{missing}' cannot be run") for line in err)


def test_the_uv_pin_of_the_requirement_files_is_found(tmp_path: Path) -> None:
    (a := tmp_path / "a.txt").write_text("uvicorn==0.30.0\nmlflow==3.1.0\n")
    (b := tmp_path / "b.txt").write_text("# the installer\nuv==0.13.9  # pinned\nruff==0.8.0\n")
    assert venv_build.uv_requirement([a, b]) == "uv==0.13.9"
    assert venv_build.uv_requirement([a]) == "uv"  # uvicorn is not uv: the newest uv then


def test_with_uv_the_venvs_pip_installs_uv_first_and_uv_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (a := tmp_path / "a.txt").write_text("mlflow==3.1.0\n")
    (b := tmp_path / "b.txt").write_text("uv==0.13.9\n")
    steps: list[list[str]] = []
    monkeypatch.setattr(venv_build, "_step", steps.append)  # the commands, not run
    monkeypatch.setattr(venv_build, "interpreter_info", lambda _py: venv_build.Interpreter(False, "3.11", []))
    (target := tmp_path / "v").mkdir()
    py = venv_build.build(target, [a, b], "/usr/bin/python3", installer="uv", marker_text="m")
    assert py == target / "bin" / "python"
    assert steps == [
        ["/usr/bin/python3", "-m", "venv", "--clear", str(target)],
        [str(py), "-m", "pip", "--disable-pip-version-check", "install", "-q", "uv==0.13.9"],
        [
            str(target / "bin" / "uv"), "pip", "install", "--python", str(py), "--index-strategy", "unsafe-best-match",
            "--compile-bytecode", "-q", "-r", str(a), "-r", str(b),
        ],
    ]  # fmt: skip
    assert (target / ".ready").read_text() == "m"


def test_uv_is_refused_for_a_venv_that_sees_the_interpreters_packages(tmp_path: Path) -> None:
    with pytest.raises(venv_build.VenvBuildError, match="uv cannot honour --system-site-packages"):
        venv_build.build(tmp_path / "v", [], "/nowhere/python3", system_site_packages=True, installer="uv")
    assert not (tmp_path / "v").exists()  # refused before anything was made
