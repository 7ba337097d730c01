"""env=auto, the GPU stack checks and the driver's CUDA version: values worked out from the rules and the captured
output of nvidia-smi on an H200 host (driver 580.159.04)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from quantverdict.config import device_pick
from quantverdict.config.compose import CONF_DIR, compose
from quantverdict.config.schema import ConfigError
from quantverdict.orchestrate.hardware import check_torch_cuda, driver_cuda_version

pytestmark = pytest.mark.unit

NO_GPU = "auto: no CUDA GPU visible (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES hides them)"
H200_L = (
    "GPU 0: NVIDIA H200 (UUID: GPU-a48f4c30-7fc2-21cd-c8c5-7adb7486b486)\n"
    "GPU 1: NVIDIA H200 (UUID: GPU-4d8d8a84-cbed-9747-95cd-d830557304f2)\n"
)
# the banner of `nvidia-smi` on that host, as it printed it
H200_BANNER = (
    "Fri Dec  4 18:49:56 2026       \n"
    "+-----------------------------------------------------------------------------------------+\n"
    "| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |\n"
    "+-----------------------------------------+------------------------+----------------------+\n"
)


def _program(tmp_path: Path, text: str, name: str = "nvidia-smi") -> str:
    """A stand-in program that prints ``text`` whatever its arguments."""
    (tmp_path / "out.txt").write_text(text)
    p = tmp_path / name
    p.write_text(f"#!/bin/sh\ncat {tmp_path / 'out.txt'}\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_auto_picks_cpu_without_a_gpu_and_the_profiles_follow() -> None:
    out = device_pick.expand(["scheme=awq"], CONF_DIR, gpus=lambda: [])
    assert out == ["scheme=awq", "env=cpu", f"env.picked_by='{NO_GPU}'", "eval=cpu", "bench=cpu"]


def test_auto_picks_gpu_when_one_is_visible() -> None:
    out = device_pick.expand(["-m", "scheme=bf16,fp8", "env=auto"], CONF_DIR, gpus=lambda: ["NVIDIA H200"] * 2)
    assert out == [
        "-m",
        "scheme=bf16,fp8",
        "env=gpu",
        "env.picked_by='auto: 2 CUDA GPU(s) visible (NVIDIA H200)'",
        "eval=gpu",
        "bench=gpu",
    ]


def test_a_given_env_keeps_the_profiles_given_and_fills_the_rest() -> None:
    out = device_pick.expand(["env=gpu", "eval=gpu-server"], CONF_DIR, gpus=lambda: [])
    assert out == ["env=gpu", "eval=gpu-server", "env.picked_by='given (env=gpu)'", "bench=gpu"]
    # a sweep over environments is the user's to spell out
    assert device_pick.expand(["-m", "env=cpu,gpu"], CONF_DIR, gpus=lambda: ["x"]) == ["-m", "env=cpu,gpu"]


def test_the_added_overrides_join_the_typed_ones_not_a_flag() -> None:
    # argparse takes one run of Hydra overrides: the added ones go right after the typed run, or before every flag
    added = ["env=cpu", f"env.picked_by='{NO_GPU}'", "eval=cpu", "bench=cpu"]
    out = device_pick.expand(["scheme=fp8", "--cfg", "job"], CONF_DIR, gpus=lambda: [])
    assert out == ["scheme=fp8", *added, "--cfg", "job"]
    assert device_pick.expand(["--info"], CONF_DIR, gpus=lambda: []) == [*added, "--info"]
    out = device_pick.expand(["--cfg", "job", "scheme=fp8", "~tracking", "--help"], CONF_DIR, gpus=lambda: [])
    assert out == ["--cfg", "job", "scheme=fp8", "~tracking", *added, "--help"]


def test_the_command_line_with_a_flag_after_the_overrides_parses() -> None:
    from hydra._internal.utils import get_args_parser

    argv = device_pick.expand(["scheme=fp8", "--cfg", "job"], CONF_DIR, gpus=lambda: [])
    args = get_args_parser().parse_args(argv)
    assert (args.cfg, args.overrides[0], args.overrides[-1]) == ("job", "scheme=fp8", "bench=cpu")


def test_compose_on_this_host_resolves_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU on any host
    cfg = compose(["tracking.enabled=false"])
    assert (cfg.env.name, str(cfg.env.device), cfg.env.picked_by) == ("cpu", "cpu", NO_GPU)
    assert (cfg.eval.name, cfg.bench.name) == ("cpu", "cpu")


def test_visible_gpus_reads_nvidia_smi_and_cuda_visible_devices(tmp_path: Path) -> None:
    smi = _program(tmp_path, H200_L)
    assert device_pick.visible_gpus(smi, cuda_visible_devices="0,1") == ["NVIDIA H200", "NVIDIA H200"]
    assert device_pick.visible_gpus(smi, cuda_visible_devices="1") == ["NVIDIA H200"]
    assert device_pick.visible_gpus(smi, cuda_visible_devices="GPU-4d8d8a84-cbed-9747-95cd-d830557304f2") == [
        "NVIDIA H200"
    ]
    assert device_pick.visible_gpus(smi, cuda_visible_devices="") == []
    assert device_pick.visible_gpus(smi, cuda_visible_devices="-1") == []
    assert device_pick.visible_gpus(str(tmp_path / "missing"), cuda_visible_devices="0") == []


def test_the_drivers_cuda_version_from_the_banner(tmp_path: Path) -> None:
    assert driver_cuda_version(_program(tmp_path, H200_BANNER)) == (13, 0)
    assert driver_cuda_version(str(tmp_path / "missing")) is None


def test_a_cpu_only_torch_in_a_gpu_env_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"env=gpu: the serve environment \(/v/bin/python\) has torch 2.13.0\+cpu, a CPU-only build"
    ):
        check_torch_cuda("serve", {"torch": "2.13.0+cpu", "cuda": None}, (13, 0), "/v/bin/python")
    with pytest.raises(ConfigError, match="has no torch"):
        check_torch_cuda("quantize", {"torch": None, "cuda": None}, (13, 0))


def test_a_driver_older_than_the_wheels_cuda_is_refused_and_minor_versions_pass() -> None:
    with pytest.raises(
        ConfigError, match=r"built for CUDA 13.0, and this host's NVIDIA driver supports CUDA up to 12.8"
    ):
        check_torch_cuda("serve", {"torch": "2.11.0", "cuda": "13.0"}, (12, 8))
    check_torch_cuda("serve", {"torch": "2.11.0", "cuda": "13.0"}, (13, 0))
    check_torch_cuda("serve", {"torch": "2.11.0", "cuda": "13.1"}, (13, 0))  # minor version compatibility
    check_torch_cuda("serve", {"torch": "2.9.0", "cuda": "12.8"}, (13, 0))
    check_torch_cuda("serve", {"torch": "2.11.0", "cuda": "13.0"}, None)  # driver not known: not judged


def test_a_wheelhouse_env_installs_offline_in_its_stages_too(tmp_path: Path) -> None:
    from quantverdict.config.schema import EnvConfig, StageEnvConfig
    from quantverdict.processes.envs import stage_env_vars, venv_dir

    stage = StageEnvConfig(env_vars={"TOKENIZERS_PARALLELISM": "false"})
    online = stage_env_vars(stage, EnvConfig(name="gpu"))
    assert "PIP_NO_INDEX" not in online and online["TOKENIZERS_PARALLELISM"] == "false"
    offline = stage_env_vars(stage, EnvConfig(name="gpu", wheelhouse=str(tmp_path)))
    assert (offline["PIP_NO_INDEX"], offline["PIP_FIND_LINKS"]) == ("1", str(tmp_path.resolve()))
    # a venv that sees the interpreter's packages is another venv; one made offline is the same venv (same pins)
    req = tmp_path / "r.txt"
    req.write_text("six==1.17.0\n")
    plain, offline, system = (venv_dir(tmp_path, "serve", req, "python3", w, s) for w, s in ((0, 0), (1, 0), (0, 1)))
    assert plain == offline != system and plain.name.startswith("serve-")


def test_a_torch_that_does_not_import_is_named() -> None:
    with pytest.raises(ConfigError, match=r"importing torch in the serve environment failed:\nImportError: libcudart"):
        check_torch_cuda("serve", {"torch": None, "cuda": None, "error": "ImportError: libcudart.so.13"}, (13, 0))


def test_a_gpu_hosts_offline_keys_come_from_its_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QV_WHEELHOUSE", str(tmp_path))
    monkeypatch.setenv("QV_SYSTEM_SITE_PACKAGES", "true")
    cfg = compose(["env=gpu", "tracking.enabled=false"])
    assert (cfg.env.wheelhouse, cfg.env.system_site_packages) == (str(tmp_path), True)
    monkeypatch.delenv("QV_WHEELHOUSE")
    monkeypatch.delenv("QV_SYSTEM_SITE_PACKAGES")
    cfg = compose(["env=gpu", "tracking.enabled=false"])
    assert (cfg.env.wheelhouse, cfg.env.system_site_packages) == (None, False)
