"""The ``bin/python`` of a shim stage environment (:mod:`prefork.pool`): ``python -m quantverdict.children.X ARGS``
is run by a worker forked from the environment's zygote (:mod:`prefork.zygote`); anything else, or any request
the zygote cannot take (not started yet, refused, gone), by the environment's real interpreter (``exec``).

This process stands for the worker: it keeps its own pid, command line and environment (what the tests' process
markers read), forwards the signals it gets to the worker, and ends with the worker's exit status
(a worker ended by a signal: the same signal). Killed itself, it takes the worker with it (the zygote sees the
connection close). Standard library only, started with ``-S -E``: a few milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def fallback(real: str, args: list[str]) -> None:
    os.execv(real, [real, *args])


def keep_sockets(conn: socket.socket) -> socket.socket:
    """Fork a keeper: a process of this one's group that holds the server's listening socket until this process
    ends. Forked right after the worker, it has a higher pid, and where several processes hold one socket psutil
    names the last one it reads (``net_connections``: by ascending pid): the server's owner then finds a listener
    in the group it started (``quantverdict.serving.server.VLLMServer._verify_ours``). Returns the socket to send
    descriptors to the keeper through."""
    mine, theirs = socket.socketpair()
    if os.fork() == 0:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        mine.close()
        conn.close()  # the zygote must see this launcher's connection end with the launcher
        kept: list[int] = []
        while True:
            data, fds, _, _ = socket.recv_fds(theirs, 64, 4)
            kept.extend(fds)
            if not data:
                os._exit(0)
    theirs.close()
    return mine


def main(real: str, sock_path: str, prefix: str = "quantverdict.children.") -> None:
    """Run ``sys.argv[1:]``: ``-m <prefix>...`` through the zygote listening on ``sock_path``, else (or when it
    cannot) with the interpreter ``real``."""
    args = sys.argv[1:]
    if len(args) < 2 or args[0] != "-m" or not args[1].startswith(prefix):
        fallback(real, args)
    fds, targets = [], []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            continue
        fds.append(fd)
        targets.append(fd)
    pid = 0  # the worker's, once the zygote has answered
    pending: list[int] = []  # signals that came before: forwarded then

    def forward(sig: int, _frame: object) -> None:
        if not pid:
            pending.append(sig)
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def plain() -> None:
        """The real interpreter in this process, the signals that came meanwhile taken as it would have."""
        conn.close()
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        for sig in pending:
            os.kill(os.getpid(), sig)
        fallback(real, args)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    request = {"argv": args[1:], "env": dict(os.environ), "cwd": os.getcwd(), "fd_targets": targets}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(sock_path)
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], fds)
    except OSError:
        plain()
    held: list[int] = []  # a server's listening socket, shared by its worker (prefork.zygote.share_server_socket)
    buf = b""

    def message() -> dict | None:
        """The next line from the zygote or the worker (None: the connection ended); received descriptors are
        kept in ``held``."""
        nonlocal buf
        while b"\n" not in buf:
            try:
                data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 4)
            except OSError:
                return None
            held.extend(fds)
            if not data:
                return None
            buf += data
        line, buf = buf.split(b"\n", 1)
        return dict(json.loads(line))

    answer = message() or {"refused": "no answer"}
    if "pid" not in answer:
        plain()
    keeper = keep_sockets(conn) if args[2:3] == ["serve"] and "--port" in args else None
    pid = int(answer["pid"])
    for sig in pending:
        forward(sig, None)
    while True:
        msg = message()
        if msg is None:  # the zygote ended before the worker reported
            os._exit(255)
        if "status" in msg:
            break
        if keeper is not None and held:  # a server's socket: the keeper holds it, not this process
            socket.send_fds(keeper, [b"F"], held)
            for fd in held:
                os.close(fd)
            held.clear()
    status = int(msg["status"])
    for fd in held:
        os.close(fd)
    if status < 0:  # ended by a signal: so is this process
        if -status != signal.SIGKILL:
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)
