"""A vLLM OpenAI-compatible server for the speed sweep, started and stopped as one unit.

Orchestrator side: this module never imports vLLM. The server runs in the serve environment as
``python -m quantverdict.children.vllm_cli serve ...`` (the ``vllm`` command, see ``vllm_cli``),
leading its own process group through :mod:`quantverdict.processes.procs`, its output in a log file that
:mod:`quantverdict.measure.vllm_log` reads for the memory numbers (weights, KV cache).

Use it as a context manager::

    with VLLMServer(env, model_path, served_name="smollm2-135m-bf16", server_cfg=cfg.bench.server,
                    max_model_len=2048, device="cpu", log_path=run_dir / "server.log") as server:
        points = run_sweep(server, cfg.bench, tokenizer_path, env, run_dir / "bench")
    memory = server.log_info()

Before starting, the port is checked; after ``/health`` answers, the server is checked to be
ours (the listening socket belongs to our process group and ``/v1/models`` names our model), so
a stray server left on the port can never be measured by mistake. On exit (normal, exception,
Ctrl-C) the whole group is stopped and the port checked free again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

from quantverdict.config.schema import ServerConfig
from quantverdict.measure import vllm_log
from quantverdict.processes import procs
from quantverdict.processes.envs import StageEnv

log = logging.getLogger(__name__)

CLI_MODULE = "quantverdict.children.vllm_cli"
# the dev-mode endpoints (POST /reset_prefix_cache), as vLLM's own sweep tool starts its server
DEV_MODE_ENV = {"VLLM_SERVER_DEV_MODE": "1"}


class ServerError(RuntimeError):
    """The vLLM server could not be started, verified or stopped. The message says why and where to look."""


def port_is_free(host: str, port: int) -> bool:
    """True if a TCP socket can bind ``host:port`` now (``SO_REUSEADDR``, as uvicorn sets it).

    On Linux a port with a listening socket cannot be bound even with ``SO_REUSEADDR``; a port
    that only has connections in TIME_WAIT can, as it can for the server.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str) -> int:
    """A TCP port of ``host`` that no socket holds now (the OS picks it: bind to port 0)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listening_pids(port: int) -> set[int]:
    """Pids holding a socket that listens on TCP ``port`` (any address, IPv4 or IPv6), among the processes
    whose sockets this user can see (``psutil.net_connections``)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return set()
    return {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}


def _describe_pid(pid: int) -> str:
    try:
        cmd = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return f"pid {pid}"
    return f"pid {pid}: {cmd.strip()[:160]}"


# vLLM start-up failures whose fix is one of our config keys: (text in the root cause, what to set)
_HINTS = (
    (
        "Mamba cache blocks",
        "a hybrid model (Gated DeltaNet, Mamba) needs one recurrent-state block per sequence: set "
        "bench.server.max_num_seqs at or below the number vLLM names (vLLM defaults to 1024 sequences on "
        "H100/H200-class GPUs and to 256 on smaller ones and A100s, config.targets.vllm_batch_defaults; a small "
        "memory fraction on a big GPU keeps the big GPU's 1024)",
    ),
)


def _hint(cause: str | None) -> str:
    """``". Fix: ..."`` for a root cause in :data:`_HINTS`, else ``""``."""
    return next((f". Fix: {fix}" for text, fix in _HINTS if cause and text in cause), "")


def _log_tail(path: Path, lines: int = 12) -> str:
    """The last ``lines`` lines of the server log, shutdown noise left out (:func:`procs.clean_tail`)."""
    return procs.clean_tail(procs.read_log(path), lines) or "(empty log)"


