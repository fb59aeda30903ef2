"""Fencing tokens that survive data loss, keys that do not live forever, and leases that are
renewed while the protected code runs and never lost silently (singleton, run_once,
single_flight); sync and asyncio, single node and the real cluster."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_redislua.atransport import AsyncTransport, get_async_transport
from django_redislua.connection import get_client
from django_redislua.drivers import adrive
from django_redislua.locks import (
    LeaseLost,
    Lock,
    LockNotOwned,
    LockUnavailable,
    RunInProgress,
    asingle_flight,
    run_once,
    single_flight,
    singleton,
)
from django_redislua.locks.inspect import force_release
from django_redislua.locks.keys import keys_for
from django_redislua.locks.lease import Lease, start_renewing, stop_renewing
from django_redislua.protocol import Call
from django_redislua.testing import RedisServer

# Tests on the app's configured Redis are marked ``topologies``: they run on the single server
# and again on the 6-node cluster (tests/conftest.py). Tests that start their own servers, need
# none, or are about the cluster alone run once.


# -- fencing ----------------------------------------------------------------------------------

def test_tokens_keep_increasing_after_a_restart_without_persistence() -> None:
    server = RedisServer().start()
    try:
        with override_settings(REDISLUA={**settings.REDISLUA, "CONNECTION": server.url}):
            tokens = []
            for _ in range(5):
                with Lock("restart", timeout=5) as lock:
                    tokens.append(lock.token)
            server.stop()
            server = RedisServer(port=server.port).start()  # same port, empty: no counter
            assert not server.client().exists("rl:lock:{restart}:fence")
            for _ in range(3):
                for _attempt in range(50):  # the pool reconnects after the restart
                    try:
                        with Lock("restart", timeout=5) as lock:
                            tokens.append(lock.token)
                        break
                    except LockUnavailable:
                        time.sleep(0.05)
        assert len(tokens) == 8
        assert all(a < b for a, b in itertools.pairwise(tokens))
    finally:
        server.stop()


@pytest.mark.topologies
def test_tokens_keep_increasing_after_the_counter_is_evicted() -> None:
    client = get_client()
    lock = Lock("evicted", timeout=5)
    with lock:
        first = lock.token
    client.delete(lock.keys.sub("fence"))  # FLUSHALL, eviction, or its TTL ran out
    with lock:
        assert lock.token is not None and first is not None and lock.token > first


@pytest.mark.topologies
def test_no_key_of_a_lock_lives_forever() -> None:
    client = get_client()
    holder = Lock("ttl", timeout=5)
    assert holder.acquire()
    waiter = Lock("ttl", timeout=5)
    thread = threading.Thread(target=waiter.acquire, kwargs={"blocking_timeout": 0.3})
    thread.start()
    deadline = time.monotonic() + 5
    while not client.exists(holder.keys.sub("queue")):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    for key in (holder.keys.base, holder.keys.sub("fence"), holder.keys.sub("queue"),
                holder.keys.sub("stale")):
        assert 0 < client.pttl(key) <= 5_000 + 600_000, key
    thread.join(5)
    holder.release()


# -- singleton --------------------------------------------------------------------------------

@pytest.mark.topologies
def test_singleton_reports_a_lease_lost_while_its_job_ran(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @singleton("nightly", timeout=5)
    def job() -> str:
        assert force_release("nightly")  # an operator, or the lease ran out...
        assert Lock("nightly", timeout=5).acquire(blocking=False)  # ...and another took it
        return "done"

    with caplog.at_level(logging.ERROR, "django_redislua.locks"), \
            pytest.raises(LeaseLost) as raised:
        job()
    assert raised.value.result == "done"
    assert isinstance(raised.value, LockNotOwned)
    assert "singleton 'nightly'" in caplog.text


@pytest.mark.topologies
async def test_async_singleton_reports_a_lease_lost() -> None:
    @singleton("anightly", timeout=5)
    async def job() -> int:
        force_release("anightly")
        return 7

    with pytest.raises(LeaseLost) as raised:
        await job()
    assert raised.value.result == 7


@pytest.mark.topologies
def test_singleton_renews_while_a_job_outlives_its_timeout() -> None:
    overlaps = []

    @singleton("long", timeout=0.5)
    def job() -> str:
        time.sleep(1.2)
        return "ok"

    thread = threading.Thread(target=lambda: overlaps.append(job()))
    thread.start()
    time.sleep(0.8)  # past the timeout: the lease has been renewed
    assert job() is None  # skipped, not run alongside
    thread.join(5)
    assert overlaps == ["ok"]


# -- run_once ---------------------------------------------------------------------------------

async def test_async_renewer_stops_even_if_a_renewal_loses_the_cancellation() -> None:
    """Before Python 3.12, asyncio.wait_for (redis-py wraps every socket write in it) returns
    instead of raising when the cancellation arrives just as the write finished. A renewer
    that lost stop()'s cancellation that way renewed for ever, and stop() never returned. Here
    the running loop's real transport loses the cancellation of every renewal the same way."""
    lease = Lease("rl:lock:{lost-cancel}", "owner", 0.3, time.monotonic())
    renewals = 0
    renewing = asyncio.Event()
    real = get_async_transport()

    async def renewal_losing_its_cancellation(op: Call) -> int:
        nonlocal renewals
        renewals += 1
        renewing.set()
        with contextlib.suppress(asyncio.CancelledError):  # as wait_for did: the write was done
            await asyncio.sleep(0.05)
        lease.deadline = time.monotonic() + 0.3
        return 300  # the lease's new TTL in ms, as lock_extend answers

    lossy = copy.copy(real)
    AsyncTransport.__init__(lossy)  # its operations bound to the copy: spawns run on it too
    lossy.operations[Call] = renewal_losing_its_cancellation
    lost: list[str] = []
    renewer = await adrive(start_renewing(lease, 0.3, lambda: lost.append("lost"), "lost"),
                           lossy)
    await asyncio.wait_for(renewing.wait(), 5)
    # the cancellation lands inside the renewal
    await asyncio.wait_for(adrive(stop_renewing(renewer), lossy), 5)
    stopped_after = renewals
    await asyncio.sleep(0.3)  # three renewal intervals: none may follow
    assert renewals == stopped_after == 1
    assert lost == []


