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


@pytest.mark.parametrize("connection", DEAD)
def test_coordination_helpers_raise_lock_unavailable(connection: str) -> None:
    from django_redislua.locks import run_once, single_flight, singleton
    from django_redislua.recipes import RecipeUnavailable, VersionedCache

    ran: list[str] = []

    @run_once(key="unavailable", timeout=5)
    def handler() -> str:
        ran.append("run_once")
        return "done"

    @singleton("unavailable", timeout=5)
    def job() -> str:
        ran.append("singleton")
        return "done"

    with override_settings(REDISLUA={"CONNECTION": connection, "SOCKET_TIMEOUT": 0.2}):
        for call in (handler, handler.outcome, job,  # type: ignore[attr-defined]
                     lambda: single_flight("unavailable", lambda: ran.append("flight"))):
            with pytest.raises(LockUnavailable) as info:
                call()
            assert not isinstance(info.value, redis.RedisError)
        with pytest.raises(RecipeUnavailable):
            VersionedCache("unavailable").get_or_build("k", lambda: ran.append("cache"))
    assert ran == []  # nothing ran without its lease


@pytest.mark.parametrize("connection", DEAD)
async def test_async_coordination_helpers_raise_lock_unavailable(connection: str) -> None:
    from django_redislua.locks import asingle_flight, run_once

    @run_once(key="unavailable", timeout=5)
    async def handler() -> str:
        return "done"

    async def build() -> str:
        return "built"

    with override_settings(REDISLUA={"CONNECTION": connection, "SOCKET_TIMEOUT": 0.2}):
        for call in (handler, handler.outcome,  # type: ignore[attr-defined]
                     lambda: asingle_flight("unavailable", build)):
            with pytest.raises(LockUnavailable):
                await call()


def test_a_jobs_own_redis_error_is_its_own_not_lock_unavailable() -> None:
    """Only the helpers' own Redis calls become LockUnavailable: a job, handler or build that
    itself fails to reach a Redis (its own cache, say) raises its own error, unchanged."""
    from django_redislua.locks import run_once, single_flight, singleton
    from django_redislua.recipes import VersionedCache

    own = redis.ConnectionError("the job's own Redis is down")

    def failing() -> None:
        raise own

    for call in (run_once(key="own-error", timeout=5)(failing),
                 singleton("own-error", timeout=5)(failing),
                 lambda: single_flight("own-error", failing),
                 lambda: VersionedCache("own-error").get_or_build("k", failing)):
        with pytest.raises(redis.ConnectionError) as info:
            call()
        assert info.value is own
