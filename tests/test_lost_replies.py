"""Replies that never arrive, settings that change under a running process, callers cancelled at
any await: what each leaves behind in Redis and in the process.

- A script whose reply was lost (the server paused past the socket timeout) runs when the
  server resumes, and it is never sent again: applied exactly once (the tests wait until it has
  run, then read once): a hit, a capped counter's add, a lock re-entry.
- A lock re-entry whose reply was lost is given back (by its wait id), so one release still
  frees the lock, sync and asyncio alike; and when that give-back never arrives (Redis refused
  its connection), the release settles it: deterministic, through a relay (``Relay``) that
  drops the re-entry's reply and refuses the give-back. A release that reaches Redis late
  gives back its own hold only, never one made since.
- Changing settings a hundred times never exhausts a connection pool the app shares with the
  project's cache: every channel dropped returns its connections.
- ``aacquire`` and ``ahit`` cancelled at each of their await points leave nothing held: no lock,
  no queued wait, no concurrency slot (a checker reads Redis until it agrees, bounded).

Each runs on the single server and on the 6-node cluster (the relay's tests on the single
server: a cluster's clients follow its nodes' own addresses, past any relay).

``python3 dev.py test`` runs this module with every core kept busy (``REDISLUA_TEST_CPU_LOAD``,
see ``cpu_load``): load is when replies are lost in production, and what these tests promise
must hold then too.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from django.core.cache import caches
from django.test import override_settings
from redis.cluster import RedisCluster

from django_redislua import Policy, lean
from django_redislua.connection import CLIENT_ERRORS, get_client
from django_redislua.locks import Lock, LockUnavailable
from django_redislua.locks.lock import _Wait
from django_redislua.protocol import Send
from django_redislua.recipes import CappedCounter, RecipeUnavailable
from django_redislua.transport import ClusterTransport, get_transport, run
from tests.patience import PATIENT
from tests.settings import REDIS_URL, REDISLUA
from tests.test_lean_path import pool_state

pytestmark = pytest.mark.topologies

SOCKET_TIMEOUT = 0.4
STOP_MS = 1000  # past the socket timeout: the reply of a call sent meanwhile is lost


@pytest.fixture(autouse=True)
def _garbage_collected_after() -> Iterator[None]:
    """Collected after each test, not in the middle of a later one: the asyncio settings-churn
    test leaves about 400,000 objects in cycles (a hundred cluster clients), and a full pass
    over them paused the process 0.7-0.8 s during a cancelled-call test's asyncio waits
    (measured with a ``gc.callbacks`` timer over the suite)."""
    yield
    gc.collect()


# How long the busy processes of cpu_load may live at most, should the fixture's teardown never
# run (pytest killed): longer than this module takes under load.
CPU_LOAD_MOST_SECONDS = 600
BUSY_LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"


def load_share(cores: int, workers: int) -> int:
    """This worker's busy processes: ``cores`` shared by ``workers``, rounded up (one core
    and two workers still loads one)."""
    return -(-cores // max(workers, 1))


@pytest.fixture(scope="module", autouse=True)
def cpu_load() -> Iterator[list[subprocess.Popen[bytes]]]:
    """With ``REDISLUA_TEST_CPU_LOAD=<n>`` (``dev.py test`` sets it to the number of cores),
    processes spin for the whole module: the tests run with every core busy, as CI checks
    them. Under pytest-xdist this worker spins its share of the ``n`` cores only, as the other
    workers keep the rest busy: spinning all ``n`` here loaded every other worker's modules as
    well, beyond the load their timing promises are sized for (a loaded run's lock wait
    overran check 4 of tests/test_locks_chaos.py that way). Yields the processes (none: no
    load). Each is ended by its id afterwards."""
    count = load_share(int(os.environ.get("REDISLUA_TEST_CPU_LOAD") or 0),
                       int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    loops = [subprocess.Popen([sys.executable, "-c",
                               BUSY_LOOP.format(seconds=CPU_LOAD_MOST_SECONDS)])
             for _ in range(count)]
    try:
        yield loops
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


@pytest.fixture
def quiet_machine(cpu_load: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    """The module's load paused (SIGSTOP) for one test whose staging is timed, not what it
    checks; resumed after it."""
    for loop in cpu_load:
        loop.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for loop in cpu_load:
            loop.send_signal(signal.SIGCONT)


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


def stopped(key: str, stop_ms: int = STOP_MS) -> threading.Thread:
    """Stop ``key``'s server process (SIGSTOP) for ``stop_ms`` of wall time, starting now, with
    the thread that resumes it: every command sent meanwhile waits in its socket and runs once
    the server resumes, after its caller's socket timeout gave up on the reply.

    On wall time, not a busy script's: a script can only end on the server's CPU clock (Lua's
    os.clock; Valkey freezes TIME for a script's whole run), which a loaded machine stretches.
    Two busy scripts and the test sharing two cores, 0.9 s of Valkey's CPU ended past 1.2 s;
    and a cluster primary busy for 1 s of CPU with the machine loaded was silent past the
    cluster's 2 s node timeout, so its replica took its slots over in the middle of a test
    (CI46: MOVED where the test read the key's node; redis-py 5.0.1, Valkey's server)."""
    pid = int(owner_of(key).info("server")["process_id"])
    os.kill(pid, signal.SIGSTOP)
    thread = threading.Thread(target=lambda: (time.sleep(stop_ms / 1000),
                                              os.kill(pid, signal.SIGCONT)))
    thread.start()
    return thread


# -- a lost reply is never sent again --------------------------------------------------------

def test_a_hit_whose_reply_was_lost_counts_once(short_timeouts: None) -> None:
    policy = Policy("lost-hit", rate="100/h", algorithm="fixed_window")
    assert policy.hit("k").remaining == 99
    pause = stopped(policy.redis_key("k"))
    with pytest.raises(CLIENT_ERRORS):
        policy.hit("k")
    pause.join()
    # The lost hit waits in its socket and runs once the server resumes: counted once, never
    # sent again (the count reaches 98 and stays there).
    until(lambda: policy.peek("k").remaining <= 98, what="the lost hit to run")
    assert policy.peek("k").remaining == 98


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
        # The storm comes in bursts, each followed by a calm that lasts until a hit begun in it
        # has ended: a hit that needs longer than the gaps between disconnects (redis-py 5.0's
        # cluster client reads the slot table again after each lost connection, ~60 ms) is still
        # decided, however slow the machine; a fixed lull was not always long enough.
        calm_hit_ended = threading.Event()
        phase_lock = threading.Lock()
        phase = {"tearing": True, "calm": 0}  # "calm" counts the calms begun

        def tear_down() -> None:
            while not stop.is_set():
                with phase_lock:
                    phase["tearing"] = True
                for _ in range(20):  # every 0.5 ms: connections in use are torn too
                    pool.disconnect()
                    time.sleep(0.0005)
                with phase_lock:
                    phase["tearing"] = False
                    phase["calm"] += 1
                    calm_hit_ended.clear()
                while not calm_hit_ended.wait(0.01):
                    if stop.is_set():
                        return

        tearing = threading.Thread(target=tear_down)
        tearing.start()
        decided, lost, other = 0, 0, []
        deadline = time.monotonic() + 3
        try:
            for _ in range(3000):
                if time.monotonic() > deadline:
                    break
                with phase_lock:
                    begun_in_calm = None if phase["tearing"] else phase["calm"]
                try:
                    policy.hit("k")
                    decided += 1
                except CLIENT_ERRORS:
                    lost += 1
                except Exception as exc:  # what this test is about: anything else escaping
                    other.append(exc)
                finally:
                    with phase_lock:
                        if begun_in_calm is not None and begun_in_calm == phase["calm"]:
                            calm_hit_ended.set()
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


def test_a_failed_call_to_several_nodes_leaves_no_reply_for_the_next_call(
        topology: str, quiet_machine: None) -> None:
    """A send to two cluster nodes (one write per node, every write before any read): node A's
    reply is lost (stopped past the socket timeout), node B's is still on its way (stopped
    less long). The send fails; B's connection must not go back to the pool with B's reply
    pending, or the next call on it (here a hit) reads that reply as its own.

    The send is the transport's own: through the protocol, a failed call reads the cluster's
    slot table again first, from a node redis-py picks at random (8.x), and when that is A or
    B the next call comes after B's reply (the pool's check then sees it), so the race would
    be run only some of the time.

    What it checks is the pool, not a timeout; the hit must need nothing from A (its script
    is loaded before), and its staging is timed to a tenth of a second
    (the reply of B must be pending when the send fails, and the hit's handshake answered
    soon after), which busy cores push out of order (one loaded module run in twelve
    failed): it runs with the load paused (``quiet_machine``)."""
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
        # The hit's script loaded on every primary now: loaded by the hit below (NOSCRIPT, as
        # after a server's restart), it would be loaded on A too, stopped, and time out there.
        assert policy.hit("warm").remaining == 999
        # A is read first and fails at 0.6 s (stopped until 1.5 s); B answers at 0.85 s, while
        # the hit (sent from 0.6 s on) waits: on a new connection, whose handshake B answers
        # once it resumes, well within 0.6 s.
        pause_a = stopped(a_key, 1500)
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


async def test_an_async_hit_whose_reply_was_lost_counts_once(short_timeouts: None) -> None:
    policy = Policy("lost-ahit", rate="100/h", algorithm="fixed_window")
    assert (await policy.ahit("k")).remaining == 99
    pause = stopped(policy.redis_key("k"))
    with pytest.raises(CLIENT_ERRORS):
        await policy.ahit("k")
    await asyncio.to_thread(pause.join)
    await asyncio.to_thread(until, lambda: policy.peek("k").remaining <= 98, 5.0,
                            "the lost hit to run")
    assert (await policy.apeek("k")).remaining == 98


def test_a_capped_add_whose_reply_was_lost_adds_once(short_timeouts: None) -> None:
    counter = CappedCounter("lost-add", cap=100, ttl="1h")
    # The add's script loaded (a lost EVALSHA of an unknown script would run as NOSCRIPT and
    # add nothing), and connected (a cluster's table read) before the pause.
    assert counter.add("warm").accepted and counter.value("k") == 0
    pause = stopped(counter.key("k"))
    with pytest.raises(RecipeUnavailable):
        counter.add("k", amount=1)
    pause.join()
    until(lambda: counter.value("k") >= 1, what="the lost add to run")
    assert counter.value("k") == 1


async def test_an_async_capped_add_whose_reply_was_lost_adds_once(
        short_timeouts: None) -> None:
    counter = CappedCounter("lost-aadd", cap=100, ttl="1h")
    # Its add script loaded and connected first: a new asyncio cluster client reads the slot
    # table on its first call, and on a loaded machine that read, timing out on the stopped
    # node, then asking another, took the add past the pause (a clean-clone CI run: DID NOT
    # RAISE).
    assert (await counter.aadd("warm")).accepted and await counter.avalue("k") == 0
    pause = stopped(counter.key("k"))
    with pytest.raises(RecipeUnavailable):
        await counter.aadd("k", amount=1)
    await asyncio.to_thread(pause.join)
    await asyncio.to_thread(until, lambda: counter.value("k") >= 1, 5.0, "the lost add to run")
    assert await counter.avalue("k") == 1


# -- a lost re-entry is given back --------------------------------------------------------------

def count(lock: Lock) -> int:
    value = owner_of(lock.keys.base).hget(lock.keys.base, "count")
    return 0 if value is None else int(value)


def test_a_reentry_whose_reply_was_lost_is_given_back(short_timeouts: None) -> None:
    lock = Lock("re", timeout=30, reentrant=True)
    assert lock.acquire()
    pause = stopped(lock.keys.base)
    with pytest.raises(LockUnavailable):
        lock.acquire()  # the re-entry runs on the server after its caller gave up
    pause.join()
    until(lambda: count(lock) == 1, what="the lost re-entry given back")
    lock.release()
    assert Lock("re", timeout=30).acquire(blocking=False)


async def test_an_async_reentry_whose_reply_was_lost_is_given_back(short_timeouts: None) -> None:
    lock = Lock("are", timeout=30, reentrant=True)
    assert await lock.aacquire()
    pause = stopped(lock.keys.base)
    with pytest.raises(LockUnavailable):
        await lock.aacquire()
    await asyncio.to_thread(pause.join)
    await asyncio.to_thread(until, lambda: count(lock) == 1, 5.0, "the re-entry given back")
    await lock.arelease()
    assert await Lock("are", timeout=30).aacquire(blocking=False)


# -- a lost re-entry whose give-back never arrives: settled by the release -------------------------

class _Link:
    """One connection through the relay: the process's socket and the relay's to Redis."""

    def __init__(self, near: socket.socket, far: socket.socket) -> None:
        self.near, self.far = near, far
        self.lose_replies = False
        self.kept: list[bytes] | None = None  # requests kept, not sent (None: sent at once)
        self.near_closed = False
        self.lock = threading.Lock()


class Relay:
    """A loopback TCP relay in front of the test's Redis server: what a lost reply or an
    unreachable server does to the process, at the moments a test chooses, with no timing.

    - :meth:`lose_replies`: the connections open now still carry their requests to Redis, which
      runs them, but the replies are dropped; and nothing listens (a new connection is refused).
    - :meth:`keep_requests`: the requests of the connections open now are kept here, not sent,
      until :meth:`deliver` (a request reaching Redis after its caller gave up on it); new
      connections work.
    - :meth:`restore`: listening again on the same port; new connections work."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.links: list[_Link] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = urlunsplit(parts._replace(netloc=f"127.0.0.1:{self.port}"))
        self._accepting()

    def _accepting(self) -> None:
        listener = self.listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                near, _ = listener.accept()
            except OSError:
                return  # closed: lose_replies
            far = socket.create_connection(self.target)
            link = _Link(near, far)
            self.links.append(link)
            threading.Thread(target=self._requests, args=(link,), daemon=True).start()
            threading.Thread(target=self._replies, args=(link,), daemon=True).start()

    @staticmethod
    def _requests(link: _Link) -> None:
        while True:
            try:
                data = link.near.recv(65536)
            except OSError:
                data = b""
            with link.lock:
                if not data:
                    link.near_closed = True
                    if link.kept is None:
                        with contextlib.suppress(OSError):
                            link.far.shutdown(socket.SHUT_WR)
                    return
                if link.kept is not None:
                    link.kept.append(data)
                    continue
                with contextlib.suppress(OSError):
                    link.far.sendall(data)

    @staticmethod
    def _replies(link: _Link) -> None:
        while True:
            try:
                data = link.far.recv(65536)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    link.near.close()
                return
            if not link.lose_replies:
                with contextlib.suppress(OSError):
                    link.near.sendall(data)

    def _stop_listening(self) -> None:
        # shutdown first: close alone leaves a thread blocked in accept() accepting (Linux)
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def lose_replies(self) -> None:
        self._stop_listening()
        for link in self.links:
            link.lose_replies = True

    def keep_requests(self) -> None:
        for link in self.links:
            with link.lock:
                link.kept = []

    def deliver(self) -> None:
        for link in self.links:
            with link.lock:
                kept, link.kept = link.kept, None
                if kept is None:
                    continue
                with contextlib.suppress(OSError):
                    link.far.sendall(b"".join(kept))
                    if link.near_closed:
                        link.far.shutdown(socket.SHUT_WR)

    def restore(self) -> None:
        if self.listener.fileno() == -1:
            self.listener = socket.create_server(("127.0.0.1", self.port))
            self._accepting()

    def close(self) -> None:
        self._stop_listening()
        for link in self.links:
            for sock in (link.near, link.far):
                with contextlib.suppress(OSError):
                    sock.close()


