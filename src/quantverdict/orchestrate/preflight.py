"""Before any work: can this machine run the job at all? The model source is reachable, and on CPU the
model fits the memory and the disk the stages need.

Orchestrator side: the standard library, psutil, and huggingface_hub for a hub model's revision
(:mod:`quantverdict.orchestrate.hub`). Each check returns the problems as messages that name the key and say
what to do instead; :func:`check` raises them as one :class:`~quantverdict.config.schema.ConfigError`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from quantverdict.children.materialize import MODEL_INFO  # the cache entry's marker file (a constant, stdlib only)
from quantverdict.config.schema import Config, ConfigError, ModelConfig
from quantverdict.orchestrate import data_access, hub
from quantverdict.orchestrate.hub import HUB_TIMEOUT_S, HubModel, HubUnavailable

GIB = 2**30
# bytes per parameter the CPU stages hold at once: calibration-based quantization and float32 evaluation
# load the model in float32 (4 B/param); the headroom covers activations, the tokenizer and the runtime
CPU_RAM_BYTES_PER_PARAM = 4
CPU_RAM_HEADROOM = 1.25
# disk: the materialized 16-bit model (2 B/param) plus one quantized checkpoint (at most 2 B/param)
DISK_BYTES_PER_PARAM = 4
INSTEAD = (
    "use a model that is on this machine (model.source=local model.path=/a/folder with config.json and "
    "safetensors), the embedded model (model=smollm2-135m), or run on a machine that reaches the hub"
)


def cpuinfo_identity() -> str:
    """``/proc/cpuinfo``'s first model name and flags line (what identifies this CPU; '' where unreadable)."""
    # read by hand: psutil gives neither the CPU's model name nor its flags (AVX-512, AMX, ...)
    name = flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not name:
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{name}|{flags}"


def cpu_model_name() -> str:
    """This CPU's model name (``/proc/cpuinfo``'s first ``model name``, e.g. ``AMD EPYC`` on a VM that hides the
    exact part; '' where unreadable)."""
    return cpuinfo_identity().partition("|")[0]


@dataclass(frozen=True)
class MachineResources:
    """What this machine offers: memory available now (``psutil.virtual_memory().available``, the kernel's
    MemAvailable on Linux) and free disk at the cache."""

    mem_available_bytes: int | None
    disk_free_bytes: int | None

    @classmethod
    def here(cls, cache_root: Path) -> MachineResources:
        try:
            mem: int | None = int(psutil.virtual_memory().available)
        except (OSError, RuntimeError):
            mem = None
        probe = cache_root
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        try:
            disk: int | None = shutil.disk_usage(probe).free
        except OSError:
            disk = None
        return cls(mem, disk)


