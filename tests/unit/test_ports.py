"""The vLLM server's port: the configured one if it is free, else the next free one above it, unless
``bench.server.strict_port`` asks for that port or none; a port taken while the server starts makes it start
again elsewhere; ``bench.server.port`` is validated with the rest of the config.

Real sockets of this process stand for the other programs on the host. The server in the start tests is a small
Python process that handles its socket as ``vllm serve`` does (vLLM 0.32, ``vllm/entrypoints/launchers/launcher.py``:
``setup_server`` binds the port with ``SO_REUSEADDR`` before the engine is built, the socket listens once the
engine is up) and answers ``/health`` and ``/v1/models``; vLLM itself would take minutes to start here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quantverdict.config.compose import compose
from quantverdict.config.schema import ConfigError, ServerConfig
from quantverdict.processes.envs import StageEnv
from quantverdict.serving.server import (
    PORT_SCAN,
    PortTakenError,
    ServerError,
    VLLMServer,
    hold_port,
    listening_pids,
    pick_port,
    port_is_free,
    reserve_port,
)

HOST = "127.0.0.1"

# vllm serve's socket: bound with SO_REUSEADDR first, listening only after the engine is built (--delay seconds)
STAND_IN = r"""
import argparse, http.server, json, socket, time
ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int)
ap.add_argument("--served-model-name")
ap.add_argument("--delay", type=float, default=0.0)
args, _ = ap.parse_known_args()
time.sleep(args.delay / 2)  # the imports
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", args.port))  # an OSError here: "[Errno 98] Address already in use", as vLLM's
print(f"bound port {args.port}", flush=True)
time.sleep(args.delay / 2)  # the engine
sock.listen()

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"{}" if self.path == "/health" else json.dumps({"data": [{"id": args.served_model_name}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass

server = http.server.HTTPServer(("127.0.0.1", args.port), Handler, bind_and_activate=False)
server.socket = sock
print("Application startup complete.", flush=True)
server.serve_forever()
"""


@pytest.fixture
def listening() -> Iterator[int]:
    """A port this test process listens on (another program's server)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _time_wait_port() -> int:
    """A port that only a connection in TIME_WAIT holds: a server that closed its side first, then stopped."""
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((HOST, 0))
        srv.listen()
        port = int(srv.getsockname()[1])
        client = socket.create_connection((HOST, port))
        conn, _ = srv.accept()
        conn.close()  # the server's side closes first: it is the side that waits in TIME_WAIT
        time.sleep(0.1)
        client.close()
    time.sleep(0.1)
    return port


# --- picking a port ----------------------------------------------------------------------------------------------


def test_a_port_another_program_listens_on_is_passed_over(listening: int) -> None:
    sock, port = reserve_port(HOST, listening)
    try:
        assert listening < port <= listening + PORT_SCAN
        assert hold_port(HOST, port) is None  # held: no other job takes it
    finally:
        sock.close()
    assert pick_port(HOST, listening) != listening


def test_a_port_bound_by_a_server_still_loading_is_passed_over() -> None:
    # vLLM binds its port (SO_REUSEADDR) before it builds its engine and listens only after: for minutes the port
    # has no listener, and a check that binds with SO_REUSEADDR, as port_is_free does, calls it free
    with socket.socket() as loading:
        loading.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        loading.bind((HOST, 0))
        port = int(loading.getsockname()[1])
        assert port_is_free(HOST, port)
        assert pick_port(HOST, port) != port


def test_two_jobs_holding_ports_from_the_same_start_get_two_ports() -> None:
    start = pick_port(HOST, 0)
    first, a = reserve_port(HOST, start)
    second, b = reserve_port(HOST, start)
    try:
        assert a == start and b > a
        # the held port is still the server's to take: a socket bound as vLLM binds it listens there
        with socket.socket() as vllm:
            vllm.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            vllm.bind((HOST, a))
            vllm.listen()
            assert os.getpid() in listening_pids(a)
    finally:
        first.close()
        second.close()


def test_port_zero_is_one_the_os_picks() -> None:
    sock, port = reserve_port(HOST, 0)
    sock.close()
    assert 0 < port <= 65535


def test_strict_port_in_use_fails_naming_the_keys(listening: int) -> None:
    with pytest.raises(ServerError) as err:
        reserve_port(HOST, listening, strict=True)
    msg = str(err.value)
    assert msg.startswith(f"bench.server.port={listening} is already in use on {HOST} (pid {os.getpid()}")
    assert "bench.server.strict_port=true asks for this port or none" in msg
    assert "set bench.server.strict_port=false to take the next free port" in msg


def test_time_wait_counts_as_free_only_for_a_strict_port() -> None:
    # vLLM binds with SO_REUSEADDR, so connections in TIME_WAIT do not keep it from a port it insists on; a port
    # picked freely skips them (a plain bind refuses such a port)
    port = _time_wait_port()
    sock, strict = reserve_port(HOST, port, strict=True)
    sock.close()
    assert strict == port
    assert pick_port(HOST, port) != port


# --- the server's start --------------------------------------------------------------------------------------------


def _server(tmp_path: Path, port: int, strict: bool = False, delay: float = 1.0, name: str = "m") -> VLLMServer:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    cfg = ServerConfig(port=port, strict_port=strict, startup_timeout_s=60)
    server = VLLMServer(StageEnv("serve", sys.executable), tmp_path, name, cfg, 256, "cpu", tmp_path / "server.log")
    server.command = [sys.executable, str(script), "--port", str(server.port), "--served-model-name", name]
    server.command += ["--delay", str(delay)]
    return server


def _start_in_background(server: VLLMServer) -> tuple[threading.Thread, list[BaseException]]:
    """``server.start()`` in a thread; returns once the server's first process runs (its port held)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            server.start()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    while server.pid is None and thread.is_alive():
        assert time.monotonic() < deadline, "the server process did not start"
        time.sleep(0.01)
    return thread, errors


def _foreign_listener(port: int) -> socket.socket:
    """Another program's server taking ``port`` while ours starts (it binds with SO_REUSEADDR, as vLLM does)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen()
    return sock


def test_a_port_taken_while_the_server_starts_makes_it_start_on_the_next(tmp_path: Path) -> None:
    server = _server(tmp_path, pick_port(HOST, 0))
    first = server.port
    thread, errors = _start_in_background(server)
    with _foreign_listener(first):  # between our choice of the port and the server's bind
        thread.join(60)
        assert not errors, errors
        try:
            assert server.port > first and server.start_attempts == 2
            assert server.command[server.command.index("--port") + 1] == str(server.port)
            assert server.base_url == f"http://{HOST}:{server.port}"
            assert os.getpgid(next(iter(listening_pids(server.port)))) == server.pgid  # ours answers there
            assert server.endpoint() == {
                "host": HOST,
                "port": server.port,
                "requested_port": first,
                "strict_port": False,
                "start_attempts": 2,
            }
            # the lost start's log is kept aside; the log is the server's that runs
            lost = (tmp_path / f"server.port{first}.log").read_text()
            assert "Address already in use" in lost
            assert f"bound port {server.port}" in server.log_path.read_text()
            assert "Address already in use" not in server.log_path.read_text()
        finally:
            server.stop()
    assert port_is_free(HOST, server.port)


def test_another_server_answering_on_the_port_makes_ours_start_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "ours").mkdir()
    (tmp_path / "other").mkdir()
    ours = _server(tmp_path / "ours", pick_port(HOST, 0), delay=4.0)  # binds after 2 s, answers after 4 s
    first = ours.port
    other = _server(tmp_path / "other", first, delay=0.0, name="other")  # another job's server, up at once
    thread, errors = _start_in_background(ours)
    other_proc = subprocess.Popen(other.command, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        thread.join(90)
        assert not errors, errors
        assert ours.port > first and ours.start_attempts == 2
        assert os.getpgid(next(iter(listening_pids(ours.port)))) == ours.pgid
        # the other server answered /health before ours bound the port: ours was stopped before its bind
        assert "bound port" not in (tmp_path / "ours" / f"server.port{first}.log").read_text()
        ours.stop()
    finally:
        other_proc.kill()
        other_proc.wait()


def test_strict_port_taken_while_the_server_starts_fails_the_start(tmp_path: Path) -> None:
    server = _server(tmp_path, pick_port(HOST, 0), strict=True)
    first = server.port
    thread, errors = _start_in_background(server)
    with _foreign_listener(first):
        thread.join(60)
    (err,) = errors
    assert isinstance(err, PortTakenError)
    assert f"the vLLM server died during start-up (port {first} was taken)" in str(err)
    assert "bench.server.strict_port=true: no other port is tried" in str(err)
    assert server.port == first and server.pid is None


def test_the_client_is_told_the_port_the_server_will_take(tmp_path: Path, listening: int) -> None:
    env, log = StageEnv("serve", sys.executable), tmp_path / "server.log"
    moved = VLLMServer(env, "/m", "m", ServerConfig(port=listening), 256, "cpu", log)
    assert moved.port != listening and moved.base_url.endswith(f":{moved.port}")
    assert moved.command[moved.command.index("--port") + 1] == str(moved.port)
    strict = ServerConfig(port=listening, strict_port=True)
    kept = VLLMServer(env, "/m", "m", strict, 256, "cpu", log)
    assert kept.port == listening  # checked, and refused, when it starts
    with pytest.raises(ServerError, match=rf"bench\.server\.port={listening} is already in use"):
        kept.start()
    assert kept.pid is None


# --- validation ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("port", [99999, 65536, -1])
def test_a_port_outside_the_tcp_range_is_refused_before_any_work(port: int) -> None:
    with pytest.raises(ConfigError) as err:
        compose([f"bench.server.port={port}"])
    assert f"bench.server.port={port} is not a TCP port: use 1-65535" in str(err.value)


def test_strict_port_needs_a_port_and_the_edges_of_the_range_pass() -> None:
    with pytest.raises(ConfigError, match="bench.server.strict_port=true needs a port to insist on"):
        compose(["bench.server.port=0", "bench.server.strict_port=true"])
    for ok in (["bench.server.port=0"], ["bench.server.port=1"], ["bench.server.port=65535"]):
        compose(ok)
    assert compose(["bench.server.strict_port=true"]).bench.server.strict_port is True
