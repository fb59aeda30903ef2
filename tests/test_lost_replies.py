"""Replies that never arrive, settings that change under a running process, callers cancelled at
any await: what each leaves behind in Redis and in the process.

- A script whose reply was lost (the server paused past the socket timeout) may have run; it is
  never sent again, so it is applied at most once: a hit, a capped counter's add, a lock
  re-entry.
- A lock re-entry whose reply was lost is given back (by its wait id), so one release still
  frees the lock, sync and asyncio alike.
- Changing settings a hundred times never exhausts a connection pool the app shares with the
  project's cache: every channel dropped returns its connections.
- ``aacquire`` and ``ahit`` cancelled at each of their await points leave nothing held: no lock,
  no queued wait, no concurrency slot (a checker reads Redis until it agrees, bounded).

Each runs on the single server and on the 6-node cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
from django.core.cache import caches
from django.test import override_settings
from redis.cluster import RedisCluster

from django_redislua import Policy, lean
from django_redislua.connection import CLIENT_ERRORS, get_client
from django_redislua.locks import Lock, LockUnavailable
from django_redislua.protocol import Send
from django_redislua.recipes import CappedCounter, RecipeUnavailable
from django_redislua.transport import ClusterTransport, get_transport
from tests.settings import REDIS_URL, REDISLUA
from tests.test_lean_path import pool_state

pytestmark = pytest.mark.topologies

SOCKET_TIMEOUT = 0.4
BUSY_MS = 1000  # past the socket timeout: the reply of a call sent meanwhile is lost


@pytest.fixture(autouse=True)
def _garbage_collected_after() -> Iterator[None]:
    """Collected after each test, not in the middle of a later one: the asyncio settings-churn
    test leaves about 400,000 objects in cycles (a hundred cluster clients), and a full pass
    over them paused the process 0.7-0.8 s during a cancelled-call test's asyncio waits
    (measured with a ``gc.callbacks`` timer over the suite)."""
    yield
    gc.collect()


@pytest.fixture
def short_timeouts() -> Iterator[None]:
    """The test's topology with a socket timeout the pause outlasts."""
    from tests.settings import REDISLUA as current  # the topology fixture may have changed it

    with override_settings(REDISLUA={**current, "SOCKET_TIMEOUT": SOCKET_TIMEOUT,
                                     "SOCKET_CONNECT_TIMEOUT": SOCKET_TIMEOUT}):
        yield


def owner_of(key: str) -> redis.Redis:
    """The server holding ``key``: the test server, or the cluster primary that owns it."""
    client = get_client()
    if isinstance(client, RedisCluster):
        return client.get_redis_connection(client.get_node_from_key(key))
    return client


