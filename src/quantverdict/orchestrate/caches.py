"""The cache entries a job reuses across jobs: materialized models, quantized checkpoints, CPU probe results.

Each entry lives under ``paths.cache_root`` with a key that says when it may be reused: the model's source
keys (``cache/models/<name>``, guarded by a file lock, :func:`exclusive_lock`), the checkpoint key of
:func:`quantverdict.config.schemes.checkpoint_key` (``cache/checkpoints/<model>/<scheme>-<key>``) and the
stage interpreters plus this CPU (``cache/cpu_probe/<key>.json``). A damaged entry is never reused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from quantverdict.children.materialize import MODEL_INFO
from quantverdict.config import cpu_caps, schemes
from quantverdict.config.compose import as_dict
from quantverdict.config.kv import combo_name
from quantverdict.config.schema import Config, ModelConfig
from quantverdict.measure import sanity
from quantverdict.measure.integrity import IntegrityError, check_checkpoint
from quantverdict.orchestrate import preflight, resume
from quantverdict.orchestrate.hub import HubModel
from quantverdict.processes.envs import StageEnv
from quantverdict.processes.runner import StageError, run_stage
from quantverdict.results.record import StageInfo
from quantverdict.results.stage_results import (
    CpuProbeResult,
    MaterializeResult,
    QuantizeResult,
    SanityResult,
)

log = logging.getLogger(__name__)

MODEL_SOURCE_KEYS = ("source", "path", "package", "gguf_file", "dtype", "synthetic")
# a hub model's weights are those of one commit: the id and the resolved commit join its source keys (only
# for model.source=hf, so that the keys of other models stay what they were); two revisions naming the same
# commit share the entry
HUB_SOURCE_KEYS = ("hf_id", "commit")


def hub_keys(model: dict[str, Any]) -> dict[str, Any]:
    """``{"hf_id", "commit"}`` of a hub model's dict (its config plus the resolved ``commit``), else ``{}``."""
    return {k: model.get(k) for k in HUB_SOURCE_KEYS} if model.get("source") == "hf" else {}