RELAYED_TIMEOUT = 1.0  # a reply the relay drops never comes: any timeout loses it


@pytest.fixture
def relay(topology: str) -> Iterator[Relay]:
    """The single server behind a :class:`Relay`, the app's connection going through it; the
    lock scripts loaded and a connection open, as in a process that has locked before (a
    request kept or sent on a connection open now is then the script call itself)."""
    if topology == "cluster":
        pytest.skip("a cluster's clients reach its nodes at their own addresses, not a relay's")
    through = Relay(REDIS_URL)
    try:
        with override_settings(REDISLUA={**REDISLUA, "CONNECTION": through.url,
                                         "SOCKET_TIMEOUT": RELAYED_TIMEOUT,
                                         "SOCKET_CONNECT_TIMEOUT": RELAYED_TIMEOUT}):
            earlier = Lock("relayed-earlier", timeout=30)
            assert earlier.acquire()
            earlier.release()
            yield through
    finally:
        through.close()


def direct() -> redis.Redis:
    """A client of the test's server itself, past the relay."""
    return redis.Redis.from_url(REDIS_URL)


def holds(lock: Lock) -> int:
    """The holds Redis counts on ``lock`` (read past the relay)."""
    client = direct()
    try:
        value = client.hget(lock.keys.base, "count")
    finally:
        client.close()
    return 0 if value is None else int(value)


