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

The port: ``bench.server.port`` if it is free, else the next free one above it (the jobs of a grid, or of
two grids, on one host never share one), unless ``bench.server.strict_port`` asks for that port or none
(:func:`reserve_port`). The port is held by a socket of this process from before the server starts until it
stops, so that no other job takes it meanwhile. After ``/health`` answers, the server is checked to be
ours (the listening socket belongs to our process group and ``/v1/models`` names our model), so
a stray server left on the port can never be measured by mistake; a port that another process took while
the server started makes it start again on another port (:meth:`VLLMServer.start`). On exit (normal,
exception, Ctrl-C) the whole group is stopped and the port checked free again.
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


# ports tried above bench.server.port before the OS picks a free one (bench.server.strict_port=false)
PORT_SCAN = 100
# starts of a server whose port another process took while it started, before the job fails (strict_port=false)
START_ATTEMPTS = 4
# how a vLLM server that could not bind its port fails (socket.bind: EADDRINUSE)
PORT_TAKEN_TEXT = ("Address already in use", "[Errno 98]")


class ServerError(RuntimeError):
    """The vLLM server could not be started, verified or stopped. The message says why and where to look."""


class PortTakenError(ServerError):
    """Another process took the server's port while the server started: vLLM could not bind it (EADDRINUSE),
    or another server answers on it."""


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


