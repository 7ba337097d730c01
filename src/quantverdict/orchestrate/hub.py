"""Models from the Hugging Face hub (``model.source=hf``): ``model.revision`` resolved to a commit before any work.

Who does what:

* **preflight** (the orchestrator, :func:`resolve`): one request to the hub's model API
  (``huggingface_hub.HfApi.model_info``) resolves ``model.revision`` (a branch, tag or commit) to its commit
  sha, checks that the commit holds ``*.safetensors`` weights and reads their parameter count; for a gated
  repo one ``HEAD`` of ``config.json`` (``get_hf_file_metadata``) checks that the token may download it. A
  missing repo, a gated repo without access or a revision that does not exist is a :class:`ConfigError`
  naming ``model.hf_id`` and ``HF_TOKEN``. The resolved revision is written into the cache's
  ``refs/<revision>`` as huggingface_hub's own downloads do, so a later offline run finds the same commit.
* **offline** (``HF_HUB_OFFLINE`` set, or the hub does not answer): the revision resolves from the cache
  alone (``snapshot_download(local_files_only=True)``, the library's own lookup of ``refs/`` and
  ``snapshots/``); no request is made. A revision not in the cache is a :class:`HubUnavailable` naming the
  id, the cache folder and ``HF_HUB_OFFLINE``.
* **the download** runs in the materialize child (quantize environment,
  :mod:`quantverdict.children.materialize`): ``snapshot_download`` pinned to the resolved commit, the
  weights, configs and tokenizer files only. The snapshot folder is then the model's folder, read in place.

The cache is ``<paths.cache_root>/hf`` (next to the project's other caches, so ``QV_CACHE_ROOT`` moves all of
them), in huggingface_hub's layout (``models--ORG--NAME/{blobs,refs,snapshots}``). Where ``HF_HUB_CACHE`` or
``HF_HOME`` is set in the environment, the cache it names is used instead (``$HF_HUB_CACHE``, else
``$HF_HOME/hub``), so a hub cache the user already filled is reused and nothing is downloaded twice. The
token is huggingface_hub's: ``HF_TOKEN``, else the one saved by ``hf auth login``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quantverdict.children.materialize import HUB_FILES, HUB_SKIP
from quantverdict.config.schema import ConfigError
from quantverdict.measure.memory import count_parameters

log = logging.getLogger(__name__)

HUB_TIMEOUT_S = 5.0
TRUE_VALUES = ("1", "on", "yes", "true")  # huggingface_hub's reading of HF_HUB_OFFLINE


class HubUnavailable(ConfigError):
    """The hub cannot be asked (offline, or it does not answer) and the revision is not in the cache."""


@dataclass(frozen=True)
class HubModel:
    """A hub model resolved to one commit.

    Attributes:
        hf_id: the hub id ``owner/name`` (``model.hf_id``).
        revision: the revision asked for (``model.revision``: branch, tag or commit).
        commit: the 40-hex commit sha it resolves to (recorded as ``model.commit``).
        cache_dir: the hub cache folder (:func:`hub_cache_dir`).
        offline: resolved from the cache without the hub; the materialize child then makes no request either.
        num_parameters: the weights' parameters (the hub's ``safetensors.total``, or counted from the cached
            snapshot's safetensors headers); None where unknown.
    """

    hf_id: str
    revision: str
    commit: str
    cache_dir: str
    offline: bool
    num_parameters: int | None = None

    def spec(self) -> dict[str, Any]:
        """The materialize child's ``spec["hub"]``."""
        return asdict(self)


# (repo id, revision, timeout in s) -> (commit sha, parameters or None, file names at that commit)
HubLookup = Callable[[str, str, float], tuple[str, int | None, list[str]]]