def given_back_thread(lock: Lock) -> None:
    """Wait (bounded) for the background give-back of ``lock``'s failed acquire to end."""
    for thread in threading.enumerate():
        if thread.name == f"redislua-withdraw:{lock.name}":
            thread.join(10)
            assert not thread.is_alive(), "the give-back never ended"


@pytest.mark.parametrize("auto_renew", [False, True], ids=["plain", "renewed"])
def test_a_lost_reentry_whose_give_back_never_arrives_is_settled_by_the_release(
        relay: Relay, auto_renew: bool) -> None:
    """Issue 35's scenario made certain: the re-entry runs on Redis and its reply is lost; its
    give-back is refused (Redis unreachable) and abandoned; the one release frees the lock, and
    stops the renewer. Before, the lock stayed held (renewed, for as long as the process)."""
    lock = Lock("lost-re", timeout=30, reentrant=True, auto_renew=auto_renew)
    assert lock.acquire()
    relay.lose_replies()
    with pytest.raises(LockUnavailable):
        lock.acquire()
    given_back_thread(lock)
    assert holds(lock) == 2  # the re-entry ran; nothing gave it back
    relay.restore()
    lock.release()
    assert holds(lock) == 0
    assert Lock("lost-re", timeout=30).acquire(blocking=False)
    assert lock._renewer is None


