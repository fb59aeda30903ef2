"""Redis failing under a lock is a LockUnavailable (a LockError), never a bare redis-py error."""

from __future__ import annotations

import pytest
import redis
from django.test import override_settings

from django_redislua.locks import Lock, LockError, LockUnavailable, Semaphore
from django_redislua.testing import RedisServer

DEAD = [
    "redis://127.0.0.1:1/0",          # nothing listens: connection refused
    "redis+cluster://127.0.0.1:1",    # no cluster node answers (RedisClusterException)
]


@pytest.mark.parametrize("connection", DEAD)
def test_sync_lock_operations(connection: str) -> None:
    lock = Lock("unavailable", timeout=5)
    with override_settings(REDISLUA={"CONNECTION": connection, "SOCKET_TIMEOUT": 0.2}):
        for operation in (lock.acquire, lock.release, lock.locked, lock.owned,
                          lambda: lock.extend(5)):
            with pytest.raises(LockUnavailable) as info:
                operation()
            assert isinstance(info.value, LockError)
            assert not isinstance(info.value, redis.RedisError)
        with pytest.raises(LockUnavailable), Lock("unavailable", timeout=5):
            pass
        with pytest.raises(LockUnavailable):
            Semaphore("unavailable", limit=2, timeout=5).acquire()


@pytest.mark.parametrize("connection", DEAD)
async def test_async_lock_operations(connection: str) -> None:
    lock = Lock("unavailable", timeout=5)
    with override_settings(REDISLUA={"CONNECTION": connection, "SOCKET_TIMEOUT": 0.2}):
        for operation in (lock.aacquire, lock.arelease, lock.alocked, lock.aowned,
                          lambda: lock.aextend(5)):
            with pytest.raises(LockUnavailable):
                await operation()
        with pytest.raises(LockUnavailable):
            async with Lock("unavailable", timeout=5):
                pass
        with pytest.raises(LockUnavailable):
            await Semaphore("unavailable", limit=2, timeout=5).aacquire()


def test_a_server_that_stops_while_a_lock_is_held() -> None:
    with RedisServer() as server, override_settings(
        REDISLUA={"CONNECTION": server.url, "SOCKET_TIMEOUT": 0.3}
    ):
        lock = Lock("held", timeout=5)
        assert lock.acquire()
        server.stop()
        with pytest.raises(LockUnavailable):
            lock.release()