@pytest.mark.topologies
def test_run_once_renews_while_a_slow_handler_runs() -> None:
    runs: list[int] = []

    @run_once(key=lambda n: f"pay:{n}", timeout=0.5, wait=False)
    def capture(n: int) -> int:
        runs.append(n)
        time.sleep(1.2)
        return n * 10

    first = threading.Thread(target=capture, args=(1,))
    first.start()
    time.sleep(0.8)  # past the running lease: a duplicate must still not run
    with pytest.raises(RunInProgress):
        capture(1)
    first.join(5)
    assert capture(1) == 10
    assert runs == [1]


@pytest.mark.topologies
def test_run_once_raises_when_another_run_took_its_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = keys_for("once", "order:9").base

    @run_once(key="order:9", timeout=5)
    def capture() -> str:
        client = get_client()
        client.delete(key)  # the lease is gone (paused past it, Redis lost it)...
        client.hset(key, mapping={"state": "running", "owner": "someone-else"})  # ...and retaken
        return "captured"

    with caplog.at_level(logging.ERROR, "django_redislua.locks"), \
            pytest.raises(LeaseLost) as raised:
        capture()
    assert raised.value.result == "captured"
    assert "may have run twice" in str(raised.value)
    assert get_client().hget(key, "owner") == b"someone-else"  # the other run's record kept


@pytest.mark.topologies
def test_run_once_records_a_late_result_when_nobody_else_started(
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = keys_for("once", "order:10").base
    calls = []

    @run_once(key="order:10", timeout=5)
    def capture() -> str:
        calls.append(1)
        get_client().delete(key)  # the lease ran out, but no duplicate arrived
        return "late"

    with caplog.at_level(logging.WARNING, "django_redislua.locks"):
        assert capture() == "late"
    assert "outlived its lease" in caplog.text
    assert capture() == "late" and calls == [1]


@pytest.mark.topologies
async def test_async_run_once_raises_when_another_run_took_its_key() -> None:
    key = keys_for("once", "aorder").base

    @run_once(key="aorder", timeout=5)
    async def capture() -> str:
        get_client().hset(key, "owner", "someone-else")
        return "captured"

    with pytest.raises(LeaseLost) as raised:
        await capture()
    assert raised.value.result == "captured"


@pytest.mark.topologies
async def test_async_run_once_renews_while_a_slow_handler_runs() -> None:
    runs: list[int] = []

    @run_once(key="aslow", timeout=0.5, wait=False)
    async def capture() -> int:
        runs.append(1)
        await asyncio.sleep(1.2)
        return 5

    first = asyncio.ensure_future(capture())
    await asyncio.sleep(0.8)
    with pytest.raises(RunInProgress):
        await capture()
    assert await first == 5
    assert runs == [1]


# -- single_flight ----------------------------------------------------------------------------

@pytest.mark.topologies
def test_a_builder_that_lost_its_lease_never_overwrites_a_newer_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    building = keys_for("flight", "report").sub("building")

    def old_build() -> str:
        get_client().delete(building)  # this builder's lease ran out...
        assert single_flight("report", lambda: "new", ttl=60) == "new"  # ...a newer build ran
        return "old"

    with caplog.at_level(logging.WARNING, "django_redislua.locks"):
        assert single_flight("report", old_build, ttl=60) == "old"  # its caller gets its value
    assert "was not stored" in caplog.text
    assert single_flight("report", lambda: "never", ttl=60) == "new"


@pytest.mark.topologies
async def test_async_a_builder_that_lost_its_lease_never_overwrites() -> None:
    building = keys_for("flight", "areport").sub("building")

    async def new_build() -> str:
        return "new"

    async def old_build() -> str:
        get_client().delete(building)
        assert await asingle_flight("areport", new_build, ttl=60) == "new"
        return "old"

    async def never() -> str:
        raise AssertionError("the cached value is fresh")

    assert await asingle_flight("areport", old_build, ttl=60) == "old"
    assert await asingle_flight("areport", never, ttl=60) == "new"


@pytest.mark.topologies
def test_single_flight_renews_while_a_slow_build_runs() -> None:
    builds: list[int] = []
    results: list[Any] = []

    def build() -> str:
        builds.append(1)
        time.sleep(1.0)
        return "value"

    first = threading.Thread(target=lambda: results.append(
        single_flight("slow", build, lock_timeout=0.4)))
    first.start()
    time.sleep(0.6)  # past the build lease: a second caller waits instead of building
    assert single_flight("slow", build, lock_timeout=0.4) == "value"
    first.join(5)
    assert builds == [1] and results == ["value"]


# -- waiting for replicas ----------------------------------------------------------------------

@pytest.fixture
def primary_with_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    primary = RedisServer(extra_args=("--repl-diskless-sync-delay", "0")).start()
    replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(primary.port))).start()
    try:
        deadline = time.monotonic() + 10
        while replica.client().info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never connected"
            time.sleep(0.05)
        # A deployment that waits for replicas gives WAIT room under the socket timeout.
        with override_settings(REDISLUA={**settings.REDISLUA, "CONNECTION": primary.url,
                                         "SOCKET_TIMEOUT": 5}):
            yield primary, replica
    finally:
        replica.stop()
        primary.stop()