CPU_PROBE_VERSION = 3  # part of the probe cache key: bump when stages/cpu_probe.py measures something new


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the ``with`` block; the file is removed on release.

    The file is unlinked while still locked, so a waiter that then gets the lock holds a file no longer at
    ``path``: it sees that (its descriptor's inode differs from the path's, or the path is gone) and locks the
    file now at ``path`` instead. So one holder at a time, and no lock file left behind by a job that failed,
    was interrupted or finished (a killed process's lock is released by the kernel; only its empty file would
    stay, and the next holder removes it).
    """
    while True:
        fh = open(path, "a")  # noqa: SIM115 - closed below or after the block
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                current = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
            except FileNotFoundError:
                current = False
        except BaseException:
            fh.close()
            raise
        if current:
            break
        fh.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        fh.close()


def materialize(
    model_cfg: ModelConfig,
    env: StageEnv,
    cache: Path,
    out: Path,
    st: StageInfo,
    extra: dict[str, Any] | None = None,
    hub: HubModel | None = None,
) -> dict[str, Any]:
    """The cached model folder of ``model_cfg``, materialized first if absent, damaged or from another source.

    Two jobs of parallel grids asking for the same model wait for each other on a file lock next to the
    cache entry (``cache/models/.<name>.lock``, :func:`exclusive_lock`): one builds it, the other then finds it
    complete. The lock file is removed when the lock is released, whether the model was built or not.

    Args:
        hub: ``model.source=hf``: the commit preflight resolved (:func:`quantverdict.orchestrate.hub.resolve`);
            the child downloads that commit, and an entry of another commit is not reused.

    Returns:
        The cache entry's ``quantverdict_model.json``: the materialize stage's result (``path``, ``dims``,
        ``num_parameters``, ...; a hub model's ``hf_id``, ``revision`` and ``commit``) and ``model``, the source
        keys it was made from, which :func:`checkpoint_key` reads. The same dict whether the entry was made now or
        reused, so that a checkpoint's key does not depend on which job made the model; ``st`` is marked
        ``cached`` when the entry was reused.

    Raises:
        ValueError: ``model.source=hf`` without ``hub``.
    """
    if model_cfg.source == "hf" and hub is None:
        raise ValueError(f"model {model_cfg.name}: model.source=hf needs the revision resolved in preflight (hub)")
    (cache / "models").mkdir(parents=True, exist_ok=True)
    with exclusive_lock(cache / "models" / f".{model_cfg.name}.lock"):
        return _materialize_locked(model_cfg, env, cache, out, st, extra, hub)


def _materialize_locked(
    model_cfg: ModelConfig,
    env: StageEnv,
    cache: Path,
    out: Path,
    st: StageInfo,
    extra: dict[str, Any] | None,
    hub: HubModel | None,
) -> dict[str, Any]:
    target = cache / "models" / model_cfg.name
    info = target / MODEL_INFO
    source = as_dict(model_cfg)
    if hub is not None:
        source["commit"] = hub.commit
    want = {**{k: source.get(k) for k in MODEL_SOURCE_KEYS}, **hub_keys(source)}
    if info.exists():
        cached = json.loads(info.read_text())
        try:
            check_checkpoint(Path(cached["path"]))
            was = cached.get("model", {})
            same = {**{k: was.get(k) for k in MODEL_SOURCE_KEYS}, **hub_keys(was)} == want
        except IntegrityError as exc:
            log.warning("cached model is damaged (%s); materializing again", exc)
            same = False
        if same:
            st.status, st.detail = "cached", str(target)
            return cached
        log.info("materializing %s again into %s", model_cfg.name, target)
    spec = {"model": source, "out_dir": str(target), "cache_root": str(cache), **(extra or {})}
    if hub is not None:
        spec["hub"] = hub.spec()
    run_stage(env, "materialize", spec, out, MaterializeResult)
    # the entry as a later job reads it: the stage's result plus the source keys ("model") the child wrote last
    if not info.is_file():
        raise StageError("materialize", f"the stage finished without writing {info}", None, out / "materialize.log")
    made: dict[str, Any] = json.loads(info.read_text())
    return made


def checkpoint_versions(pins: list[str]) -> dict[str, str]:
    """``{name: version}`` of the quantize environment's ``name==version`` lines
    (:func:`quantverdict.orchestrate.resume.installed`): the environment part of :func:`checkpoint_key`."""
    return dict(line.split("==", 1) for line in pins)


def checkpoint_key(
    cfg: Config, model: dict[str, Any], recipe: dict[str, Any], method: str, versions: dict[str, str]
) -> str:
    """The cache key of ``model``'s checkpoint in ``cfg.scheme`` (:func:`quantverdict.config.schemes.checkpoint_key`):
    the model's source keys, the scheme, ``recipe``, the calibration settings with the sha256 of the calibration
    text's content in place of its path (not for ``rtn``), and the quantize environment's ``versions``."""
    source = model.get("model", {})
    # "synthetic" joins the key only where set, so that keys of other models stay what they were
    model_key = json.dumps(
        {
            **{k: source.get(k) for k in MODEL_SOURCE_KEYS if k != "synthetic" or source.get(k) is not None},
            **hub_keys(source),
        },
        sort_keys=True,
    )
    # the calibration by content: the same text in another checkout shares the entry, an edited text does not
    calib_key: dict[str, Any] = {}
    if method not in ("rtn",) or cfg.kv.calibrated:  # calibrated K/V scales come from the calibration text too
        text = resume.calibration_text(cfg)
        digest = resume.sha256_file(text) if text and text.is_file() else None
        calib_key = {**as_dict(cfg.scheme.calibration), "text_sha256": digest}
    return schemes.checkpoint_key(model_key, cfg.scheme.name, recipe, calib_key, versions)


def quantize(
    cfg: Config,
    env: StageEnv,
    model: dict[str, Any],
    recipe: dict[str, Any],
    method: str,
    versions: dict[str, str],
    cache: Path,
    out: Path,
    st: StageInfo,
) -> dict[str, Any]:
    """The cached checkpoint of ``model`` in ``cfg.scheme`` (``recipe`` by ``method``), quantized first if absent.

    The key (:func:`quantverdict.config.schemes.checkpoint_key`) covers the model's source, the scheme, the
    resolved recipe, the calibration settings and the sha256 of the calibration text's content (not its path;
    neither for ``rtn``) and the quantize environment's ``versions`` (every installed distribution,
    :func:`quantverdict.orchestrate.resume.installed`). A new checkpoint is checked against the source model in
    the quantize stage (``quantize.sanity``; one beyond the bounds fails the job, set aside and named) and gets a
    checksum manifest (:func:`write_checksums`). A cached one is reused only when its files match it
    (:func:`verify_checksums`), pass the structural check and pass the sanity check (:func:`check_sanity`);
    otherwise it is moved aside (``<name>.damaged-<unix time>``, named in the log and in the record's
    ``checkpoint.set_aside``) and rebuilt.

    Returns:
        The record's ``checkpoint`` section: the quantize stage's result plus ``path``, ``key``, ``cached``,
        ``quantized``, ``sanity`` (:func:`check_sanity`'s dict), ``set_aside`` (``[{"path", "reason"}]``, where
        a cached checkpoint was set aside) (``method="none"``: the model's own folder, ``st`` marked
        ``skipped``).
    """
    if method == "none":
        st.status, st.detail = "skipped", "baseline: no quantization"
        return {"path": model["path"], "key": None, "cached": False, "quantized": False}
    calib = as_dict(cfg.scheme.calibration)
    text = resume.calibration_text(cfg)
    calib_spec = {**calib, "text_path": str(text) if text else None}
    key = checkpoint_key(cfg, model, recipe, method, versions)
    target = cache / "checkpoints" / cfg.model.name / f"{cfg.scheme.name}-{key}"
    target.parent.mkdir(parents=True, exist_ok=True)
    # jobs running at once (a grid on Ray, two grids) that need the same checkpoint: one makes it, the others
    # wait on the lock and then find it complete
    with exclusive_lock(target.with_name(f".{target.name}.lock")):
        return _quantize_locked(cfg, env, model, recipe, method, calib_spec, key, target, out, st)


def _quantize_locked(
    cfg: Config,
    env: StageEnv,
    model: dict[str, Any],
    recipe: dict[str, Any],
    method: str,
    calib_spec: dict[str, Any],
    key: str,
    target: Path,
    out: Path,
    st: StageInfo,
) -> dict[str, Any]:
    done = target / "quantverdict_quantize.json"
    set_aside: list[dict[str, str]] = []
    if done.exists():
        try:
            check_checkpoint(target)
            verify_checksums(target)
            checked = check_sanity(cfg, env, model, target, out)
            digest = manifest_digest(target)  # after the check: a verdict reached now joined the manifest
            st.status, st.detail = "cached", f"{target} (sanity check: {checked['checked']})"
            return {
                **json.loads(done.read_text()),
                "path": str(target),
                "key": key,
                "cached": True,
                "sha256": digest,
                "sanity": checked,
            }
        except IntegrityError as exc:
            # never reuse a damaged checkpoint: move it aside (kept for inspection) and quantize again
            aside = target.with_name(f"{target.name}.damaged-{int(time.time())}")
            target.rename(aside)
            log.warning("cached checkpoint failed its integrity check (%s); moved to %s, quantizing again", exc, aside)
            st.detail = f"re-quantized: cached checkpoint damaged ({exc}); set aside in {aside}"
            set_aside.append({"path": str(aside), "reason": str(exc)})
    spec = {
        "model_path": model["path"],
        "out_dir": str(target),
        "recipe": recipe,
        "method": method,
        "calibration": calib_spec,
        "seed": cfg.seed,
        "sanity": sanity_bounds(cfg),
        "save_format": fmt.save_format if (fmt := schemes.FORMATS.get(cfg.scheme.label)) else None,
    }
    quantized = run_stage(env, "quantize", spec, out, QuantizeResult)
    result = quantized.model_dump(exclude={"status"}, exclude_unset=True)
    done.write_text(json.dumps(result, indent=2))
    verdict = {"checked": "when made", **(quantized.sanity or {}), "bounds": spec["sanity"]}
    digest = write_checksums(target, verdict)
    return {
        **result,
        "path": str(target),
        "key": key,
        "cached": False,
        "quantized": True,
        "sha256": digest,
        "sanity": verdict,
        "set_aside": set_aside,
    }


SANITY = "quantverdict_sanity.json"


def sanity_bounds(cfg: Config) -> dict[str, Any] | None:
    """The bounds :func:`quantverdict.measure.sanity.judge` takes, from ``quantize.sanity`` (None when disabled);
    a synthetic model (random weights) is judged on finite logits only."""
    bounds = cfg.quantize.sanity
    if not bounds.enabled:
        return None
    return {
        "max_ppl_ratio": bounds.max_ppl_ratio,
        "max_mean_kld": bounds.max_mean_kld,
        "finite_only": cfg.model.source == "synthetic",
    }


def recorded_sanity(folder: Path) -> dict[str, Any] | None:
    """The sanity result stored in ``folder/quantverdict_sanity.json`` when it still describes the folder's bytes:
    the sha256 of every other file it lists equals that of the checksum manifest (already verified by
    :func:`verify_checksums`), no file was added or removed, and its result holds what
    :func:`quantverdict.measure.sanity.judge` reads (:class:`~quantverdict.measure.sanity.SanityNumbers`); else
    None."""
    try:
        stored = json.loads((folder / SANITY).read_text())
        manifest = json.loads((folder / CHECKSUMS).read_text())
    except (OSError, ValueError):
        return None
    others = {k: v for k, v in manifest.items() if k != SANITY}
    if stored.get("files") != others or not isinstance(stored.get("result"), dict):
        return None
    try:
        sanity.SanityNumbers.of(stored["result"])
    except ValueError as exc:  # not a sanity result this code judges: the check runs again
        log.info("%s: the stored sanity result is not read (%s); checked again", folder, exc)
        return None
    return stored


def check_sanity(cfg: Config, env: StageEnv, model: dict[str, Any], folder: Path, out: Path) -> dict[str, Any]:
    """Check a cached quantized checkpoint against its source model (``model["path"]``) before it is reused.

    Its checksums prove the bytes are those written when it was made, not that what was written was right: a
    zero or NaN ``weight_scale`` decodes to zero or NaN weights. The child
    :mod:`quantverdict.children.checkpoint_sanity` scores both models on fixed token windows and
    :func:`quantverdict.measure.sanity.judge` compares them with ``quantize.sanity``. The result is stored beside
    the checkpoint (``quantverdict_sanity.json``, with the sha256 of every file it judged, then joined to the
    checksum manifest); a later reuse of the same bytes (:func:`recorded_sanity`) is judged from it without
    running the models again. A checkpoint made by the quantize stage gets that file at once (the stage ran the
    same comparison). Cost of a run with the embedded SmolLM2-135M and its int8 checkpoint on two idle cores
    of an AMD EPYC (AVX2): 10.5 s, more where other work shares the cores
    (:mod:`quantverdict.children.checkpoint_sanity`); a recorded verdict costs reading one small file.

    Returns:
        ``{"checked": "now" | "recorded", ...the child's result, "bounds"}``; ``{"checked": "disabled"}`` with
        ``quantize.sanity.enabled=false``.

    Raises:
        IntegrityError: the checkpoint fails the check (the reason names the value and the bound).
    """
    bounds = sanity_bounds(cfg)
    if bounds is None:
        return {"checked": "disabled"}
    stored = recorded_sanity(folder)
    if stored is not None:
        result, how = stored["result"], "recorded"
    else:
        spec = {"source_path": model["path"], "checkpoint_path": str(folder)}
        result = run_stage(env, "checkpoint_sanity", spec, out, SanityResult).model_dump(exclude={"status"})
        how = "now"
    reason = sanity.judge(sanity.SanityNumbers.of(result), **bounds)
    if reason:
        raise IntegrityError(f"{folder.name} failed its sanity check against the source model: {reason}")
    verdict = {"checked": how, **result, "bounds": bounds}
    if how == "now":
        write_checksums(folder, verdict)
    return verdict


CHECKSUMS = "quantverdict_checksums.json"


def _checksummed_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS)


def write_checksums(folder: Path, sanity_verdict: dict[str, Any] | None = None) -> str:
    """Write ``folder/quantverdict_checksums.json``: the sha256 of every file under ``folder`` (relative path ->
    hex digest), made when the checkpoint is made. Reading a checkpoint's bytes once costs about what reading it
    from disk costs (the embedded model's int8 checkpoint, 167 MB, verified in 0.19 s on a 2-core CPU).

    Args:
        sanity_verdict: the checkpoint's sanity result (:func:`check_sanity`): written first as
            ``quantverdict_sanity.json`` with the sha256 of every other file (those it judged), then itself
            checksummed.

    Returns:
        The manifest's digest: sha256 of its canonical JSON, the checkpoint's content identity
        (``checkpoint.sha256`` in the record).
    """
    files = [p for p in _checksummed_files(folder) if not (sanity_verdict is not None and p.name == SANITY)]
    sums = {str(p.relative_to(folder)): resume.sha256_file(p) for p in files}
    if sanity_verdict is not None:
        result = {k: v for k, v in sanity_verdict.items() if k not in ("checked", "bounds")}
        (folder / SANITY).write_text(json.dumps({"files": sums, "result": result}, indent=2, sort_keys=True))
        sums[SANITY] = resume.sha256_file(folder / SANITY)
    (folder / CHECKSUMS).write_text(json.dumps(sums, indent=2, sort_keys=True))
    return manifest_digest(folder)


def verify_checksums(folder: Path) -> str:
    """Check every file under ``folder`` against its checksum manifest (:func:`write_checksums`).

    Returns:
        The manifest's digest.

    Raises:
        IntegrityError: no manifest, or a file missing, added or with other content (named, up to five).
    """
    manifest = folder / CHECKSUMS
    if not manifest.is_file():
        raise IntegrityError(f"{folder}: no checksum manifest ({CHECKSUMS}): its content cannot be verified")
    try:
        want = json.loads(manifest.read_text())
    except ValueError as exc:
        raise IntegrityError(f"{manifest}: unreadable ({exc})") from None
    have = {str(p.relative_to(folder)): p for p in _checksummed_files(folder)}
    bad = sorted(set(want) ^ set(have))
    bad += [name for name in sorted(set(want) & set(have)) if resume.sha256_file(have[name]) != want[name]]
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise IntegrityError(f"{folder}: content differs from its checksums (sha256) in {', '.join(bad[:5])}{more}")
    return manifest_digest(folder)


def manifest_digest(folder: Path) -> str:
    """sha256 of the canonical JSON of ``folder``'s checksum manifest (read, not verified: see
    :func:`verify_checksums`)."""
    want = json.loads((folder / CHECKSUMS).read_text())
    return hashlib.sha256(json.dumps(want, sort_keys=True).encode()).hexdigest()


def cpu_capabilities(
    serve_env: StageEnv, quant_env: StageEnv, cache: Path, out: Path
) -> tuple[cpu_caps.CpuCapabilities, dict[str, Any]]:
    """This CPU as the serve environment's torch and vLLM see it, plus the quantize environment's torch view.

    Runs :mod:`quantverdict.children.cpu_probe` in both environments (about 4 s and 1.5 s) and caches the
    results under ``cache/cpu_probe/``, keyed by both interpreters and this CPU's ``/proc/cpuinfo``
    model name and flags: a machine with another CPU, or a rebuilt environment, probes again.
    """
    ident = json.dumps([CPU_PROBE_VERSION, serve_env.python, quant_env.python, preflight.cpuinfo_identity()])
    path = cache / "cpu_probe" / f"{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"
    if path.is_file():
        cached = json.loads(path.read_text())
        return cpu_caps.CpuCapabilities.from_probe(cached["serve"]), cached["quantize"]["torch"]
    serve = run_stage(serve_env, "cpu_probe", {"vllm": True}, out, CpuProbeResult).model_dump()
    quant = run_stage(quant_env, "cpu_probe", {"vllm": False}, out / "quantize_env", CpuProbeResult).model_dump()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"serve": serve, "quantize": quant}, indent=2))
    tmp.replace(path)
    return cpu_caps.CpuCapabilities.from_probe(serve), quant["torch"]


KLD_CACHE_VERSION = 1  # part of the KLD baseline key: bump when what children/kld_baseline.py stores changes


def kld_spec(cfg: Config, env: StageEnv, cache: Path, dtype: Any, served: bool) -> dict[str, Any] | None:
    """The evaluate child's ``spec["kld"]``: store (baseline job) or compare with (scheme job) the baseline's
    next-token distributions (:mod:`quantverdict.children.kld_baseline`); None when ``eval.kld`` or the token
    perplexity is off.

    The entry's key is the sha256 (first 16 hex) of what makes the baseline's distributions what they are,
    read from this job's config as the baseline's would be: the model's source keys (a hub model's with the
    commit of its materialized entry), ``baseline_scheme``,
    the eval backend, device and compute dtype (``dtype``: the resolved eval dtype, or the server's dtype
    when ``served``), the token-perplexity windows, ``eval.kld.top_k`` and the serve environment's
    interpreter (its folder name carries the hash of its pins). The baseline job writes the entry with its
    config hash (:func:`quantverdict.orchestrate.resume.config_hash`), which a scheme's result names; a
    scheme job whose key or text (token ids and windows, checked in the child) differs is refused.

    Returns:
        ``{"role": "baseline" | "scheme", "top_k", "dir", "key", "key_fields", "config_hash", "job_id"}``.
    """
    if not (cfg.eval.kld.enabled and cfg.eval.token_perplexity.enabled):
        return None
    tp = cfg.eval.token_perplexity
    model = as_dict(cfg.model)
    if cfg.model.source == "hf":  # the commit this job materialized (hub models only: other keys stay as they were)
        try:
            entry = json.loads((cache / "models" / cfg.model.name / MODEL_INFO).read_text())
            model["commit"] = (entry.get("model") or {}).get("commit")
        except (OSError, ValueError):
            model["commit"] = None
    fields = {
        "version": KLD_CACHE_VERSION,
        "model": cfg.model.name,
        "source": {**{k: model.get(k) for k in MODEL_SOURCE_KEYS}, **hub_keys(model)},
        "baseline_scheme": cfg.baseline_scheme,
        "backend": str(cfg.eval.backend),
        "device": str(cfg.env.device),
        "dtype": str(getattr(dtype, "value", dtype)),  # a ComputeDtype (server) or its string
        "seq_len": tp.seq_len,
        "stride": tp.stride,
        "max_tokens": tp.max_tokens,
        "top_k": cfg.eval.kld.top_k,
        "serve_env": env.python,
        "served": served,
    }
    key = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]
    config_hash = resume.config_hash(cfg)
    return {
        # the baseline is the baseline scheme with the model's own KV cache (kv=auto); bf16 weights with an FP8 cache
        # are compared with it like any scheme
        "role": "baseline" if cfg.scheme.name == cfg.baseline_scheme and cfg.kv.cache_dtype == "auto" else "scheme",
        "top_k": cfg.eval.kld.top_k,
        "dir": str(cache / "kld_baseline" / cfg.model.name / key),
        "key": key,
        "key_fields": fields,
        "config_hash": config_hash,
        "job_id": f"{cfg.model.name}_{combo_name(cfg.scheme.name, cfg.kv.name)}_{config_hash}",
    }
