"""A pre-imported interpreter of one stage environment that forks the stage children the integration tier starts.

Run by :mod:`prefork.pool` as ``<env python> zygote.py SOCKET LOG_PREFIX MODULE...``, with the environment the
stage's children get. It imports ``MODULE...`` once (vLLM, lm-eval, llm-compressor: 10-20 s of CPU each on a
2-core host), then listens on the Unix socket ``SOCKET``. :mod:`prefork.launcher` (the stage environment's
``bin/python`` in the tier's shim environments) sends a ``python -m quantverdict.children.X ARGS`` request:
its argv, environment, working folder and its standard streams (file descriptors, ``SCM_RIGHTS``). The zygote
forks a worker that takes them over and runs the module as ``python -m`` would (:func:`runpy.run_module`); the
launcher stands for the worker (signals forwarded, its exit status returned); a launcher that ends before its worker
(killed) takes the worker's process group with it.

A request whose environment differs from the zygote's in a variable a pre-imported module may have read on import
(``HF_*``, ``OMP_*``, ``HOME``, ``PYTHONPATH``, ...: all but :data:`MAY_DIFFER`) is refused: the launcher then
starts the real interpreter.

Single-threaded (a selector loop): nothing holds a lock when it forks. Standard library only before the imports.
"""

from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback

# variables that no pre-imported module reads on import: a request may set them apart from the zygote's
MAY_DIFFER_PREFIXES = ("QV_", "PYTEST_", "VLLM_", "MLFLOW_", "_MLFLOW_", "HYDRA_")
MAY_DIFFER = frozenset(
    {"PYTHONUNBUFFERED", "TOKENIZERS_PARALLELISM", "PATH", "PWD", "OLDPWD", "_", "SHLVL", "TMPDIR", "COLUMNS", "LINES"}
    | {"TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"}  # read when vLLM's engine starts, not on import
)
# ... but these are read when vLLM is imported (its logging configuration)
MUST_MATCH_PREFIXES = ("VLLM_LOGGING", "VLLM_CONFIGURE_LOGGING")
PR_SET_PDEATHSIG = 1