def offline_mode(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set to a true value (read now, not at import)."""
    env = os.environ if environ is None else environ
    return any(env.get(k, "").strip().lower() in TRUE_VALUES for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_cache_dir(cache_root: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub`` where either is set, else ``cache_root/hf``."""
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_CACHE"):
        return Path(os.path.expandvars(env["HF_HUB_CACHE"])).expanduser()
    if env.get("HF_HOME"):
        return Path(os.path.expandvars(env["HF_HOME"])).expanduser() / "hub"
    return cache_root / "hf"


def repo_folder(cache_dir: Path, hf_id: str) -> Path:
    """A model repo's folder in the hub cache, ``models--ORG--NAME`` (huggingface_hub's layout)."""
    return cache_dir / ("models--" + hf_id.replace("/", "--"))


def _hub_lookup(hf_id: str, revision: str, timeout_s: float) -> tuple[str, int | None, list[str]]:
    """:data:`HubLookup` by the hub's model API; for a gated repo also a ``HEAD`` of ``config.json`` at the
    commit, which the hub answers 401/403 (``GatedRepoError``) for a token without access."""
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url

    endpoint = os.environ.get("HF_ENDPOINT") or None  # read now: huggingface_hub reads it once, at import
    info = HfApi(endpoint=endpoint).model_info(hf_id, revision=revision, timeout=timeout_s)
    if not info.sha:
        raise ValueError(f"the hub gave no commit for {hf_id}@{revision}")
    if info.gated:
        get_hf_file_metadata(hf_hub_url(hf_id, "config.json", revision=info.sha, endpoint=endpoint), timeout=timeout_s)
    total = info.safetensors.total if info.safetensors else None
    return info.sha, int(total) if total else None, [s.rfilename for s in info.siblings or []]


def hub_error(exc: Exception, hf_id: str, revision: str) -> str | None:
    """The message for an answer of the hub that refuses ``hf_id@revision``, or None when it did not refuse
    (it was not reachable, or failed with a server error: then the cache may still serve).

    Maps huggingface_hub's documented exceptions: ``GatedRepoError`` (a subclass of
    ``RepositoryNotFoundError``, so tested first), ``RepositoryNotFoundError`` (no such repo, or private without
    access), ``RevisionNotFoundError``, and any other 4xx ``HfHubHTTPError`` (e.g. a disabled repo).
    """
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    key = f"model.hf_id={hf_id!r}"
    if isinstance(exc, GatedRepoError):
        return (
            f"{key}: the hub says the repo is gated and this token has no access; accept its terms at "
            f"https://huggingface.co/{hf_id} and set HF_TOKEN to a token of that account (or `hf auth login`)"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"{key}: the hub says the repo does not exist or is private/gated; set HF_TOKEN to a token with "
            "access, or check the id"
        )
    if isinstance(exc, RevisionNotFoundError):
        return (
            f"model.revision={revision!r}: the hub says {hf_id} has no such branch, tag or commit; use one of its "
            "branches (e.g. main), tags or 40-hex commits"
        )
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status is not None and status < 500:
            return f"{key}: the hub refused it (HTTP {status}: {exc}); check the id and HF_TOKEN"
    return None


def _unreachable(exc: Exception) -> bool:
    """The hub did not answer (connection, timeout, offline mode, a 5xx): the cache may still serve."""
    import httpx
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(exc, httpx.ProxyError):  # a misconfigured proxy is the user's to fix, not a missing hub
        return False
    if isinstance(exc, (httpx.TransportError, OfflineModeIsEnabled, TimeoutError, ConnectionError)):
        return True
    return isinstance(exc, HfHubHTTPError) and exc.response is not None and exc.response.status_code >= 500


def _write_ref(cache_dir: Path, hf_id: str, revision: str, commit: str) -> None:
    """``refs/<revision>`` = commit in the hub cache (huggingface_hub's layout), unless the revision is the commit.

    Best effort, as the library's own: a read-only cache only loses the offline lookup by name.
    """
    if revision == commit:
        return
    ref = repo_folder(cache_dir, hf_id) / "refs" / revision
    try:
        if ref.is_file() and ref.read_text().strip() == commit:
            return
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
        tmp.write_text(commit)
        tmp.replace(ref)
    except OSError as exc:
        log.warning("could not record %s@%s = %s in the hub cache (%s)", hf_id, revision, commit, exc)


def cached_snapshot(hf_id: str, revision: str, cache_dir: Path) -> Path:
    """The cached snapshot folder of ``hf_id@revision`` (huggingface_hub's local lookup; no request).

    Raises:
        huggingface_hub.errors.LocalEntryNotFoundError: the revision or its snapshot is not in the cache.
    """
    from huggingface_hub import snapshot_download

    return Path(
        snapshot_download(
            hf_id,
            revision=revision,
            cache_dir=str(cache_dir),
            local_files_only=True,
            allow_patterns=list(HUB_FILES),
            ignore_patterns=list(HUB_SKIP),
        )
    )


def resolve(
    hf_id: str,
    revision: str,
    cache_root: Path,
    lookup: HubLookup | None = None,
    timeout_s: float = HUB_TIMEOUT_S,
) -> HubModel:
    """Resolve ``hf_id@revision`` to its commit: by the hub, else (offline, or no answer) from the cache.

    Args:
        hf_id: ``model.hf_id``.
        revision: ``model.revision``.
        cache_root: ``paths.cache_root`` (the hub cache is :func:`hub_cache_dir` of it).
        lookup: asks the hub (default :func:`_hub_lookup`); it raises huggingface_hub's exceptions.
        timeout_s: per request.

    Returns:
        The :class:`HubModel`; ``offline`` when resolved from the cache.

    Raises:
        ConfigError: the hub refused the id or revision (:func:`hub_error`), or the commit has no
            ``*.safetensors`` weights.
        HubUnavailable: the hub could not be asked and the revision is not in the cache.
    """
    cache_dir = hub_cache_dir(cache_root)
    offline = offline_mode()
    why = "HF_HUB_OFFLINE is set" if offline else ""
    if not offline:
        try:
            commit, params, files = (lookup or _hub_lookup)(hf_id, revision, timeout_s)
        except Exception as exc:  # noqa: BLE001 - sorted below: refused, unreachable, or not ours
            if (message := hub_error(exc, hf_id, revision)) is not None:
                raise ConfigError(message) from exc
            if not _unreachable(exc):
                raise
            endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
            why = f"the hub is not reachable ({endpoint}: {type(exc).__name__}: {exc})"
            log.warning("model.hf_id=%r: %s; looking for revision %r in %s", hf_id, why, revision, cache_dir)
        else:
            if not any(f.endswith(".safetensors") and "/" not in f for f in files):
                raise ConfigError(
                    f"model.hf_id={hf_id!r} at model.revision={revision!r} ({commit}) has no *.safetensors weights "
                    "at its top level; this project reads safetensors checkpoints (a .bin-only or GGUF repo: use "
                    "another revision or repo, or model.source=gguf model.path=/the/file.gguf)"
                )
            _write_ref(cache_dir, hf_id, revision, commit)
            return HubModel(hf_id, revision, commit, str(cache_dir), False, params)
    from huggingface_hub.errors import LocalEntryNotFoundError

    todo = "unset HF_HUB_OFFLINE to download it" if offline else "run where the hub is reachable"
    try:
        snapshot = cached_snapshot(hf_id, revision, cache_dir)
    except LocalEntryNotFoundError as exc:
        raise HubUnavailable(
            f"model.hf_id={hf_id!r} (model.revision={revision!r}) is not in the hub cache {cache_dir} (no snapshot "
            f"under {repo_folder(cache_dir, hf_id).name}), and {why}: it cannot be downloaded; {todo}, or fill "
            f"that cache where the hub is reachable (hf download {hf_id} --revision {revision} --cache-dir "
            f"{cache_dir}) and run with HF_HUB_OFFLINE=1"
        ) from exc
    if not any(snapshot.glob("*.safetensors")):
        raise HubUnavailable(
            f"model.hf_id={hf_id!r} (model.revision={revision!r}): the cached snapshot {snapshot} has no *.safetensors "
            f"weights, and {why}; {todo}, or fill that cache where the hub is reachable "
            f"(hf download {hf_id} --revision {revision} --cache-dir {cache_dir})"
        )
    try:
        counted: int | None = count_parameters(snapshot)
    except (OSError, ValueError):
        counted = None
    return HubModel(hf_id, revision, snapshot.name, str(cache_dir), True, counted)