def hold_port(host: str, port: int, lenient: bool = False) -> socket.socket | None:
    """A socket bound to TCP ``host:port`` that holds the port for a server about to start; None if it is taken.

    The socket binds without ``SO_REUSEADDR``, so every socket already bound to the port refuses it: a listening
    server, another job's hold, a vLLM server that is still loading (vLLM binds its port before it builds its
    engine and listens only once the engine is up) and connections in TIME_WAIT. ``lenient``: with
    ``SO_REUSEADDR``, as :func:`port_is_free` (only a listening socket, or one bound without ``SO_REUSEADDR``,
    refuses it). ``SO_REUSEADDR`` is set on the held socket after its bind: vLLM, which binds with
    ``SO_REUSEADDR`` (vLLM 0.32, ``vllm/entrypoints/launchers/launcher.py``, ``create_server_socket``), can bind
    and listen on the port, while every bind without it, such as another job's :func:`hold_port`, is refused.
    The socket never listens; close it when the server has stopped.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if lenient:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    except OSError:
        sock.close()
        return None
    return sock


def reserve_port(
    host: str, port: int, strict: bool = False, key: str = "bench.server.port"
) -> tuple[socket.socket, int]:
    """Hold a TCP port of ``host`` for a server (:func:`hold_port`): ``port`` itself if it is free, else (not
    ``strict``) the first free one of the :data:`PORT_SCAN` ports above it, else one the OS picks.

    Args:
        host: the address the server binds (``bench.server.host``).
        port: the port asked for, 1-65535; 0: one the OS picks (``strict`` then has no port to insist on).
        strict: this port or none (``bench.server.strict_port``); the port counts as free when only connections
            in TIME_WAIT hold it, as it does for vLLM.
        key: the config key of ``port``, for the message (the strict flag is its sibling ``strict_port``).

    Returns:
        ``(socket, port)``: the socket that holds the port (close it once the server has stopped) and the port.

    Raises:
        ServerError: ``strict`` and ``port`` is taken; the message names the keys, the process that listens
            there (when this user can see it) and the ways out.
    """
    if port == 0:
        sock = hold_port(host, 0)
        if sock is None:  # no port of this host at all: bind() says why
            raise ServerError(f"no free TCP port on {host} for the vLLM server ({key}=0)")
        return sock, int(sock.getsockname()[1])
    if strict:
        sock = hold_port(host, port, lenient=True)
        if sock is None:
            owners = listening_pids(port)
            who = "; ".join(_describe_pid(p) for p in sorted(owners)) or "owner not visible to this user"
            strict_key = f"{key.rpartition('.')[0]}.strict_port" if "." in key else "strict_port"
            raise ServerError(
                f"{key}={port} is already in use on {host} ({who}), and {strict_key}=true asks for this port or "
                f"none. Stop that process, choose another port (e.g. {key}={min(port + 1, 65535)}), or set "
                f"{strict_key}=false to take the next free port."
            )
        return sock, port
    for candidate in range(port, min(port + PORT_SCAN, 65535) + 1):
        sock = hold_port(host, candidate)
        if sock is not None:
            return sock, candidate
    log.info("ports %d-%d of %s are all taken: the OS picks one", port, min(port + PORT_SCAN, 65535), host)
    return reserve_port(host, 0, key=key)


def pick_port(host: str, port: int, strict: bool = False, key: str = "bench.server.port") -> int:
    """The port :func:`reserve_port` would hold now, not held: the address a client is told before the server
    starts. Arguments and errors as :func:`reserve_port`."""
    sock, picked = reserve_port(host, port, strict, key)
    sock.close()
    return picked


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
        port: the port the server listens on (:meth:`endpoint`); before the start, the one it will try first.
        startup_s: seconds from process start to a verified, healthy server.
        start_attempts: how many times the server was started (more than 1: another process took the port
            while it started, see :meth:`start`).
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
        # the port the client is told now and the server tries first: bench.server.port if free, else the next free
        # one (0: one the OS picks); strict_port: that port, checked when the server starts. start() holds it, and
        # moves on when another process took it meanwhile
        strict = server_cfg.strict_port and server_cfg.port != 0
        port = server_cfg.port if strict else pick_port(server_cfg.host, server_cfg.port)
        cfg = dataclasses.replace(server_cfg, port=port)
        self.env = env
        self.model_path = str(model_path)
        self.served_model_name = served_name
        self.requested_port = int(server_cfg.port)
        self.cfg = cfg
        self.max_model_len = max_model_len
        self.device = device
        self.log_path = Path(log_path)
        self.host = cfg.host
        self.command, self._extra_env = build_command(
            env, model_path, served_name, cfg, max_model_len, device, compile_cache_dir
        )
        self._use_port(port)
        self.startup_s: float | None = None
        self.start_attempts = 0
        self._proc: Any = None
        self._pgid: int | None = None
        self._hold: socket.socket | None = None  # holds the port from before the start until stop()
        self._log_offset = 0  # where the current attempt's output starts in the log

    def _use_port(self, port: int) -> None:
        """Point the server (its config, ``--port`` in its command, ``base_url``) at ``port``."""
        self.cfg = dataclasses.replace(self.cfg, port=port)
        self.port = int(port)
        connect_host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        connect_host = "[::1]" if connect_host == "::" else connect_host
        self.base_url = f"http://{connect_host}:{self.port}"
        if "--port" in self.command:
            i = self.command.index("--port")
            self.command = [*self.command[: i + 1], str(self.port), *self.command[i + 2 :]]

    def endpoint(self) -> dict[str, Any]:
        """The record's ``speed.server``: ``host``, ``port`` (the one the server listens on, or last tried),
        ``requested_port`` (``bench.server.port``), ``strict_port`` and ``start_attempts``."""
        return {
            "host": self.host,
            "port": self.port,
            "requested_port": self.requested_port,
            "strict_port": bool(self.cfg.strict_port),
            "start_attempts": self.start_attempts,
        }

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(raise_errors=exc_type is None)

    def start(self) -> None:
        """Hold the port, start the server, wait for ``/health``, verify it is ours.

        The port is held (:func:`reserve_port`) from before the start until :meth:`stop`: the port chosen
        when the server was built if it is still free, else (``bench.server.strict_port=false``) the next free
        one. Another process may still take it between that check and vLLM's own bind (one that binds with
        ``SO_REUSEADDR``, as vLLM does): vLLM then dies with EADDRINUSE, or the other server answers
        ``/health``. Without ``strict_port`` the server is then started again on the next free port, up to
        :data:`START_ATTEMPTS` starts; each lost start's log is kept beside the log as
        ``<log stem>.port<N><suffix>``.

        Raises:
            ServerError: the port is taken (``strict_port``), the process died, ``/health`` did not answer within
                ``bench.server.startup_timeout_s``, or the answering server is not ours. The
                message holds the tail of the server log.
            PortTakenError: (a ServerError) another process took the port while the server started, with
                ``strict_port``, or at every one of the :data:`START_ATTEMPTS` starts.
        """
        first = self.port
        for attempt in range(1, START_ATTEMPTS + 1):
            self.start_attempts = attempt
            self._hold, port = reserve_port(self.host, first, bool(self.cfg.strict_port) and first != 0)
            if port != self.port:
                log.info("port %d is taken: the vLLM server takes port %d", self.port, port)
                self._use_port(port)
            try:
                self._launch()
                return
            except PortTakenError as exc:
                self.stop(raise_errors=False, check_port=False)
                if self.cfg.strict_port:
                    raise PortTakenError(f"{exc}\n(bench.server.strict_port=true: no other port is tried)") from None
                if attempt == START_ATTEMPTS:
                    raise PortTakenError(
                        f"{exc}\n(the port was taken while the server started, {START_ATTEMPTS} times in a row)"
                    ) from None
                lost = self.port
                log.warning("port %d was taken while the vLLM server started; starting it on the next free port", lost)
                self._set_aside_log(lost)
                first = lost + 1 if lost < 65535 else 0

    def _launch(self) -> None:
        """One start on the held port: the process, ``/health``, :meth:`_verify_ours`. On an error other than
        :class:`PortTakenError` the server is stopped; on that one the caller decides."""
        log.info("starting vLLM server for %s on %s (log: %s)", self.served_model_name, self.base_url, self.log_path)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        t0 = time.monotonic()
        try:
            self._proc = procs.start(self.command, self.log_path, env={**self.env.env, **self._extra_env}, echo=False)
            self._pgid = self._proc.pid  # start_new_session: the child leads its own group
            self._wait_healthy(t0)
            self._verify_ours()
        except PortTakenError:
            raise
        except BaseException:
            self.stop(raise_errors=False)
            raise
        self.startup_s = round(time.monotonic() - t0, 1)
        log.info("vLLM server ready in %.1f s (pid %d)", self.startup_s, self._proc.pid)

    def _set_aside_log(self, port: int) -> None:
        """Move a lost start's log to ``<log stem>.port<port><suffix>``: the next start writes a fresh log, whose
        memory and kernel lines (:func:`vllm_log.parse`) are then only the server's that ran."""
        if self.log_path.exists():
            self.log_path.replace(self.log_path.with_name(f"{self.log_path.stem}.port{port}{self.log_path.suffix}"))

    def _attempt_log(self) -> str:
        """The current start's part of the log."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def stop(self, raise_errors: bool = True, check_port: bool = True) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL), let go of the port and check it is free.

        Args:
            raise_errors: raise the problems below; False: log them.
            check_port: wait up to 10 s for the port to be free (False: another process holds it, see
                :meth:`start`).

        Raises:
            ServerError: (only with ``raise_errors``) a process of the group survived, or the port is
                still taken 10 s after the group ended.
        """
        hold, self._hold = self._hold, None
        if hold is not None:
            hold.close()
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        procs.stop_group(proc)
        problems = []
        if self._pgid is not None and procs.group_alive(self._pgid):
            problems.append(f"process group {self._pgid} is still alive")
        deadline = time.monotonic() + 10.0
        while check_port and not port_is_free(self.host, self.port) and time.monotonic() < deadline:
            time.sleep(0.5)
        if check_port and not port_is_free(self.host, self.port):
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
    def _wait_healthy(self, t0: float) -> None:
        timeout = float(self.cfg.startup_timeout_s)
        url = f"{self.base_url}/health"
        while True:
            rc = self._proc.poll()
            if rc is not None:
                time.sleep(0.2)  # the log's last lines (the reader thread copies them after the exit)
                text = self._attempt_log()
                if any(t in text for t in PORT_TAKEN_TEXT):
                    raise PortTakenError(self._death(rc, f" during start-up (port {self.port} was taken)"))
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
            # another process we can see listens on the port: it took the port while ours started
            raise (PortTakenError if owners else ServerError)(
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
        if self._proc is not None:
            procs.log_written(self._proc)  # its last lines, the cause among them, may still be in the pipe
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