async def background_tasks_ended(lock: Lock) -> None:
    """Wait (bounded) for this loop's other tasks but ``lock``'s renewer (a spawned give-back)
    to end."""
    renewer = getattr(lock._renewer, "runner", None)
    others = asyncio.all_tasks() - {asyncio.current_task(), renewer}
    if others:
        _, pending = await asyncio.wait(others, timeout=10)
        assert not pending, "the give-back never ended"


@pytest.mark.parametrize("auto_renew", [False, True], ids=["plain", "renewed"])
async def test_an_async_lost_reentry_whose_give_back_never_arrives_is_settled_by_the_release(
        relay: Relay, auto_renew: bool) -> None:
    lock = Lock("alost-re", timeout=30, reentrant=True, auto_renew=auto_renew)
    assert await lock.aacquire()
    relay.lose_replies()
    with pytest.raises(LockUnavailable):
        await lock.aacquire()
    await background_tasks_ended(lock)
    assert await asyncio.to_thread(holds, lock) == 2
    relay.restore()
    await lock.arelease()
    assert await asyncio.to_thread(holds, lock) == 0
    assert await Lock("alost-re", timeout=30).aacquire(blocking=False)
    assert lock._renewer is None


@pytest.mark.parametrize("reentrant", [False, True], ids=["plain", "reentrant"])
def test_a_lost_acquire_is_settled_by_the_next_acquire(relay: Relay, reentrant: bool) -> None:
    """The acquire that took the lock lost its reply and its give-back: the same Lock's next
    acquire gives that hold back first and takes the lock anew (before, a plain Lock waited
    for its own lost hold's lease to run out, and a reentrant one re-entered it, so its one
    release left the lock held)."""
    lock = Lock("lost-first", timeout=30, reentrant=reentrant)
    relay.lose_replies()
    with pytest.raises(LockUnavailable):
        lock.acquire()
    given_back_thread(lock)
    assert holds(lock) == 1
    relay.restore()
    assert lock.acquire(blocking=False)
    assert holds(lock) == 1 and lock._depth == 1
    lock.release()
    assert Lock("lost-first", timeout=30).acquire(blocking=False)