def _http_json(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own local server
        return json.loads(resp.read().decode())


def _http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


# the JIT caches of the kernels vLLM builds at start-up, put under the compile cache root (see build_command)
JIT_CACHE_VARS = {"TRITON_CACHE_DIR": "triton", "FLASHINFER_WORKSPACE_BASE": "flashinfer"}


def build_command(
    env: StageEnv,
    model_path: str | Path,
    served_model_name: str,
    cfg: ServerConfig,
    max_model_len: int,
    device: str,
    compile_cache_dir: str | Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The ``vllm serve`` command line and its extra environment variables.

    Args:
        env: the serve environment (interpreter + PYTHONPATH etc.).
        model_path: checkpoint directory (bf16 or compressed-tensors).
        served_model_name: the name clients use in ``model=``.
        cfg: ``bench.server``.
        max_model_len: tokens per sequence (``bench.server.max_model_len`` or ``model.max_model_len``).
        device: ``cpu`` or ``cuda`` (``env.device``).
        compile_cache_dir: vLLM's cache root (``VLLM_CACHE_ROOT``; its ``torch_compile_cache/`` holds the
            compiled graphs, ``vllm/compilation/backends.py``), kept across the jobs of a grid; the JIT caches
            of the kernels vLLM compiles at start-up go under it too: ``triton/`` (``TRITON_CACHE_DIR``) and
            ``flashinfer/`` (``FLASHINFER_WORKSPACE_BASE``; FlashInfer adds ``.cache/flashinfer/<version>/<arch>``),
            whose sampling kernels took 83 s of nvcc on an H200 without them (vLLM 0.26), unless the caller's
            environment already sets the variable. None: the libraries' defaults (``~/.cache/vllm``,
            ``~/.triton/cache``, ``~/.cache/flashinfer``).

    Returns:
        ``(cmd, env_vars)``. ``VLLM_SERVER_DEV_MODE=1`` always (``POST /reset_prefix_cache``); prefix
        caching stays at vLLM's default (on). On CPU, ``kv_cache_space_gib`` becomes ``VLLM_CPU_KVCACHE_SPACE`` (whole
        GiB, the variable is an integer) or ``--kv-cache-memory-bytes`` (fractional GiB); on CUDA
        ``--gpu-memory-utilization`` is passed.
    """
    cmd = env.module(CLI_MODULE, "serve", str(model_path))
    cmd += ["--host", cfg.host, "--port", str(cfg.port), "--served-model-name", served_model_name]
    cmd += ["--max-model-len", str(max_model_len)]
    if cfg.enforce_eager:
        cmd.append("--enforce-eager")
    if cfg.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(cfg.max_num_seqs)]
    if cfg.dtype and cfg.dtype != "auto":
        cmd += ["--dtype", cfg.dtype]
    if cfg.kv_cache_dtype and cfg.kv_cache_dtype != "auto":
        cmd += ["--kv-cache-dtype", cfg.kv_cache_dtype]
    extra_env: dict[str, str] = dict(DEV_MODE_ENV)
    if compile_cache_dir is not None:
        extra_env["VLLM_CACHE_ROOT"] = str(compile_cache_dir)
        for var, sub in JIT_CACHE_VARS.items():  # a caller's own setting wins (its shell or env.serve.env_vars)
            if var not in os.environ and var not in env.env:
                extra_env[var] = str(Path(compile_cache_dir) / sub)
    if device == "cuda":
        cmd += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    elif cfg.kv_cache_space_gib is not None:
        gib = float(cfg.kv_cache_space_gib)
        if gib.is_integer():
            extra_env["VLLM_CPU_KVCACHE_SPACE"] = str(int(gib))
        else:
            cmd += ["--kv-cache-memory-bytes", str(int(gib * 2**30))]
    if cfg.tensor_parallel_size > 1:  # shard over the GPUs the launcher gave the job (CUDA_VISIBLE_DEVICES)
        cmd += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    if cfg.load_format != "auto":  # dummy: random weights from the checkpoint's config, nothing read from disk
        cmd += ["--load-format", cfg.load_format]
    cmd += list(cfg.extra_args)
    return cmd, extra_env


class VLLMServer:
    """``vllm serve`` in its own process group, healthy and verified inside the ``with`` block.

    Args:
        env: the serve environment.
        model_path: checkpoint directory.
        served_name: the model name the API serves (``--served-model-name``).
        server_cfg: ``bench.server`` (host, port, start-up timeout, vLLM options).
        max_model_len: tokens per sequence.
        device: ``cpu`` or ``cuda``.
        log_path: the server's log file (appended to).
        compile_cache_dir: ``VLLM_CACHE_ROOT`` (see :func:`build_command`); None: vLLM's default.

    Attributes (after ``__enter__``):
        base_url: ``http://host:port``.
        startup_s: seconds from process start to a verified, healthy server.
        log_path: the server's log (stdout + stderr).
        command: the command line that was run.
    """

    def __init__(
        self,
        env: StageEnv,
        model_path: str | Path,
        served_name: str,
        server_cfg: ServerConfig,
        max_model_len: int,
        device: str,
        log_path: Path,
        compile_cache_dir: str | Path | None = None,
    ):
        # port 0: a free port of this host, chosen now and passed to vLLM (jobs of a parallel grid on one node never
        # share one; a port taken between this choice and the start is caught by _verify_ours)
        cfg = server_cfg if server_cfg.port else dataclasses.replace(server_cfg, port=free_port(server_cfg.host))
        self.env = env
        self.model_path = str(model_path)
        self.served_model_name = served_name
        self.cfg = cfg
        self.max_model_len = max_model_len
        self.device = device
        self.log_path = Path(log_path)
        self.host = cfg.host
        self.port = int(cfg.port)
        connect_host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        connect_host = "[::1]" if connect_host == "::" else connect_host
        self.base_url = f"http://{connect_host}:{self.port}"
        self.command, self._extra_env = build_command(
            env, model_path, served_name, cfg, max_model_len, device, compile_cache_dir
        )
        self.startup_s: float | None = None
        self._proc: Any = None
        self._pgid: int | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(raise_errors=exc_type is None)

    def start(self) -> None:
        """Check the port, start the server, wait for ``/health``, verify it is ours.

        Raises:
            ServerError: the port is taken, the process died, ``/health`` did not answer within
                ``bench.server.startup_timeout_s``, or the answering server is not ours. The
                message holds the tail of the server log.
        """
        self._check_port_free()
        log.info("starting vLLM server for %s on %s (log: %s)", self.served_model_name, self.base_url, self.log_path)
        t0 = time.monotonic()
        self._proc = procs.start(self.command, self.log_path, env={**self.env.env, **self._extra_env}, echo=False)
        self._pgid = self._proc.pid  # start_new_session: the child leads its own group
        try:
            self._wait_healthy(t0)
            self._verify_ours()
        except BaseException:
            self.stop(raise_errors=False)
            raise
        self.startup_s = round(time.monotonic() - t0, 1)
        log.info("vLLM server ready in %.1f s (pid %d)", self.startup_s, self._proc.pid)

    def stop(self, raise_errors: bool = True) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL) and check the port is free.

        Raises:
            ServerError: (only with ``raise_errors``) a process of the group survived, or the port is
                still taken 10 s after the group ended.
        """
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        procs.stop_group(proc)
        problems = []
        if self._pgid is not None and procs.group_alive(self._pgid):
            problems.append(f"process group {self._pgid} is still alive")
        deadline = time.monotonic() + 10.0
        while not port_is_free(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not port_is_free(self.host, self.port):
            owners = listening_pids(self.port)
            who = "; ".join(_describe_pid(p) for p in sorted(owners)) or "owner unknown"
            problems.append(f"port {self.port} is still taken after the server stopped ({who})")
        if problems:
            msg = "stopping the vLLM server: " + "; ".join(problems)
            if raise_errors:
                raise ServerError(msg)
            log.warning(msg)
        else:
            log.info("vLLM server stopped; port %d free", self.port)

    # -- checks ----------------------------------------------------------------------------
    def _check_port_free(self) -> None:
        if port_is_free(self.host, self.port):
            return
        owners = listening_pids(self.port)
        who = "; ".join(_describe_pid(p) for p in sorted(owners)) or "owner not visible to this user"
        raise ServerError(
            f"bench.server.port={self.port} is already in use on {self.host} ({who}). Stop that process "
            f"or choose another port, e.g. bench.server.port={self.port + 1}."
        )

    def _wait_healthy(self, t0: float) -> None:
        timeout = float(self.cfg.startup_timeout_s)
        url = f"{self.base_url}/health"
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise ServerError(self._death(rc, " during start-up"))
            if _http_ok(url):
                return
            if time.monotonic() - t0 > timeout:
                raise ServerError(
                    f"the vLLM server did not answer {url} within bench.server.startup_timeout_s={timeout:g} s "
                    f"(log: {self.log_path}):\n{_log_tail(self.log_path)}"
                )
            time.sleep(1.0)

    def _verify_ours(self) -> None:
        """The listening socket belongs to our process group and ``/v1/models`` names our model."""
        owners = listening_pids(self.port)
        ours = set()
        for pid in owners:
            try:
                if os.getpgid(pid) == self._pgid:
                    ours.add(pid)
            except ProcessLookupError:
                continue
        if not ours:
            who = "; ".join(_describe_pid(p) for p in sorted(owners)) or "owner not visible"
            raise ServerError(
                f"a server answers on port {self.port}, but it is not the one we started (listening: {who}); "
                f"our server log: {self.log_path}"
            )
        try:
            models = [m.get("id") for m in _http_json(f"{self.base_url}/v1/models").get("data", [])]
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ServerError(f"GET {self.base_url}/v1/models failed: {exc}") from exc
        if self.served_model_name not in models:
            raise ServerError(
                f"the server on port {self.port} serves {models}, not {self.served_model_name!r} (log: {self.log_path})"
            )

    def check_alive(self, when: str = "", wait_s: float = 0.0) -> None:
        """Raise :class:`ServerError` if the server process has ended: it died, since only :meth:`stop` ends it.

        Args:
            when: where the job was, for the message (e.g. ``" during the sweep"``).
            wait_s: when its log already holds an error (:func:`procs.root_cause`), wait up to this
                long for the process to end: vLLM's API server shuts down a few seconds after its engine died,
                and a client that failed meanwhile should report the death, not its own connection error.

        Raises:
            ServerError: the first line says that the server died and quotes the root cause from its log; the
                exit code follows (0 is the API server's orderly exit after its engine failed), then the
                log's last lines without shutdown noise.
        """
        if self._proc is None:
            raise ServerError("the vLLM server is not running")
        rc = self._proc.poll()
        if rc is None and wait_s > 0 and procs.log_root_cause(self.log_path):
            deadline = time.monotonic() + wait_s
            while rc is None and time.monotonic() < deadline:
                time.sleep(0.5)
                rc = self._proc.poll()
        if rc is not None:
            raise ServerError(self._death(rc, when))

    def _death(self, rc: int, when: str) -> str:
        """The message for a server process that ended by itself with return code ``rc``."""
        cause = procs.log_root_cause(self.log_path)
        if rc < 0:
            how = f"killed by signal {-rc}"
        elif rc == 0:
            how = "its API server then shut down, exit code 0" if cause else "it stopped by itself, exit code 0"
        else:
            how = f"exit code {rc}"
        head = f"the vLLM server died{when}: {cause}" if cause else f"the vLLM server died{when}, no error in its log"
        return f"{head} ({how}; log: {self.log_path}){_hint(cause)}\nlast lines of the log:\n{_log_tail(self.log_path)}"

    # -- the dev-mode cache reset and the counters ------------------------------------------------
    def reset_prefix_cache(self, tries: int = 20) -> bool:
        """``POST /reset_prefix_cache`` (dev mode) until it answers ``{"success": true}``; vLLM refuses while
        KV blocks are still held by running requests. Returns whether it succeeded within ``tries``.

        Raises:
            ServerError: the endpoint is absent (the server was not started with ``VLLM_SERVER_DEV_MODE=1``).
        """
        url = f"{self.base_url}/reset_prefix_cache"
        for _ in range(tries):
            req = urllib.request.Request(url, data=b"", method="POST")  # noqa: S310 - our own local server
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
                    body = resp.read().decode()
            except urllib.error.HTTPError as exc:
                raise ServerError(f"POST {url} failed ({exc}); is VLLM_SERVER_DEV_MODE=1 set?") from exc
            if not body.strip() or json.loads(body).get("success", True):
                return True
            time.sleep(0.25)
        return False

    def counters(self) -> dict[str, float]:
        """vLLM's counters from ``GET /metrics`` (``prometheus_client``'s text parser), each family summed
        over its label sets: ``{"vllm:prefix_cache_queries": ..., "vllm:prompt_tokens": ..., ...}``
        (names without the ``_total`` suffix; see :mod:`quantverdict.measure.server_metrics`)."""
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=30) as resp:  # noqa: S310
            text = resp.read().decode()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.type == "counter" and family.name.startswith("vllm:"):
                out[family.name] = float(sum(s.value for s in family.samples if s.name == family.name + "_total"))
        return out

    # -- results ---------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """Pid of the server's group leader, None when stopped."""
        return self._proc.pid if self._proc is not None else None

    @property
    def pgid(self) -> int | None:
        """Process group id of the last started server (kept after stop, to check that it is gone)."""
        return self._pgid

    def log_info(self) -> dict[str, Any]:
        """Memory, KV cache and kernel facts parsed from the server log (:func:`vllm_log.parse`)."""
        return vllm_log.parse(self.log_path.read_text(errors="replace"))