def until(condition: Callable[[], bool], seconds: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# Keeps the server busy for ARGV[1] microseconds: every command sent meanwhile waits, and runs
# once the script ends, after its caller's socket timeout gave up on the reply. (A busy script is
# not enough: a paused client that disconnects has its command dropped.) On the server's CPU
# clock where Lua has one (os.clock: Redis 7.2+, Valkey), else on TIME, which Valkey freezes for
# a script's whole run (its loop would spin until the 5 s busy limit).
BUSY_ON_CLOCK = """
local stop = os.clock() + tonumber(ARGV[1]) / 1000000
repeat until os.clock() >= stop
return 1
"""
BUSY_ON_TIME = """
local t = redis.call('TIME')
local stop = t[1] * 1000000 + t[2] + tonumber(ARGV[1])
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop
return 1
"""


def busy_script(client: redis.Redis) -> str:
    try:
        client.eval("return os.clock() >= 0", 0)
    except redis.ResponseError:  # Lua without os: Redis before 7.2
        return BUSY_ON_TIME
    return BUSY_ON_CLOCK


def busy(key: str, busy_ms: int = BUSY_MS) -> threading.Thread:
    """Keep ``key``'s server busy for ``busy_ms`` from another connection, starting now; returns
    once the server is running the script (a probe's PING goes unanswered), with the thread
    that ends when the server is free again."""
    node = owner_of(key)
    given = node.connection_pool.connection_kwargs
    script = busy_script(node)

    def run() -> None:
        pool = redis.ConnectionPool(**{**given, "socket_timeout": busy_ms / 1000 + 5})
        connection = pool.make_connection()
        try:
            connection.send_command("EVAL", script, 0, busy_ms * 1000)
            sent.set()
            connection.read_response()
        finally:
            connection.disconnect()

    sent = threading.Event()
    thread = threading.Thread(target=run)
    thread.start()
    # Sent first, then probed: an unanswered probe alone can be a loaded machine's slow reply,
    # and the call under test could then run before the script (its reply not lost). Once the
    # script is in the server's socket buffer, a command sent after it waits for it.
    assert sent.wait(5)
    kwargs = {**given, "socket_timeout": 0.05, "socket_connect_timeout": 0.05}
    deadline = time.monotonic() + 5
    while True:  # a checker, not a sleep: answered means the script has not started yet
        probe = redis.Redis(connection_pool=redis.ConnectionPool(**kwargs))
        try:
            probe.ping()
        except redis.TimeoutError:
            break
        finally:
            probe.close()
        assert time.monotonic() < deadline, "the busy script never started"
        time.sleep(0.005)
    return thread


def stopped(key: str, stop_ms: int) -> threading.Thread:
    """Stop ``key``'s server process (SIGSTOP) for ``stop_ms`` of wall time, starting now, with
    the thread that resumes it. Unlike a busy script it takes no CPU: two busy scripts and the
    test share two cores, so a script's end on the server's CPU clock drifts late on a loaded
    machine (Valkey's, 0.9 s of CPU ended past 1.2 s), and a stop's end does not."""
    pid = int(owner_of(key).info("server")["process_id"])
    os.kill(pid, signal.SIGSTOP)
    thread = threading.Thread(target=lambda: (time.sleep(stop_ms / 1000),
                                              os.kill(pid, signal.SIGCONT)))
    thread.start()
    return thread


# -- a lost reply is never sent again --------------------------------------------------------

def test_a_hit_whose_reply_was_lost_counts_at_most_once(short_timeouts: None) -> None:
    policy = Policy("lost-hit", rate="100/h", algorithm="fixed_window")
    assert policy.hit("k").remaining == 99
    pause = busy(policy.redis_key("k"))
    with pytest.raises(CLIENT_ERRORS):
        policy.hit("k")
    pause.join()
    assert policy.peek("k").remaining >= 98  # at most one more hit counted


@pytest.mark.parametrize("lean_calls", [True, False], ids=["lean", "reference"])
def test_connections_closed_under_calls_by_another_thread_are_lost_connections(
    lean_calls: bool,
) -> None:
    """Another thread keeps disconnecting the pool, connections in use included (redis-py
    6.x's cluster table refresh does that to every thread at once), while hits run: each hit
    is decided or fails as a lost connection, a client error FAIL_OPEN handles; never an
    AttributeError or TypeError from inside redis-py (its reader or socket gone mid-call). And
    no connection is lost: afterwards the pool lends out only what the lean transport keeps."""
    from tests.settings import REDISLUA as current  # the topology fixture may have changed it

    with override_settings(REDISLUA={**current, "LEAN_CALLS": lean_calls}):
        policy = Policy("torn-hit", rate="100000/h", algorithm="fixed_window")
        assert policy.hit("k").allowed
        pool = owner_of(policy.redis_key("k")).connection_pool
        stop = threading.Event()

        def tear_down() -> None:
            # Every 0.5 ms, with a 10 ms lull every 20th time: on a slow machine a hit on the
            # reference path (a reconnect's handshake, then the call) can take longer than
            # 0.5 ms, and without the lulls none would be decided (the race not run).
            rounds = 0
            while not stop.is_set():
                pool.disconnect()
                rounds += 1
                time.sleep(0.01 if rounds % 20 == 0 else 0.0005)

        tearing = threading.Thread(target=tear_down)
        tearing.start()
        decided, lost, other = 0, 0, []
        deadline = time.monotonic() + 3
        try:
            for _ in range(3000):
                if time.monotonic() > deadline:
                    break
                try:
                    policy.hit("k")
                    decided += 1
                except CLIENT_ERRORS:
                    lost += 1
                except Exception as exc:  # what this test is about: anything else escaping
                    other.append(exc)
        finally:
            stop.set()
            tearing.join()
        assert not other, other[:3]
        assert decided and lost, (decided, lost)  # both happened: the race was run
        assert policy.peek("k").remaining >= 100000 - 1 - decided - lost  # none counted twice
        for _ in range(5):  # calls after the storm take what they need again, and give it back
            assert policy.hit("k").allowed
        node = get_transport()
        node = node.node(policy.redis_key("k")) if isinstance(node, ClusterTransport) else node
        kept = node.source if isinstance(node.source, lean.KeptConnections) else None
        assert (kept is not None) == (lean_calls and lean.SUPPORTED)
        pool_state(pool, kept)


def test_a_failed_call_to_several_nodes_leaves_no_reply_for_the_next_call(topology: str) -> None:
    """A send to two cluster nodes (one write per node, every write before any read): node A's
    reply is lost (busy past the socket timeout), node B's is still on its way (stopped a
    little longer). The send fails; B's connection must not go back to the pool with B's reply
    pending, or the next call on it (here a hit) reads that reply as its own.

    The send is the transport's own: through the protocol, a failed call reads the cluster's
    slot table again first, from a node redis-py picks at random (8.x), and when that is A or
    B the next call comes after B's reply (the pool's check then sees it), so the race would
    be run only some of the time."""
    if topology != "cluster":
        pytest.skip("a single server is one node: one connection per call")
    from tests.settings import REDISLUA as current  # the topology fixture changed it

    cluster = get_client()
    policy = Policy("split-c", rate="1000/h")
    a_key = "split:a"
    node_a = cluster.get_node_from_key(a_key).name
    b = next(f"b{i}" for i in range(1000)
             if cluster.get_node_from_key(policy.redis_key(f"b{i}")).name != node_a)
    node_b = cluster.get_node_from_key(policy.redis_key(b)).name
    b_key = next(f"split:b{i}" for i in range(1000)
                 if cluster.get_node_from_key(f"split:b{i}").name == node_b)
    send = Send(((a_key, (("INCR", a_key),)), (b_key, (("INCR", b_key),))))
    with override_settings(REDISLUA={**current, "SOCKET_TIMEOUT": 0.6}):
        transport = get_transport()
        assert isinstance(transport, ClusterTransport)
        assert transport.send(send) == [[1], [1]]  # connected: the send below writes at once
        # A is read first and fails at 0.6 s (busy until 1.5 s); B answers at 0.85 s, while
        # the hit (sent from 0.6 s on) waits: on a new connection, whose handshake B answers
        # once it resumes, well within 0.6 s.
        pause_a = busy(a_key, 1500)
        pause_b = stopped(b_key, 850)
        try:
            with pytest.raises(CLIENT_ERRORS):
                transport.send(send)
            third = policy.hit(b)  # the next call on node B
        finally:
            pause_a.join()
            pause_b.join()
    assert (third.limit, third.remaining) == (1000, 999), third
    assert int(cluster.get(b_key)) == 2  # the lost INCR was applied once, and never again


async def test_an_async_hit_whose_reply_was_lost_counts_at_most_once(
        short_timeouts: None) -> None:
    policy = Policy("lost-ahit", rate="100/h", algorithm="fixed_window")
    assert (await policy.ahit("k")).remaining == 99
    pause = busy(policy.redis_key("k"))
    with pytest.raises(CLIENT_ERRORS):
        await policy.ahit("k")
    await asyncio.to_thread(pause.join)
    assert (await policy.apeek("k")).remaining >= 98


def test_a_capped_add_whose_reply_was_lost_adds_at_most_once(short_timeouts: None) -> None:
    counter = CappedCounter("lost-add", cap=100, ttl="1h")
    assert counter.value("k") == 0  # connected (a cluster's table read) before the pause
    pause = busy(counter.key("k"))
    with pytest.raises(RecipeUnavailable):
        counter.add("k", amount=1)
    pause.join()
    assert counter.value("k") <= 1


async def test_an_async_capped_add_whose_reply_was_lost_adds_at_most_once(
        short_timeouts: None) -> None:
    counter = CappedCounter("lost-aadd", cap=100, ttl="1h")
    # Connected first: a new asyncio cluster client reads the slot table on its first call, and
    # on a loaded machine that read, timing out on the busy node, then asking another, took
    # the add past the pause (a clean-clone CI run: DID NOT RAISE).
    assert await counter.avalue("k") == 0
    pause = busy(counter.key("k"))
    with pytest.raises(RecipeUnavailable):
        await counter.aadd("k", amount=1)
    await asyncio.to_thread(pause.join)
    assert await counter.avalue("k") <= 1


# -- a lost re-entry is given back --------------------------------------------------------------

def count(lock: Lock) -> int:
    value = owner_of(lock.keys.base).hget(lock.keys.base, "count")
    return 0 if value is None else int(value)


def test_a_reentry_whose_reply_was_lost_is_given_back(short_timeouts: None) -> None:
    lock = Lock("re", timeout=30, reentrant=True)
    assert lock.acquire()
    pause = busy(lock.keys.base)
    with pytest.raises(LockUnavailable):
        lock.acquire()  # the re-entry runs on the server after its caller gave up
    pause.join()
    until(lambda: count(lock) == 1, what="the lost re-entry given back")
    lock.release()
    assert Lock("re", timeout=30).acquire(blocking=False)


async def test_an_async_reentry_whose_reply_was_lost_is_given_back(short_timeouts: None) -> None:
    lock = Lock("are", timeout=30, reentrant=True)
    assert await lock.aacquire()
    pause = busy(lock.keys.base)
    with pytest.raises(LockUnavailable):
        await lock.aacquire()
    await asyncio.to_thread(pause.join)
    await asyncio.to_thread(until, lambda: count(lock) == 1, 5.0, "the re-entry given back")
    await lock.arelease()
    assert await Lock("are", timeout=30).aacquire(blocking=False)


# -- settings changes return their connections ----------------------------------------------------

ROUNDS = 120
POOL = 40
# What these tests count is connections, not time: timeouts a loaded machine cannot reach. At the
# default 0.5 s a clean-clone CI run failed one round's connect (its event loop starved past it).
PATIENT = {"SOCKET_TIMEOUT": 5.0, "SOCKET_CONNECT_TIMEOUT": 5.0}


def test_settings_changes_never_exhaust_a_shared_cache_pool(topology: str) -> None:
    """The README's deployment: the app reuses the project's cache pool. A test suite that
    overrides REDISLUA per test must not leak that pool's connections until the cache fails."""
    if topology == "cluster":
        pytest.skip("Django's RedisCache does not run on a cluster; see the next test")
    caches_setting = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                    "LOCATION": REDIS_URL,
                    "OPTIONS": {"socket_timeout": 0.5, "max_connections": POOL}},
    }
    with override_settings(CACHES=caches_setting):
        cache = caches["default"]
        cache.set("warm", 1)
        pool = cache._cache.get_client(write=True).connection_pool  # type: ignore[attr-defined]
        in_use = len(pool._in_use_connections)
        for round_ in range(ROUNDS):
            with override_settings(REDISLUA={**REDISLUA, "CONNECTION": "default",
                                             "KEY_PREFIX": f"round{round_}"}):
                assert Policy("leak", rate="5/m", algorithm="gcra").hit("k").allowed
                cache.set("k", round_)
        assert cache.get("k") == ROUNDS - 1
        assert len(pool._in_use_connections) == in_use