def synthetic_parameters(config: dict[str, Any]) -> int | None:
    """Parameters of a decoder from its transformers config (``text_config`` of a VLM), or None if incomplete.

    Per layer: attention ``h * (n_q * d) + 2 * h * (n_kv * d) + (n_q * d) * h`` plus a gated MLP
    ``3 * h * i``; plus the embeddings ``v * h`` (twice unless ``tie_word_embeddings``). Norms, biases and
    vision towers are left out (under 1% for the shapes shipped here; an estimate for a fit check).
    """
    c = config.get("text_config") or config
    try:
        h, i, layers, v = (int(c[k]) for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size"))
        n_q = int(c["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        return None
    n_kv = int(c.get("num_key_value_heads") or n_q)
    d = int(c.get("head_dim") or h // n_q)
    per_layer = h * n_q * d + 2 * h * n_kv * d + n_q * d * h + 3 * h * i
    tied = bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    return layers * per_layer + v * h * (1 if tied else 2)


def local_weight_bytes(path: Path) -> int:
    """Bytes of the weight files (``*.safetensors``, ``*.bin``, ``*.gguf``) in a model folder or of one file."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for pattern in ("*.safetensors", "*.bin", "*.gguf") for p in path.glob(pattern))


def source_problems(
    model: ModelConfig, cache_root: Path, hub_timeout_s: float = HUB_TIMEOUT_S
) -> tuple[list[str], int | None, HubModel | None]:
    """Whether the model's source can be read here, its parameter count where known, and a hub model's commit.

    ``hf``: the revision resolved to its commit (:func:`quantverdict.orchestrate.hub.resolve`: one request to
    the hub, or the hub cache alone when offline), whose safetensors give the parameters; always resolved,
    since a branch may have moved since the model was materialized. Any other model already materialized in
    the cache (``cache/models/<name>/quantverdict_model.json``) needs no source. ``local``: a folder with
    ``config.json`` and ``*.safetensors``. ``synthetic``: :func:`synthetic_parameters`.

    Returns:
        (messages naming ``model.*`` keys, parameters or None, the resolved hub model or None).
    """
    if model.source == "hf" and model.hf_id:
        try:
            found = hub.resolve(model.hf_id, model.revision, cache_root, timeout_s=hub_timeout_s)
        except HubUnavailable as exc:
            return [f"{exc}; or {INSTEAD}"], None, None
        except ConfigError as exc:
            return [str(exc)], None, None
        return [], found.num_parameters, found
    cached = cache_root / "models" / model.name / MODEL_INFO
    if cached.is_file():
        try:
            return [], int(json.loads(cached.read_text()).get("num_parameters") or 0) or None, None
        except (OSError, ValueError):
            pass
    if model.source == "local" and model.path:
        folder = Path(model.path)
        if folder.is_dir() and not (folder / "config.json").is_file():
            return (
                [
                    f"model.path={model.path!r} (model.source=local) has no config.json: point it at a transformers "
                    "model folder (config.json, tokenizer and *.safetensors)"
                ],
                None,
                None,
            )
        if folder.is_dir() and not any(folder.glob("*.safetensors")):
            return (
                [
                    f"model.path={model.path!r} (model.source=local) has no *.safetensors weights: this project reads "
                    "safetensors checkpoints (convert .bin weights with transformers' save_pretrained)"
                ],
                None,
                None,
            )
        if folder.is_dir():
            n = local_weight_bytes(folder) // 2  # 16-bit weights on disk
            return [], n or None, None
    if model.source == "synthetic" and model.synthetic is not None:
        return [], synthetic_parameters(dict(model.synthetic.config)), None
    return [], None, None


def fit_problems(
    params: int | None, device: str, resources: MachineResources, cache_root: Path, materialized: bool
) -> list[str]:
    """On CPU: the model's stages fit this machine's memory and the cache's disk.

    Needs (see the constants): memory ``params * CPU_RAM_BYTES_PER_PARAM * CPU_RAM_HEADROOM`` (float32
    calibration and evaluation), disk ``params * DISK_BYTES_PER_PARAM`` unless already materialized
    (then one checkpoint, ``params * 2``). Nothing is checked on cuda (the GPU fit check does) or when
    the size is unknown.

    Returns:
        One message per shortfall, naming ``model`` and what to do instead; [] when it fits.
    """
    if device != "cpu" or not params:
        return []
    out = []
    need_mem = params * CPU_RAM_BYTES_PER_PARAM * CPU_RAM_HEADROOM
    if resources.mem_available_bytes is not None and need_mem > resources.mem_available_bytes:
        out.append(
            f"model: {params / 1e9:.2f}B parameters need about {need_mem / GIB:.1f} GiB of memory on CPU (float32 "
            f"calibration and evaluation, {CPU_RAM_BYTES_PER_PARAM} B/param x {CPU_RAM_HEADROOM}), and this machine "
            f"has {resources.mem_available_bytes / GIB:.1f} GiB available; use a smaller model, a GPU environment "
            "(env=gpu), or the embedded model (model=smollm2-135m)"
        )
    need_disk = params * (2 if materialized else DISK_BYTES_PER_PARAM)
    if resources.disk_free_bytes is not None and need_disk > resources.disk_free_bytes:
        out.append(
            f"model: {params / 1e9:.2f}B parameters need about {need_disk / GIB:.1f} GiB of disk under "
            f"paths.cache_root={str(cache_root)!r} (the 16-bit model and a checkpoint), and "
            f"{resources.disk_free_bytes / GIB:.1f} GiB are free there; free space, or point QV_CACHE_ROOT at a "
            "larger disk"
        )
    return out


def gpu_disk_problems(
    params: int | None, cfg: Config, resources: MachineResources, cache_root: Path, materialized: bool
) -> list[str]:
    """On cuda: the 16-bit model and a checkpoint fit the cache's disk (``params * DISK_BYTES_PER_PARAM``, one
    checkpoint ``params * 2`` once materialized), unless ``bench.server.load_format=dummy`` writes no weights.

    A 70B-class synthetic model needs about 330 GiB (70.6e9 x 5 B): more than the GPU machines' disks, which is
    what dummy weights are for; the message says so for synthetic models.
    """
    if cfg.env.device != "cuda" or not params or cfg.bench.server.load_format == "dummy":
        return []
    need = params * (2 if materialized else DISK_BYTES_PER_PARAM)
    if resources.disk_free_bytes is None or need <= resources.disk_free_bytes:
        return []
    instead = (
        "serve its shape with random weights made by vLLM (bench.server.load_format=dummy: speed only, no files)"
        if cfg.model.source == "synthetic"
        else "free space, or point QV_CACHE_ROOT at a larger disk"
    )
    return [
        f"model: {params / 1e9:.2f}B parameters need about {need / GIB:.1f} GiB of disk under "
        f"paths.cache_root={str(cache_root)!r} (the 16-bit model and a checkpoint), and "
        f"{resources.disk_free_bytes / GIB:.1f} GiB are free there; {instead}"
    ]


@dataclass(frozen=True)
class Preflight:
    """What preflight found: the model's parameters where known (recorded) and a hub model's resolved commit
    (:class:`~quantverdict.orchestrate.hub.HubModel`, for the materialize stage)."""

    params: int | None
    hub: HubModel | None = None


def check(cfg: Config, resources: MachineResources | None = None) -> Preflight:
    """Raise one ConfigError with every problem of :func:`source_problems`, :func:`fit_problems` and
    :func:`quantverdict.orchestrate.data_access.problems` (data neither offline nor on a reachable hub).

    Returns:
        The model's parameter count where known, and a hub model's resolved commit.
    """
    cache = Path(cfg.paths.cache_root)
    materialized = (cache / "models" / cfg.model.name / MODEL_INFO).is_file()
    problems, params, found = source_problems(cfg.model, cache)
    if found is not None:  # a hub model is read in place: on disk once its commit's snapshot is in the hub cache
        materialized = (hub.repo_folder(Path(found.cache_dir), found.hf_id) / "snapshots" / found.commit).is_dir()
    here = resources or MachineResources.here(cache)
    problems += fit_problems(params, cfg.env.device, here, cache, materialized)
    problems += gpu_disk_problems(params, cfg, here, cache, materialized)
    problems += data_access.problems(cfg)  # data the job reads: offline, or the hub reachable
    if problems:
        raise ConfigError("this machine cannot run the job:\n  - " + "\n  - ".join(problems))
    return Preflight(params, found)
