from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from django_redislua.connection import get_client
from django_redislua.scripts import registry


@pytest.fixture
def r() -> Iterator[redis.Redis]:
    """The app's own sync client, on a flushed server (scripts flushed too)."""
    client = get_client()
    assert isinstance(client, redis.Redis)
    client.flushall()
    client.script_flush()
    yield client


@pytest.fixture(autouse=True)
def _flush_redis(settings: object) -> Iterator[None]:
    client = get_client()
    client.flushall()
    yield
    registry.clear() if False else None