def connected_clients(client: Any) -> int:
    nodes = [n for _name, n in __import__(
        "django_redislua.connection", fromlist=["primary_nodes"]).primary_nodes(client)]
    return sum(int(node.info("clients")["connected_clients"]) for node in nodes)


def test_settings_changes_close_the_connections_they_drop() -> None:
    """Every topology: the clients and channels a settings change drops close their
    connections; the servers' connection count stays bounded over many changes."""
    policy = Policy("churn", rate="5/m", algorithm="gcra")
    before = None
    for round_ in range(ROUNDS):
        with override_settings(REDISLUA={**REDISLUA, "KEY_PREFIX": f"churn{round_}", **PATIENT}):
            assert policy.hit("k").allowed
            if round_ == 5:
                before = connected_clients(get_client())
    assert before is not None
    assert connected_clients(get_client()) <= before + 2


async def test_async_settings_changes_close_the_connections_they_drop() -> None:
    policy = Policy("achurn", rate="5/m", algorithm="gcra")
    before = None
    for round_ in range(ROUNDS):
        with override_settings(REDISLUA={**REDISLUA, "KEY_PREFIX": f"achurn{round_}", **PATIENT}):
            assert (await policy.ahit("k")).allowed
            if round_ == 5:
                before = await asyncio.to_thread(connected_clients, get_client())
        await asyncio.sleep(0)  # a dropped client closes on this loop
    assert before is not None
    await asyncio.sleep(0.05)
    assert await asyncio.to_thread(connected_clients, get_client()) <= before + 2


