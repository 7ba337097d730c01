"""``env=auto``: the stage environments and the eval/bench profiles for the device this host has.

``env=auto`` (the default) becomes ``env=gpu`` when a CUDA GPU is visible to this process and ``env=cpu``
otherwise. Whatever ``env`` is (picked or given), the ``eval`` and ``bench`` profiles follow its device unless
they are given too: ``eval=gpu bench=gpu`` for ``env.device=cuda``, ``eval=cpu bench=cpu`` for ``cpu``. The pick
and its reason travel in the config as ``env.picked_by``, so every record says what was chosen and why.

"Visible" is what ``nvidia-smi -L`` lists, less what ``CUDA_VISIBLE_DEVICES`` hides (an empty value or ``-1``
hides every GPU, as CUDA reads it). The expansion rewrites the override list before Hydra composes it, both for
``python -m pipelines.run`` (:func:`expand`) and for :func:`quantverdict.config.compose.compose`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from omegaconf import OmegaConf

AUTO = "auto"
# the profile each device's jobs use when none is given: conf/eval/<profile>.yaml, conf/bench/<profile>.yaml
DEVICE_PROFILE = {"cuda": "gpu", "cpu": "cpu"}
FOLLOWING_GROUPS = ("eval", "bench")


def visible_gpus(nvidia_smi: str = "nvidia-smi", cuda_visible_devices: str | None = None) -> list[str]:
    """The names of the CUDA GPUs this process may use, e.g. ``["NVIDIA H200"]``; [] without any.

    Args:
        nvidia_smi: the program that lists them (``nvidia-smi -L``: ``GPU 0: NVIDIA H200 (UUID: GPU-...)``).
        cuda_visible_devices: None reads ``CUDA_VISIBLE_DEVICES`` from this process's environment; an empty
            value or ``-1`` hides every GPU; a comma-separated list of indices or UUIDs keeps those.
    """
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES") if cuda_visible_devices is None else cuda_visible_devices
    if cvd is not None and cvd.strip() in ("", "-1"):
        return []
    try:
        res = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if res.returncode != 0:
        return []
    gpus: list[tuple[str, str, str]] = []  # (index, uuid, name)
    for line in res.stdout.splitlines():
        head, sep, rest = line.partition(":")
        if not sep or not head.startswith("GPU "):
            continue
        name, _, uuid = rest.strip().partition(" (UUID: ")
        gpus.append((head[4:].strip(), uuid.rstrip(")").strip(), name.strip()))
    if cvd is not None:
        wanted = [w.strip() for w in cvd.split(",") if w.strip()]
        gpus = [g for g in gpus if g[0] in wanted or g[1] in wanted]
    return [g[2] for g in gpus]


def _value(overrides: list[str], key: str) -> tuple[int, str] | None:
    """(position, value) of the override that sets config group or key ``key`` (``key=v``, ``+key=v``)."""
    for i, o in enumerate(overrides):
        if o.startswith("-") or "=" not in o:
            continue
        k, v = o.split("=", 1)
        if k.lstrip("+~").split("@", 1)[0] == key:
            return i, v
    return None


def _env_device(conf_dir: Path, env_name: str) -> str | None:
    path = conf_dir / "env" / f"{env_name}.yaml"
    if not path.is_file():
        return None  # an unknown env: composition reports it with the allowed names
    data = OmegaConf.to_container(OmegaConf.load(path))
    return str(data.get("device", "cpu")) if isinstance(data, dict) else None


def expand(overrides: list[str], conf_dir: Path, gpus: Callable[[], list[str]] = visible_gpus) -> list[str]:
    """``overrides`` with ``env=auto`` resolved and the eval/bench profiles following the env's device.

    Args:
        overrides: Hydra overrides as typed (flags such as ``-m`` pass through untouched).
        conf_dir: the ``conf/`` folder (its ``env/<name>.yaml`` files say each env's device).
        gpus: lists the visible GPUs (:func:`visible_gpus`).

    Returns:
        A new list: ``env=auto`` (given, or the default when no ``env=`` is given) replaced by ``env=gpu`` or
        ``env=cpu`` plus ``env.picked_by='...'``; ``eval=``/``bench=`` added for the env's device where not
        given, next to the overrides typed (:func:`_insert_at`, so that Hydra's argument parser reads them with
        those overrides, not after a flag such as ``--cfg job`` or ``--info``). A sweep over envs
        (``env=cpu,gpu``) and ``--hydra-help`` are left as typed.
    """
    out = list(overrides)
    added: list[str] = []
    if "--hydra-help" in out:  # Hydra's own help composes its own config, which has no env group to override
        return out
    found = _value(out, "env")
    env = found[1] if found else AUTO
    if "," in env:  # a sweep over environments: each job's profiles are the user's to give
        return out
    if env == AUTO:
        names = gpus()
        env = "gpu" if names else "cpu"
        reason = (
            f"auto: {len(names)} CUDA GPU(s) visible ({', '.join(sorted(set(names)))})"
            if names
            else "auto: no CUDA GPU visible (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES hides them)"
        )
        if found:
            out[found[0]] = f"env={env}"
        else:
            added.append(f"env={env}")
        added.append(f"env.picked_by='{reason}'")
    else:
        added.append("env.picked_by='given (env=" + env + ")'")
    device = _env_device(conf_dir, env)
    if device is not None:
        added += [f"{g}={DEVICE_PROFILE.get(device, 'cpu')}" for g in FOLLOWING_GROUPS if _value(out, g) is None]
    at = _insert_at(out)
    return out[:at] + added + out[at:]


def _is_override(arg: str) -> bool:
    """A Hydra override as typed (``key=value``, ``+key=value``, ``~key``), not a flag or a flag's value."""
    return not arg.startswith("-") and ("=" in arg or arg.startswith("~"))


def _insert_at(args: list[str]) -> int:
    """Where overrides go in the command line ``args``: after the first run of overrides typed, else at the front.

    Hydra reads its overrides as one positional argument of ``argparse``, which takes a single run of them: an
    override after a flag that follows the run (``scheme=fp8 --cfg job env=cpu``) is "unrecognized", and one right
    after ``--info`` is read as its value."""
    start = next((i for i, a in enumerate(args) if _is_override(a)), None)
    if start is None:
        return 0
    end = start
    while end < len(args) and _is_override(args[end]):
        end += 1
    return end