def test_a_give_back_arriving_after_a_reentry_on_its_hold_keeps_the_reentry(
        relay: Relay) -> None:
    """A lost acquire's give-back lands after an acquire that did not know of it (another
    thread's, sharing the object) re-entered the hold it took: it gives back that one hold,
    and the caller of the re-entry still holds the lock (before, it freed it under them)."""
    lock = Lock("late-give", timeout=30, reentrant=True)
    relay.lose_replies()
    with pytest.raises(LockUnavailable):
        lock.acquire()
    given_back_thread(lock)
    relay.restore()
    late = _Wait(lock, None)
    late.id = lock._uncounted.pop()  # not yet recorded when the other acquire was sent
    assert lock.acquire()
    assert holds(lock) == 2
    run(lock._giving_back(late))  # the lost acquire's give-back, landing late
    assert holds(lock) == 1 and lock.owned()
    assert not Lock("late-give", timeout=30).acquire(blocking=False)
    lock.release()
    assert holds(lock) == 0


def test_a_release_that_reaches_redis_late_gives_back_its_own_hold_only(relay: Relay) -> None:
    """The release of the last hold is kept on its way (its caller gives up: LockUnavailable),
    an acquire of the same Lock that did not know of it (another thread's, sharing the object:
    the same Lock's own next acquire settles it first) re-enters that hold (same owner, same
    token), then the late release arrives: it gives back the old hold, not the new one."""
    lock = Lock("late-release", timeout=30, reentrant=True)
    assert lock.acquire()
    relay.keep_requests()
    with pytest.raises(LockUnavailable):
        lock.release()
    assert lock._depth == 0
    lock._uncounted.clear()  # not yet recorded when the other acquire was sent
    assert lock.acquire()
    assert holds(lock) == 2
    relay.deliver()
    until(lambda: holds(lock) != 2, what="the late release run")
    assert holds(lock) == 1 and lock.owned()
    assert not Lock("late-release", timeout=30).acquire(blocking=False)
    lock.release()
    assert holds(lock) == 0


