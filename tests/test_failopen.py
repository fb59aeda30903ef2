"""FAIL_OPEN with a real Redis that is stopped, or paused (CLIENT PAUSE: connected, silent).

Each test gets its own server, so stopping or pausing it cannot disturb the shared one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from django.test import AsyncClient, Client, override_settings

from django_redislua.limiting import denials
from django_redislua.testing import RedisServer

pytestmark = pytest.mark.django_db
TIMEOUT = 0.3  # SOCKET_TIMEOUT / SOCKET_CONNECT_TIMEOUT under test
# The decision must come within the socket timeout; the rest is Django and scheduling slack.
BOUND = TIMEOUT + 0.4
# CLIENT PAUSE ... WRITE holds every script call (EVALSHA, FCALL) while CLIENT UNPAUSE still
# runs (with ALL, UNPAUSE itself waits out the pause): lifted as soon as the request returns, so
# only a failed test waits it out.
SILENT_MS = 30_000


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def redislua(connection: str, fail_open: bool) -> dict[str, object]:
    return {
        "CONNECTION": connection, "FAIL_OPEN": fail_open,
        "SOCKET_TIMEOUT": TIMEOUT, "SOCKET_CONNECT_TIMEOUT": TIMEOUT,
    }


def caches(url: str) -> dict[str, object]:
    # django-redis with its default options: no socket timeout on its own pool.
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "dr": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url},
    }


def timed(client: Client, url: str) -> tuple[int, float]:
    start = time.monotonic()
    status = client.get(url).status_code
    return status, time.monotonic() - start


CONNECTIONS = ["url", "django-redis alias"]


def settings_for(server: RedisServer, kind: str, fail_open: bool) -> override_settings:
    if kind == "url":
        return override_settings(REDISLUA=redislua(server.url, fail_open))
    return override_settings(REDISLUA=redislua("dr", fail_open), CACHES=caches(server.url))


@pytest.mark.parametrize("kind", CONNECTIONS)
@pytest.mark.parametrize(("fail_open", "expected"), [(True, 200), (False, 503)])
def test_server_stopped(client: Client, server: RedisServer, kind: str, fail_open: bool,
                        expected: int, caplog: pytest.LogCaptureFixture) -> None:
    with settings_for(server, kind, fail_open):
        assert [client.get("/rl/inline/").status_code for _ in range(3)] == [200] * 3
        assert client.get("/rl/inline/").status_code == 429  # really limited while up
        server.stop()
        # The denial Redis gave is still known here (at most LOCAL_DENY's horizon, 1 s): the
        # outage does not open the door to the identity just refused.
        assert timed(client, "/rl/inline/")[0] == 429
        denials.forget()
        with caplog.at_level(logging.WARNING, logger="django_redislua"):
            results = [timed(client, "/rl/inline/") for _ in range(5)]
    assert [status for status, _ in results] == [expected] * 5
    assert max(elapsed for _, elapsed in results) < BOUND
    warnings = [r for r in caplog.records if r.name == "django_redislua"]
    assert len(warnings) == 1  # one warning for the outage, not one per request
    assert "unreachable" in warnings[0].getMessage()


@pytest.mark.parametrize("kind", CONNECTIONS)
@pytest.mark.parametrize(("fail_open", "expected"), [(True, 200), (False, 503)])
def test_server_not_answering(client: Client, server: RedisServer, kind: str, fail_open: bool,
                              expected: int, caplog: pytest.LogCaptureFixture) -> None:
    with settings_for(server, kind, fail_open):
        assert client.get("/rl/inline/").status_code == 200  # connected, script loaded
        control = server.client()
        # The pause outlasts any request that waits for Redis, however loaded the machine.
        control.execute_command("CLIENT", "PAUSE", SILENT_MS, "WRITE")
        try:
            with caplog.at_level(logging.WARNING, logger="django_redislua"):
                status, elapsed = timed(client, "/rl/inline/")
        finally:
            control.execute_command("CLIENT", "UNPAUSE")
            control.close()
    assert status == expected
    assert elapsed >= TIMEOUT * 0.9  # it did wait for the socket timeout
    # ...and no longer: it was decided on the failure, while Redis was still silent (had it
    # waited for Redis's answer, it would have had one, and no failure to report). Not a bound
    # on the time taken: that fails on a loaded machine.
    failures = [r for r in caplog.records if r.name == "django_redislua"]
    assert len(failures) == 1 and "Timeout" in failures[0].getMessage(), failures


@pytest.mark.parametrize(("fail_open", "expected"), [(True, 200), (False, 503)])
async def test_async_view_server_stopped(
    server: RedisServer, fail_open: bool, expected: int
) -> None:
    client = AsyncClient()
    with override_settings(REDISLUA=redislua(server.url, fail_open)):
        assert (await client.get("/rl/async/")).status_code == 200
        server.stop()
        start = time.monotonic()
        status = (await client.get("/rl/async/")).status_code
        elapsed = time.monotonic() - start
    assert status == expected
    assert elapsed < BOUND


@pytest.mark.parametrize(("fail_open", "expected"), [(True, 200), (False, 503)])
async def test_async_view_server_not_answering(server: RedisServer, fail_open: bool,
                                               expected: int,
                                               caplog: pytest.LogCaptureFixture) -> None:
    client = AsyncClient()
    with override_settings(REDISLUA=redislua(server.url, fail_open)):
        assert (await client.get("/rl/async/")).status_code == 200
        control = server.client()
        control.execute_command("CLIENT", "PAUSE", SILENT_MS, "WRITE")  # as above
        try:
            with caplog.at_level(logging.WARNING, logger="django_redislua"):
                start = time.monotonic()
                status = (await client.get("/rl/async/")).status_code
                elapsed = time.monotonic() - start
        finally:
            control.execute_command("CLIENT", "UNPAUSE")
            control.close()
    assert status == expected
    assert elapsed >= TIMEOUT * 0.9
    failures = [r for r in caplog.records if r.name == "django_redislua"]
    assert len(failures) == 1 and "Timeout" in failures[0].getMessage(), failures


def test_middleware_fail_closed(client: Client, server: RedisServer) -> None:
    config = {**redislua(server.url, False),
              "POLICIES": {"api": {"rate": "5/m", "key": "ip"}},
              "MIDDLEWARE_POLICIES": [{"path": "/rl/api/", "policy": "api"}]}
    middleware = ["django_redislua.middleware.RateLimitMiddleware"]
    with override_settings(REDISLUA=config, MIDDLEWARE=middleware):
        assert client.get("/rl/api/ok/").status_code == 200
        server.stop()
        assert client.get("/rl/api/ok/").status_code == 503
        assert client.get("/rl/ok/").status_code == 200  # no rule applies: Redis not asked
