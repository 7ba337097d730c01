"""Which resolved distributions a wheelhouse holds and which the target already has: a pip installation report
written by hand, the outcome worked out from the dependency graph."""

from __future__ import annotations

import pytest
from packaging.requirements import Requirement

from quantverdict.processes.wheelhouse import Target, read_installed, select

pytestmark = pytest.mark.unit


def _item(
    name: str, version: str, requires: list[str], requested: bool = False, extras: list[str] | None = None
) -> dict:
    item = {"metadata": {"name": name, "version": version, "requires_dist": requires}, "requested": requested}
    if extras:
        item["requested_extras"] = extras
    return item


# vllm -> torch (-> nvidia-cublas), numpy, uvloop (linux only), pywin32 (windows only); lm-eval[hf] -> accelerate
REPORT = {
    "install": [
        _item(
            "vllm",
            "0.26.0",
            ["torch==2.11.0", "numpy>=1.26", "uvloop; sys_platform != 'win32'", "pywin32; sys_platform == 'win32'"],
            requested=True,
        ),
        _item("torch", "2.11.0", ["nvidia-cublas==13.1.0.3; platform_system == 'Linux'", "filelock"]),
        _item("nvidia-cublas", "13.1.0.3", []),
        _item("filelock", "3.20.0", []),
        _item("numpy", "2.4.0", []),
        _item("uvloop", "0.22.1", []),
        _item("lm_eval", "0.4.13", ["accelerate>=0.26; extra == 'hf'", "sqlitedict"], requested=True, extras=["hf"]),
        _item("accelerate", "1.15.0", ["numpy"]),
        _item("sqlitedict", "2.1.0", []),
    ]
}
TOP = [Requirement("vllm==0.26.0"), Requirement("lm-eval[hf]==0.4.13")]


def test_a_bare_target_gets_the_whole_closure_for_linux() -> None:
    sel = select(REPORT, TOP, {}, Target("3.12"))
    assert sel.include == {
        "vllm": "0.26.0", "torch": "2.11.0", "nvidia-cublas": "13.1.0.3", "filelock": "3.20.0", "numpy": "2.4.0",
        "uvloop": "0.22.1", "lm-eval": "0.4.13", "accelerate": "1.15.0", "sqlitedict": "2.1.0",
    }  # fmt: skip
    assert sel.installed == {}


def test_a_host_with_its_own_cuda_torch_gets_no_torch_and_no_cuda_libraries() -> None:
    installed = read_installed(["torch==2.11.0", "numpy==2.5.2", "accelerate==1.15.0", "# comment", "-e ."])
    sel = select(REPORT, TOP, installed, Target("3.12"))
    # torch's own needs (nvidia-cublas, filelock) are walked only through torch: left out with it
    assert sel.include == {"vllm": "0.26.0", "uvloop": "0.22.1", "lm-eval": "0.4.13", "sqlitedict": "2.1.0"}
    assert sel.installed == {"torch": "2.11.0", "numpy": "2.5.2", "accelerate": "1.15.0"}


def test_an_installed_version_that_misses_a_specifier_is_not_left_out() -> None:
    # torch 2.10.0 does not meet vllm's ==2.11.0; numpy 1.25 does not meet >=1.26 (nor accelerate's bare numpy? it
    # does: no specifier), so both come from the wheelhouse, and torch's needs with it
    sel = select(REPORT, TOP, {"torch": "2.10.0", "numpy": "1.25.0"}, Target("3.12"))
    assert {"torch", "nvidia-cublas", "filelock", "numpy"} <= set(sel.include)
    assert sel.installed == {}


def test_the_resolving_pip_runs_on_the_targets_python() -> None:
    import sys

    from quantverdict.processes.wheelhouse import WheelhouseError, pip_python

    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert pip_python(here) == sys.executable
    with pytest.raises(WheelhouseError, match=rf"--pip-python {sys.executable}: it runs Python {here}, not 2.9"):
        pip_python("2.9", sys.executable)
    with pytest.raises(WheelhouseError, match="no Python 2.9 here to resolve with"):
        pip_python("2.9")


def test_the_download_asks_the_indexes_the_requirements_name(tmp_path) -> None:
    from quantverdict.processes.wheelhouse import index_options

    req = tmp_path / "r.txt"
    req.write_text(
        "# CPU torch\n--extra-index-url https://download.pytorch.org/whl/cpu\ntorch==2.13.0+cpu\n-r other.txt\n"
    )
    assert index_options(req) == ["--extra-index-url https://download.pytorch.org/whl/cpu"]