@contextlib.contextmanager
def patient() -> Iterator[None]:
    """The test's topology with timeouts a loaded machine cannot reach: for the calls after
    the one whose reply had to be lost."""
    from tests.settings import REDISLUA as current  # the topology fixture may have changed it

    with override_settings(REDISLUA={**current, **PATIENT}):
        yield


def test_a_reentry_whose_reply_was_lost_is_released_at_once(short_timeouts: None) -> None:
    """Issue 35's scenario on either topology: the one release comes at once, whether the
    give-back has landed yet or not (before, it depended on which arrived first)."""
    lock = Lock("re-now", timeout=30, reentrant=True)
    assert lock.acquire()
    pause = stopped(lock.keys.base)
    with pytest.raises(LockUnavailable):
        lock.acquire()
    pause.join()
    with patient():
        lock.release()
        assert Lock("re-now", timeout=30).acquire(blocking=False)


async def test_an_async_reentry_whose_reply_was_lost_is_released_at_once(
        short_timeouts: None) -> None:
    lock = Lock("are-now", timeout=30, reentrant=True)
    assert await lock.aacquire()
    pause = stopped(lock.keys.base)
    with pytest.raises(LockUnavailable):
        await lock.aacquire()
    await asyncio.to_thread(pause.join)
    with patient():
        await lock.arelease()
        assert await Lock("are-now", timeout=30).aacquire(blocking=False)


# -- settings changes return their connections ----------------------------------------------------

ROUNDS = 120
POOL = 40
# What these tests count is connections, not time: patient timeouts (tests/patience.py). At the
# default 0.5 s a clean-clone CI run failed one round's connect (its event loop starved past it).


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
