"""Locks under asyncio: context managers, hand-off, and cancellation at every point."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from django_redislua.connection import primary_nodes
from django_redislua.drivers import _background
from django_redislua.exchange import ASYNC_CLUSTER_PUBSUB
from django_redislua.locks import Lock, LockNotOwned, Semaphore, asingle_flight, run_once

pytestmark = pytest.mark.topologies


def _this_loops_background() -> set[asyncio.Task[object]]:
    """The background clean-ups of the running loop: this test's (each test runs its own loop;
    a task of an earlier test's closed loop can never finish, and is not this test's)."""
    loop = asyncio.get_running_loop()
    return {task for task in set(_background) if task.get_loop() is loop}


async def _settled() -> None:
    """Let background releases started by cancellations finish."""
    deadline = time.monotonic() + 5
    while _this_loops_background() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert not _this_loops_background()


def _subscribers(channel: str) -> int:
    """Subscribers of ``channel`` on every primary (on a cluster, PUBSUB NUMSUB through the
    cluster client asks one node only, and a waiter subscribes on its channel's node)."""
    return sum(int(count) for _, node in primary_nodes()
               for _, count in node.pubsub_numsub(channel))


def test_async_context_manager_and_fencing(r: redis.Redis) -> None:
    async def main() -> list[int | None]:
        tokens = []
        for _ in range(3):
            async with Lock("alock", timeout=5) as lock:
                assert await lock.aowned()
                await lock.aextend(5)
                tokens.append(lock.token)
        return tokens

    tokens = asyncio.run(main())
    assert tokens == sorted(set(tokens)) and len(tokens) == 3  # strictly increasing
    assert not r.exists("rl:lock:{alock}")


def test_async_waiter_is_woken_by_release() -> None:
    async def main() -> float:
        holder = Lock("ahandoff", timeout=30)
        await holder.aacquire()

        async def wait() -> float:
            async with Lock("ahandoff", timeout=30, blocking_timeout=5):
                return time.monotonic()

        waiter = asyncio.create_task(wait())
        await asyncio.sleep(0.2)
        released_at = time.monotonic()
        await holder.arelease()
        return await waiter - released_at

    assert asyncio.run(main()) < 0.1


def test_async_auto_renew_and_mutual_exclusion(r: redis.Redis) -> None:
    async def main() -> None:
        async def work() -> None:
            for _ in range(20):
                # A lease long enough for a loaded machine's stalls (the renewal is what the
                # second part tries): a stalled loop losing a 0.3 s lease raised LeaseLost here.
                async with Lock("acounter", timeout=2, auto_renew=True, blocking_timeout=30):
                    value = int(await asyncio.to_thread(r.get, "acounter") or 0)
                    await asyncio.sleep(0.001)
                    await asyncio.to_thread(r.set, "acounter", value + 1)

        await asyncio.gather(*(work() for _ in range(10)))
        async with Lock("renewing", timeout=1, auto_renew=True) as lock:
            await asyncio.sleep(3.0)  # three leases: renewed at least twice
            assert await lock.aowned()
            assert not lock.lost

    asyncio.run(main())
    assert r.get("acounter") == b"200"


def test_cancelling_a_waiter_leaves_no_waiter_and_no_lock(r: redis.Redis) -> None:
    async def main() -> None:
        holder = Lock("acancel", timeout=30)
        await holder.aacquire()
        waiters = [asyncio.create_task(Lock("acancel", timeout=30).aacquire()) for _ in range(5)]
        await asyncio.sleep(0.2)
        # Waiters on an asyncio cluster client before redis-py 8 poll (redislua.W004): there is
        # no subscription to count, only the lock to check.
        subscribed = 0 if isinstance(r, redis.RedisCluster) and not ASYNC_CLUSTER_PUBSUB else 5
        channel = "rl:lock:{acancel}:released"
        deadline = time.monotonic() + 5
        while _subscribers(channel) < subscribed and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert _subscribers(channel) == subscribed  # the count below can see them
        for task in waiters:
            task.cancel()
        for task in waiters:
            with pytest.raises(asyncio.CancelledError):
                await task
        await _settled()
        assert _subscribers("rl:lock:{acancel}:released") == 0
        await holder.arelease()
        assert not r.exists("rl:lock:{acancel}")
        # Nobody is stuck: the next caller gets it at once.
        async with Lock("acancel", timeout=30, blocking_timeout=1) as lock:
            assert lock.token is not None and holder.token is not None
            assert lock.token > holder.token

    asyncio.run(main())


def test_cancellation_at_any_point_of_acquire_never_leaves_the_lock_held(r: redis.Redis) -> None:
    """redis-py's asyncio Lock could stay held when cancelled between the server's SET and the
    client reading the reply. Cancel at many instants across the acquire; afterwards the lock
    must be free, long before its 60 s lease would end."""

    async def main() -> None:
        for step in range(60):
            lock = Lock("acancel2", timeout=60)
            task = asyncio.create_task(lock.aacquire())
            await asyncio.sleep(step * 0.00005)
            task.cancel()
            try:
                acquired = await task
            except asyncio.CancelledError:
                acquired = False
            if acquired:  # the cancel came too late to interrupt it: an ordinary release
                await lock.arelease()
            await _settled()
            assert not r.exists("rl:lock:{acancel2}"), f"held after cancel at step {step}"

    asyncio.run(main())


def test_cancelling_the_body_releases_the_lock(r: redis.Redis) -> None:
    async def main() -> None:
        entered = asyncio.Event()

        async def body() -> None:
            async with Lock("abody", timeout=60, auto_renew=True):
                entered.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(body())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _settled()
        assert not r.exists("rl:lock:{abody}")

    asyncio.run(main())


def test_async_non_owner_release_is_refused() -> None:
    async def main() -> None:
        holder = Lock("aowner", timeout=5)
        await holder.aacquire()
        with pytest.raises(LockNotOwned):
            await Lock("aowner", timeout=5).arelease()
        await holder.arelease()

    asyncio.run(main())


def test_async_semaphore_cancellation_returns_the_permit(r: redis.Redis) -> None:
    async def main() -> None:
        sem = Semaphore("asem", limit=1, timeout=60)
        async with sem:
            task = asyncio.create_task(Semaphore("asem", limit=1, timeout=60).aacquire())
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await _settled()
        assert r.zcard("rl:sem:{asem}") == 0

    asyncio.run(main())


def test_async_single_flight_and_run_once(r: redis.Redis) -> None:
    async def main() -> None:
        async def build() -> str:
            r.incr("abuilds")
            await asyncio.sleep(0.1)
            return "value"

        results = await asyncio.gather(*(asingle_flight("ahot", build) for _ in range(20)))
        assert results == ["value"] * 20

        @run_once(key=lambda n: f"ajob:{n}")
        async def job(n: int) -> int:
            r.incr("aruns")
            await asyncio.sleep(0.1)
            return n * 2

        assert await asyncio.gather(*(job(4) for _ in range(10))) == [8] * 10

    asyncio.run(main())
    assert r.get("abuilds") == b"1"
    assert r.get("aruns") == b"1"