def test_a_lock_waiting_for_a_replica_is_acquired_once_it_confirms(
    primary_with_replica: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = primary_with_replica
    lock = Lock("durable", timeout=30, replicas=1, replica_timeout=3)
    assert lock.acquire()
    # The replica has the acquisition already: a failover to it keeps the lock and its token.
    assert replica.client().hget(lock.keys.base, "token") == str(lock.token).encode()
    lock.release()
    replica.stop()
    with pytest.raises(LockUnavailable, match="replica"):
        Lock("durable", timeout=30, replicas=1, replica_timeout=0.2).acquire()
    assert not primary.client().exists(lock.keys.base)  # released again: nothing half-held


@pytest.mark.topologies
async def test_async_a_lock_waiting_for_replicas_refuses_without_them(topology: str) -> None:
    # The test server has no replica; every cluster primary has one: ask for one more.
    replicas = 2 if topology == "cluster" else 1
    lock = Lock("adurable", timeout=30, replicas=replicas, replica_timeout=0.05)
    with pytest.raises(LockUnavailable, match="replica"):
        await lock.aacquire()
    assert not await lock.alocked()
    assert await Lock("adurable", timeout=30).aacquire()  # not held by the refused one


def test_replicas_must_be_a_count() -> None:
    with pytest.raises(ValueError, match="replicas"):
        Lock("x", timeout=5, replicas=-1)


@pytest.mark.cluster
def test_waiting_for_a_replica_on_the_cluster(redis_cluster: Any) -> None:
    with override_settings(REDISLUA={"CONNECTION": redis_cluster.url, "SOCKET_TIMEOUT": 5}):
        lock = Lock("cluster-durable", timeout=30, replicas=1, replica_timeout=3)
        assert lock.acquire()  # WAIT went to the primary that owns the lock's slot
        assert lock.owned()
        lock.release()
        with pytest.raises(LockUnavailable, match="replica"):
            Lock("cluster-durable", timeout=30, replicas=2, replica_timeout=0.2).acquire()
        assert not lock.locked()


@pytest.fixture
def on_cluster(redis_cluster: Any) -> Iterator[None]:
    with override_settings(REDISLUA={"CONNECTION": redis_cluster.url}):
        yield


@pytest.mark.cluster
async def test_async_waiting_for_a_replica_on_the_cluster(on_cluster: None) -> None:
    """The asyncio twin of test_waiting_for_a_replica_on_the_cluster: the same protocol, so
    the same answers (the asyncio cluster client once refused to wait for replicas)."""
    with override_settings(REDISLUA={**settings.REDISLUA, "SOCKET_TIMEOUT": 5}):
        lock = Lock("acluster-durable", timeout=30, replicas=1, replica_timeout=3)
        assert await lock.aacquire()  # WAIT went to the primary that owns the lock's slot
        assert await lock.aowned()
        await lock.arelease()
        with pytest.raises(LockUnavailable, match="replica"):
            await Lock("acluster-durable", timeout=30, replicas=2, replica_timeout=0.2).aacquire()
        assert not await lock.alocked()