# -- cancelled at every await point -------------------------------------------------------------

async def cancelled_at_each_await(operation: Callable[[], Awaitable[Any]],
                                  clean: Callable[[], bool], most: int = 400,
                                  step: float = 0.0) -> int:
    """Start ``operation`` and cancel it after 0, 1, 2... turns of the event loop (each turn
    ``step`` seconds, for an operation that waits), until it finishes first; after each
    cancellation ``clean()`` must hold within a second (the clean-up may finish in the
    background). Returns how many points were cancelled."""
    for turns in range(most):
        task = asyncio.ensure_future(operation())
        for _ in range(turns):
            await asyncio.sleep(step)
        if task.done():
            await task
            return turns
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 1.0
        while not clean():
            assert time.monotonic() < deadline, f"state left after a cancel at turn {turns}"
            await asyncio.sleep(0.005)
    raise AssertionError(f"the operation never finished within {most} turns")


async def test_a_cancelled_aacquire_leaves_nothing_held() -> None:
    holder = Lock("cancel", timeout=30)
    base = holder.keys.base

    def clean() -> bool:
        node = owner_of(base)
        return not node.exists(base) and node.zcard(holder.keys.sub("queue")) == 0

    async def acquire_and_release() -> None:
        lock = Lock("cancel", timeout=30)
        assert await lock.aacquire()
        await lock.arelease()

    points = await cancelled_at_each_await(acquire_and_release, clean)
    assert points > 0
    # and with the lock held: a queued wait, withdrawn on every way out
    assert await holder.aacquire()

    def withdrawn() -> bool:
        node = owner_of(base)
        return node.zcard(holder.keys.sub("queue")) == 0 and node.hget(base, "owner") == \
            holder.owner.encode()

    await cancelled_at_each_await(
        lambda: Lock("cancel", timeout=30).aacquire(blocking_timeout=0.05), withdrawn,
        step=0.002)
    await holder.arelease()


async def test_a_cancelled_reentry_leaves_the_count_as_it_was() -> None:
    lock = Lock("cancel-re", timeout=30, reentrant=True)
    assert await lock.aacquire()

    async def reenter_and_release() -> None:
        await lock.aacquire()
        await lock.arelease()

    await cancelled_at_each_await(reenter_and_release, lambda: count(lock) == 1)
    await lock.arelease()
    assert not await lock.alocked()


async def test_a_cancelled_ahit_leaves_no_concurrency_slot() -> None:
    policy = Policy("cancel-slot", algorithm="concurrency", limit=5, timeout="10m")
    key = policy.redis_key("k")
    await cancelled_at_each_await(lambda: policy.ahit("k"),
                                  lambda: owner_of(key).zcard(key) == 0)