def differing(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """Names of the variables that differ between two environments and may not (see :data:`MAY_DIFFER`)."""
    keys = set(mine) | set(theirs)
    return sorted(
        k
        for k in keys
        if mine.get(k) != theirs.get(k)
        and (k.startswith(MUST_MATCH_PREFIXES) or (k not in MAY_DIFFER and not k.startswith(MAY_DIFFER_PREFIXES)))
    )


def log(msg: str) -> None:
    print(f"[zygote {os.getpid()} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def worker_env(request_env: dict[str, str], before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """The request's environment plus what the zygote's imports set in theirs (a fresh interpreter's imports would
    set it too), where the request does not set it apart."""
    env = dict(request_env)
    for key, value in after.items():
        if before.get(key) != value and request_env.get(key) == before.get(key):
            env[key] = value
    return env


def share_server_socket(report: socket.socket, argv: list[str]) -> None:
    """In a worker serving ``--port N``: the TCP socket it binds to port N is sent to its launcher too, which holds
    it until it ends. The launcher's process group then listens on the port as well, where the server's owner
    looks for it (``quantverdict.serving.server.VLLMServer._verify_ours``: a listener in the group it started)."""
    if "--port" not in argv[:-1]:
        return
    port = int(argv[argv.index("--port") + 1])
    bind = socket.socket.bind

    def bind_and_share(self: socket.socket, address: object) -> None:
        bind(self, address)
        if self.family in (socket.AF_INET, socket.AF_INET6) and self.getsockname()[1] == port:
            try:
                socket.send_fds(report, [b'{"fd": 1}\n'], [self.fileno()])
            except OSError:
                pass

    socket.socket.bind = bind_and_share  # type: ignore[method-assign]


def die_with_parent() -> None:
    """SIGKILL when the parent ends (``prctl(PR_SET_PDEATHSIG)``); ended at once if it already has."""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # noqa: BLE001 - no prctl: the pool's teardown still kills the group
        return
    if os.getppid() != parent:
        os._exit(255)


def run_worker(
    request: dict, fds: list[int], closing: list[socket.socket], other_fds: list[int], report: socket.socket
) -> None:
    """In the forked worker: take over the launcher's streams, folder and environment, run the module; never
    returns (its exit status is the module's, through :class:`SystemExit` to the interpreter's own exit).
    ``closing``/``other_fds``: the zygote's sockets and the descriptors of other pending requests, closed here;
    ``report``: the launcher's connection (a server's socket is shared through it)."""
    os.setsid()  # first: the zygote kills this group when the launcher ends
    die_with_parent()  # the zygote gone: so is the worker
    for s in closing:
        s.close()
    for fd in other_fds:
        os.close(fd)
    report.set_inheritable(False)
    share_server_socket(report, request["argv"])
    for target, fd in zip(request["fd_targets"], fds, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    import tempfile

    tempfile.tempdir = None  # TMPDIR of the request, not the zygote's
    module, *args = request["argv"]
    sys.argv = [module, *args]
    sys.path[0] = request["cwd"]  # as `python -m` puts it, where the zygote's script folder was
    sys.modules.pop(module, None)  # run afresh as __main__, as `python -m` does
    if "numpy" in sys.modules:  # a fresh interpreter seeds numpy's global generator from the OS
        sys.modules["numpy"].random.seed()
    code: int | str | None = 0
    try:
        import runpy

        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends `python -m`
        traceback.print_exc()
        code = 1
    raise SystemExit(code)


def send(conn: socket.socket, message: dict) -> bool:
    """One line to a launcher; False when it is gone."""
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        return False
    return True


def kill_group(pid: int, reaped: bool = False) -> None:
    """SIGKILL the worker's process group; a worker not reaped yet (its pid still ours) also by its pid, in case
    it had not called ``setsid`` yet."""
    kills = (os.killpg,) if reaped else (os.killpg, os.kill)
    for kill in kills:
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


def serve(path: str, env_at_start: dict[str, str]) -> None:
    env_imported = dict(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(tmp)
    listener.listen(64)
    os.replace(tmp, path)  # the launcher sees the socket only once it is listening
    log(f"listening on {path}; threads {len(os.listdir('/proc/self/task'))}")
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    pending: dict[socket.socket, bytearray] = {}  # connection -> request bytes so far
    fds_of: dict[socket.socket, list[int]] = {}  # connection -> the descriptors its request brought so far
    worker_of: dict[socket.socket, int] = {}  # connection -> its worker's pid

    def drop(conn: socket.socket) -> None:
        """Forget a launcher's connection: closed, with what its request brought and no worker took."""
        sel.unregister(conn)
        conn.close()
        pending.pop(conn, None)
        worker_of.pop(conn, None)
        for fd in fds_of.pop(conn, []):
            os.close(fd)

    while True:
        for key, _ in sel.select(timeout=0.1):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is listener:
                conn, _ = listener.accept()
                pending[conn] = bytearray()
                fds_of[conn] = []
                sel.register(conn, selectors.EVENT_READ)
                continue
            if sock in worker_of:  # the launcher hung up (or wrote): it ended before its worker
                try:
                    ended = not sock.recv(4096)
                except OSError:
                    ended = True
                if ended:
                    pid = worker_of[sock]
                    drop(sock)
                    kill_group(pid)
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
            except OSError:
                data, fds = b"", []
            fds_of[sock].extend(fds)
            if not data:
                drop(sock)
                continue
            pending[sock].extend(data)
            if not pending[sock].endswith(b"\n"):
                continue
            request = json.loads(bytes(pending.pop(sock)))
            bad = differing(env_at_start, request["env"])
            if bad:
                log(f"refused {request['argv'][0]}: its environment differs in {bad}")
                send(sock, {"refused": bad})
                drop(sock)
                continue
            fds = fds_of.pop(sock)
            sys.stdout.flush()
            sys.stderr.flush()
            request["env"] = worker_env(request["env"], env_at_start, env_imported)
            pid = os.fork()
            if pid == 0:
                others = [fd for pending_fds in fds_of.values() for fd in pending_fds]
                run_worker(request, fds, [listener, *worker_of, *pending], others, sock)
            for fd in fds:
                os.close(fd)
            worker_of[sock] = pid
            log(f"forked {pid}: {' '.join(request['argv'])[:200]}")
            if not send(sock, {"pid": pid}):  # the launcher is gone already
                drop(sock)
                kill_group(pid)
        while True:  # reap ended workers, and tell their launchers
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            kill_group(pid, reaped=True)  # what the worker left of its group (a plain start's group ends with its stop)
            conn = next((c for c, p in worker_of.items() if p == pid), None)
            if conn is not None:
                send(conn, {"status": os.waitstatus_to_exitcode(status)})
                drop(conn)


def main() -> None:
    path, modules = sys.argv[1], sys.argv[2:]
    die_with_parent()  # the test process gone: so is its zygote (and, through theirs, its workers)
    env_at_start = dict(os.environ)
    t0 = time.perf_counter()
    try:  # vLLM's CPU build answers to the name vllm only through this alias (quantverdict.children.vllm_cli)
        from quantverdict.children.vllm_cli import install_alias

        install_alias()
    except ImportError:
        pass
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a module this environment lacks: its children import it themselves
            log(f"import {name} failed: {exc!r}")
    import gc

    gc.collect()
    gc.freeze()  # the imported objects stay out of the workers' collections: fewer copied pages
    log(f"imported {len(modules)} modules in {time.perf_counter() - t0:.1f} s")
    serve(path, env_at_start)


if __name__ == "__main__":
    main()
