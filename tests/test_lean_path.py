"""The lean transport (``django_redislua/lean.py``) against real servers, side by side with the
reference one (``transport.PoolSource``: a connection checked out of the pool per call).

The issue's acceptance: the lean path recovers from a server restart, a ``SCRIPT FLUSH`` and a
timeout exactly like the normal path. Each test gets its own server (restarted, paused or
flushed without disturbing the shared one) and is run on both paths where that means anything:

- ``lean``: the app's default client from a URL, which lean.py takes (asserted, not assumed);
- ``lean-methods``: the same, its kept connections driven through redis-py's connection
  methods rather than on their sockets directly (``sockets.SOCKET_API`` off);
- ``ordinary``: the same URL with ``REDISLUA["LEAN_CALLS"] = False``, the reference transport:
  the same protocol (RESP3, redis-py 8.1's default), handshake and pool; the path is the only
  difference.

``pool_state`` checks what must hold between calls on either path: the only connections
checked out of the pool are the lean channel's idle ones (none on the ordinary path), and every
connection the channel keeps is idle. A connection lost from that accounting is a pool slot
leaked for the life of the process.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import json
import logging
import os
import select
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from django.conf import settings
from django.test import Client, override_settings

from django_redislua import atransport, lean, sockets, transport
from django_redislua.atransport import get_async_transport
from django_redislua.checks import check_settings
from django_redislua.connection import get_async_client, get_client
from django_redislua.limiting.policy import Policy
from django_redislua.testing import CommandRecorder, RedisServer
from django_redislua.transport import get_transport

TIMEOUT = 0.3  # SOCKET_TIMEOUT and SOCKET_CONNECT_TIMEOUT under test
LEAN, ORDINARY, PIPELINED = "lean", "ordinary", "pipelined"
# The lean transport through redis-py's connection methods, as where django_redislua/sockets.py
# does not apply (a unix socket, TLS, no hiredis, another OS): the sync paths run it too.
LEAN_METHODS = "lean-methods"
PATHS = [LEAN, LEAN_METHODS, ORDINARY]
# asyncio: also the shared connection of automatic pipelining (django_redislua/pipelining.py),
# over the lean transport; ``lean`` and ``ordinary`` run with PIPELINING off.
ASYNC_PATHS = [LEAN, ORDINARY, PIPELINED]

# -- bugs these tests found (see the reasons) --------------------------------------------------
REDIS_PY_4252 = (
    "redis-py 8.1.0 regression (redis/redis-py#4252, fixed by #4260): the asyncio pool ignores "
    "can_read() when maintenance notifications are on (RESP3, the default), so the ordinary "
    "async path hands out a connection the server closed"
)


# -- fixtures and helpers ------------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, restartable on the same port (its workdir is kept)."""
    with RedisServer(workdir=str(tmp_path)) as srv:
        yield srv


@pytest.fixture(autouse=True)
def socket_api(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """``lean-methods``: the kept connections are not driven on their sockets. ``lean``: they
    are, on this test's main thread too, as on any other thread (the main thread keeps
    redis-py's methods for the signals it gets, see sockets._on_main_thread, which
    test_the_main_thread_keeps_redis_pys_timeout checks without this)."""
    callspec = getattr(request.node, "callspec", None)
    path = callspec.params.get("path") if callspec is not None else None
    if path == LEAN_METHODS:
        monkeypatch.setattr(sockets, "SOCKET_API", False)
    elif path == LEAN or request.node.get_closest_marker("socket_path"):
        monkeypatch.setattr(sockets, "_on_main_thread", lambda: False)


@pytest.fixture
def control(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client(decode_responses=True)
    yield client
    client.close()


def redislua(server: RedisServer, path: str, **extra: Any) -> dict[str, Any]:
    options = dict(extra.pop("CONNECTION_OPTIONS", {}))
    return {
        "CONNECTION": server.url,
        "LEAN_CALLS": path != ORDINARY,
        "PIPELINING": path == PIPELINED,
        "SOCKET_TIMEOUT": TIMEOUT,
        "SOCKET_CONNECT_TIMEOUT": TIMEOUT,
        "CONNECTION_OPTIONS": options,
        **extra,
    }


def on(server: RedisServer, path: str, **extra: Any) -> override_settings:
    return override_settings(REDISLUA=redislua(server, path, **extra))


def lean_or_skip(path: str) -> None:
    """The lean transport is used on the redis-py versions the suite proves it on only."""
    if path in (LEAN, LEAN_METHODS) and not lean.SUPPORTED:
        pytest.skip(f"the lean transport is used on redis-py {lean.LEAN_SINCE} and newer only "
                    f"(this is {redis.__version__}; the reference transport runs instead)")


def channel(path: str) -> lean.KeptConnections | None:
    """The sync transport's kept connections; asserts the path the test means to exercise is
    taken."""
    lean_or_skip(path)
    source = get_transport().source  # type: ignore[attr-defined]
    found = source if isinstance(source, lean.KeptConnections) else None
    assert found is not None if lean_path(path) else found is None
    return found


def lean_path(path: str) -> bool:
    """Whether ``path`` keeps connections (pipelining's other calls do where lean can)."""
    return path in (LEAN, LEAN_METHODS) or (path == PIPELINED and lean.SUPPORTED)


def achannel(path: str) -> lean.AsyncKeptConnections | None:
    lean_or_skip(path)
    transport = get_async_transport()
    assert (transport.shared is not None) == (path == PIPELINED)  # type: ignore[attr-defined]
    source = transport.source  # type: ignore[attr-defined]
    found = source if isinstance(source, lean.AsyncKeptConnections) else None
    assert found is not None if lean_path(path) else found is None
    return found


def apool_state(found: lean.AsyncKeptConnections | None) -> None:
    """:func:`pool_state` of the running loop's client, with the shared connection of
    pipelining, if any: idle (nothing pending, nothing in flight), and the one other connection
    checked out."""
    shared = get_async_transport().shared  # type: ignore[attr-defined]
    held = set()
    if shared is not None:
        assert not shared._pending and not shared._in_flight and not shared._using
        held = {shared._conn} - {None}
    pool_state(get_async_client().connection_pool, found, held)


def lean_call(found: Any, *args: Any) -> Any:
    """One command on a connection of the lean transport itself (raises an error reply)."""
    conn = transport.opened(found)
    try:
        transport.written(found, conn, (args,))
        reply = transport.read(found, conn, 1)[0]
    finally:
        found.give(conn)
    if isinstance(reply, Exception):
        raise reply
    return reply


async def alean_call(afound: Any, *args: Any) -> Any:
    reply = (await atransport.aexchange(afound, (args,)))[0]
    if isinstance(reply, Exception):
        raise reply
    return reply


def in_use(pool: Any) -> set[Any]:
    """The connections checked out of ``pool``: redis-py 8 has an accessor; before it a plain
    pool keeps the set, a blocking pool every connection and a queue of the idle ones."""
    found = getattr(pool, "_get_in_use_connections", None)
    if found is not None:
        return set(found())
    if isinstance(pool, redis.BlockingConnectionPool):
        return set(pool._connections) - set(pool.pool.queue)
    return set(pool._in_use_connections)


def pool_state(pool: Any, found: lean.KeptConnections | lean.AsyncKeptConnections | None,
               held: set[Any] = frozenset()) -> None:  # type: ignore[assignment]
    """Between calls: only the channel's idle connections (and ``held``: pipelining's shared
    one) are checked out, and every connection it keeps is idle (none lost, none checked out
    twice)."""
    idle = list(found._idle) if found is not None else []
    assert len(idle) == len(set(idle)), "a connection is idle twice"
    assert in_use(pool) == set(idle) | held
    if found is not None:
        assert found._kept == set(idle)
        assert len(found._kept) <= max(1, pool.max_connections // 2)
    if isinstance(found, lean.KeptConnections):  # each kept one on its socket, where it can be
        assert set(found._direct) <= found._kept
        if not sockets.SOCKET_API:
            assert not found._direct
        elif not sockets._on_main_thread():  # the path "lean" (see the fixture socket_api)
            assert set(found._direct) == found._kept


def recorded(server: RedisServer) -> CommandRecorder:
    return CommandRecorder(server.client())


def calls(rec: CommandRecorder) -> list[str]:
    """What clients sent, without the reconnect handshake (``HELLO 3``, ``CLIENT SETINFO``)."""
    return rec.commands_without_handshake


def restart(server: RedisServer) -> None:
    server.stop()
    server.start()


def kill_clients(control: redis.Redis) -> None:
    """Close every other connection from the server side (as an idle timeout would)."""
    control.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


class paused:
    """The server stopped (SIGSTOP) for the block: connected, silent, a reconnect's handshake
    included (a hung server); resumed (SIGCONT) as the block ends, however long it lasted, so
    a call that gives up meanwhile gave up on its own timeout, not on an answer. (``CLIENT
    PAUSE ... ALL`` cannot be lifted early: ``CLIENT UNPAUSE`` waits it out too.)"""

    def __init__(self, server: RedisServer | int) -> None:
        """``server``: a server this test started, or a server's process id."""
        if isinstance(server, int):
            self.pid = server
        else:
            assert server.process is not None
            self.pid = server.process.pid

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


def policy(rate: str = "100/m") -> Policy:
    return Policy("lean", rate=rate)


# -- 1. which path is taken ----------------------------------------------------------------------


def caches(server: RedisServer, **options: Any) -> dict[str, Any]:
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "dr": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url,
               "OPTIONS": options.get("dr", {})},
        "dj": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
               "LOCATION": server.url, "OPTIONS": options.get("dj", {})},
    }


@pytest.mark.parametrize(
    ("connection", "cache_options", "reused"),
    [
        ("url", {}, False),
        ("dr", {}, False),  # django-redis without a socket timeout: a sibling pool of ours
        ("dr", {"dr": {"SOCKET_TIMEOUT": TIMEOUT}}, True),  # django-redis's own pool
        ("dj", {"dj": {"socket_timeout": TIMEOUT}}, True),  # Django's RedisCache's own pool
    ],
    ids=["url", "django-redis-sibling", "django-redis-reused", "django-cache-reused"],
)
def test_lean_path_taken_for_a_single_server(
    server: RedisServer, connection: str, cache_options: dict[str, Any], reused: bool
) -> None:
    config = {"CONNECTION": server.url if connection == "url" else connection,
              "SOCKET_TIMEOUT": TIMEOUT}
    with override_settings(REDISLUA=config, CACHES=caches(server, **cache_options)):
        client = get_client()
        if reused:
            from django.core.cache import caches as django_caches

            theirs = django_caches[connection]
            pool = (theirs.client.get_client(write=True) if connection == "dr"
                    else theirs._cache.get_client(write=True)).connection_pool
            assert client.connection_pool is pool
        found = channel(LEAN)
        limited = policy("5/m")
        assert [limited.hit("a").allowed for _ in range(6)] == [True] * 5 + [False]
        assert limited.hit("b").allowed
        pool_state(client.connection_pool, found)


async def test_lean_path_taken_by_the_async_client(server: RedisServer) -> None:
    with on(server, LEAN):
        found = achannel(LEAN)
        limited = policy("5/m")
        assert [(await limited.ahit("a")).allowed for _ in range(6)] == [True] * 5 + [False]
        apool_state(found)


async def test_lean_calls_false_takes_the_ordinary_path(server: RedisServer) -> None:
    with on(server, ORDINARY):
        channel(ORDINARY)
        achannel(ORDINARY)
        limited = policy("5/m")
        assert [limited.hit("a").allowed for _ in range(6)] == [True] * 5 + [False]
        assert [(await limited.ahit("b")).allowed for _ in range(6)] == [True] * 5 + [False]
        if lean.SUPPORTED:  # redis-py 8's default protocol (older ones speak RESP2)
            assert str(get_client().client_info()["resp"]) == "3"


@pytest.mark.parametrize("protocol", [2, 3])
def test_lean_path_on_either_protocol(server: RedisServer, protocol: int) -> None:
    """RESP3 is redis-py 8.1's default; RESP2 is one option away. Both take the lean path."""
    with on(server, LEAN, CONNECTION_OPTIONS={"protocol": protocol}):
        found = channel(LEAN)
        assert found is not None
        info = lean_call(found, "CLIENT", "INFO")  # on a connection of the lean path itself
        assert f" resp={protocol}".encode() in info, info
        limited = policy("2/m")
        assert [limited.hit("a").allowed for _ in range(3)] == [True, True, False]


@pytest.mark.parametrize("encoding", ["latin-1", "utf-8"])
async def test_lean_path_sends_the_bytes_the_ordinary_path_sends(
    server: RedisServer, encoding: str
) -> None:
    """Whatever the pool's encoding, a non-ASCII text, bytes, a float and a big int reach Redis
    byte for byte as each client's own execute_command sends them (ECHO returns what arrived):
    redis-py packs sync commands with hiredis (text as UTF-8), asyncio ones in Python with the
    encoder; a bytearray is converted (sync) or refused (asyncio) exactly as there."""
    with on(server, LEAN, CONNECTION_OPTIONS={"encoding": encoding}):
        found, afound = channel(LEAN), achannel(LEAN)
        assert found is not None and afound is not None
        for value in ("d\u00e9j\u00e0 vu", b"\xff\x00", 0.1, 2**70, bytearray(b"\xfe")):
            assert lean_call(found, "ECHO", value) == get_client().execute_command("ECHO", value)
            try:
                ordinary = await get_async_client().execute_command("ECHO", value)
            except redis.DataError:
                with pytest.raises(redis.DataError):
                    await alean_call(afound, "ECHO", value)
            else:
                assert await alean_call(afound, "ECHO", value) == ordinary
        assert get_client().execute_command("ECHO", "\u00e9") == "\u00e9".encode()  # hiredis
        assert await get_async_client().execute_command("ECHO", "\u00e9") == "\u00e9".encode(
            encoding)
        limited = policy("2/m")
        assert [limited.hit("a").allowed for _ in range(3)] == [True, True, False]


@pytest.mark.parametrize("value", ["no", "False", 0, 1, None])
def test_e024_lean_calls_not_a_bool(value: object) -> None:
    with override_settings(REDISLUA={"LEAN_CALLS": value}):
        assert "redislua.E024" in [m.id for m in check_settings()]
    with override_settings(REDISLUA={"LEAN_CALLS": False}):
        assert "redislua.E024" not in [m.id for m in check_settings()]


# -- 2. a server restart, or connections the server closed ---------------------------------------

# After a restart the script cache is empty: one EVALSHA (NOSCRIPT), one SCRIPT LOAD, the call
# again. After a CLIENT KILL (what an idle timeout does) the script is still there.
EVENTS = {"restart": ["EVALSHA", "SCRIPT", "EVALSHA"], "killed": ["EVALSHA"]}


@pytest.mark.parametrize("event", list(EVENTS))
@pytest.mark.parametrize("path", PATHS)
def test_server_closed_connection_is_replaced(
    server: RedisServer, control: redis.Redis, path: str, event: str
) -> None:
    with on(server, path):
        limited = policy()
        found = channel(path)
        assert limited.hit("a").allowed  # a pooled connection, now idle
        if event == "restart":
            restart(server)
        else:
            kill_clients(control)
        time.sleep(0.05)  # the FIN has arrived
        with recorded(server) as rec:
            assert limited.hit("a").allowed  # no error: the dead connection was found first
            assert limited.hit("a").allowed
        assert calls(rec) == [*EVENTS[event], "EVALSHA"]
        pool_state(get_client().connection_pool, found)


@pytest.mark.django_db
@pytest.mark.parametrize("path", [LEAN, ORDINARY])
def test_restart_through_a_view_fail_closed(
    client: Client, server: RedisServer, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What users see: with FAIL_OPEN=False a restart must not turn a request into a 503 (nor,
    with FAIL_OPEN=True, into an outage warning and an unlimited request)."""
    with on(server, path, FAIL_OPEN=False):
        assert client.get("/rl/inline/").status_code == 200
        restart(server)
        time.sleep(0.05)
        with caplog.at_level(logging.WARNING, logger="django_redislua"):
            statuses = [client.get("/rl/inline/").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]  # 3/m: the restarted server counts from zero
    assert [r for r in caplog.records if r.name == "django_redislua"] == []


@pytest.mark.parametrize("event", list(EVENTS))
@pytest.mark.parametrize(
    "path",
    [LEAN, pytest.param(ORDINARY, marks=pytest.mark.xfail(
        redis.VERSION[:2] == (8, 1), strict=False, reason=REDIS_PY_4252)), PIPELINED],
)
async def test_async_server_closed_connection_is_replaced(
    server: RedisServer, control: redis.Redis, path: str, event: str
) -> None:
    with on(server, path):
        limited = policy()
        found = achannel(path)
        assert (await limited.ahit("a")).allowed
        if event == "restart":
            restart(server)
        else:
            kill_clients(control)
        # Let the loop see the EOF, as it would between two requests (until then no check,
        # on either path, can know the connection is closed).
        await asyncio.sleep(0.05)
        with recorded(server) as rec:
            assert (await limited.ahit("a")).allowed
            assert (await limited.ahit("a")).allowed
        assert calls(rec) == [*EVENTS[event], "EVALSHA"]
        apool_state(found)


# -- 3, 4. SCRIPT FLUSH and FUNCTION FLUSH ---------------------------------------------------------

FLUSHES = {
    False: ("SCRIPT", ["EVALSHA", "SCRIPT", "EVALSHA", "EVALSHA"]),
    True: ("FUNCTION", ["FCALL", "FUNCTION", "FCALL", "FCALL"]),
}


@pytest.mark.parametrize("use_functions", [False, True], ids=["scripts", "functions"])
@pytest.mark.parametrize("path", PATHS)
def test_flushed_scripts_are_loaded_once(
    server: RedisServer, control: redis.Redis, path: str, use_functions: bool
) -> None:
    flush, expected = FLUSHES[use_functions]
    with on(server, path, USE_FUNCTIONS=use_functions):
        limited = policy()
        found = channel(path)
        assert limited.hit("a").allowed
        control.execute_command(flush, "FLUSH")
        with recorded(server) as rec:
            assert limited.hit("a").allowed
            assert limited.hit("a").allowed
        assert rec.commands == expected  # one reload, on the same connection: no handshake
        assert limited.hit("a").remaining == 100 - 4  # every call counted once
        pool_state(get_client().connection_pool, found)


@pytest.mark.parametrize("use_functions", [False, True], ids=["scripts", "functions"])
@pytest.mark.parametrize("path", ASYNC_PATHS)
async def test_async_flushed_scripts_are_loaded_once(
    server: RedisServer, control: redis.Redis, path: str, use_functions: bool
) -> None:
    flush, expected = FLUSHES[use_functions]
    with on(server, path, USE_FUNCTIONS=use_functions):
        limited = policy()
        found = achannel(path)
        assert (await limited.ahit("a")).allowed
        control.execute_command(flush, "FLUSH")
        with recorded(server) as rec:
            assert (await limited.ahit("a")).allowed
            assert (await limited.ahit("a")).allowed
        assert rec.commands == expected
        assert (await limited.ahit("a")).remaining == 100 - 4
        apool_state(found)


@pytest.mark.socket_path
def test_kept_connections_make_no_poll(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Driven on their sockets, kept connections are checked without redis-py's ``can_read``
    (a poll) and their sockets block with the timeout kept by the kernel (CPython polls before
    every send and receive on a socket with a Python timeout)."""
    if not sockets.SOCKET_API:
        pytest.skip("Linux TCP_INFO and hiredis only")
    with on(server, LEAN):
        limited = policy("1000/m")
        found = channel(LEAN)
        assert limited.hit("a").allowed

        def polled(*args: Any) -> Any:
            raise AssertionError("polled")

        monkeypatch.setattr(select, "poll", polled)
        monkeypatch.setattr(redis.connection.Connection, "can_read", polled)
        for n in range(50):
            assert limited.hit("a").remaining == 998 - n
        monkeypatch.undo()
        assert found is not None and found._kept
        for conn in found._kept:
            assert conn._sock.gettimeout() is None
            timeval = conn._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)
            assert struct.unpack("@ll", timeval) == (0, round(TIMEOUT * 1_000_000))
        pool_state(get_client().connection_pool, found)


@pytest.mark.socket_path
def test_connections_given_back_time_out_as_redis_pys(server: RedisServer) -> None:
    """Kept connections given back to the pool (the transport closed, as when settings change)
    get their Python timeout back: redis-py's own calls on them time out as
    ``redis.TimeoutError``, not as a failed read."""
    with on(server, LEAN):
        limited = policy()
        found = channel(LEAN)
        assert limited.hit("a").allowed
        kept = set(found._kept)  # type: ignore[union-attr]
        get_transport().close()
        for conn in kept:
            assert conn._sock.gettimeout() == TIMEOUT
        # the pool lends them to redis-py's own client now
        with paused(server), pytest.raises(redis.TimeoutError):
            get_client().execute_command("PING")


def a_reply_nobody_read(conn: Any) -> None:
    """A reply waiting on the connection (a call abandoned without closing it: none of ours
    does): never the answer to the next call."""
    conn._sock.sendall(b"*1\r\n$4\r\nPING\r\n")  # its +PONG is never read
    assert select.select([conn._sock], [], [], 5)[0]  # it has landed


def marked_for_a_reconnect(conn: Any) -> None:
    """redis-py marks a connection in use for a reconnect (a server's maintenance notice, a
    cluster's table change), which the pool does as it comes back: a kept one never does."""
    if not hasattr(redis.connection.Connection, "mark_for_reconnect"):
        pytest.skip(f"redis-py {redis.__version__} marks no connection for a reconnect")
    conn.mark_for_reconnect()


def closed_under_it(conn: Any) -> None:
    """The socket closed by another thread, as a pool's ``disconnect`` does mid-way (CI98:
    redis-py's own check then polls a socket object whose descriptor is -1, a ValueError)."""
    conn._sock.close()  # the socket object closed, the connection not told


@pytest.mark.parametrize("spoil", [a_reply_nobody_read, marked_for_a_reconnect, closed_under_it])
@pytest.mark.parametrize("path", [LEAN, LEAN_METHODS])
def test_a_spoiled_kept_connection_is_replaced_before_the_send(
    server: RedisServer, path: str, spoil: Any
) -> None:
    """Whatever spoiled a kept connection between two calls is found before the next call's
    send, which goes out once, on a new connection."""
    with on(server, path):
        limited = policy()
        found = channel(path)
        assert limited.hit("a").remaining == 99
        (conn,) = found._idle  # type: ignore[union-attr]
        stale = conn._sock
        spoil(conn)
        with recorded(server) as rec:
            assert limited.hit("a").remaining == 98
        assert calls(rec) == ["EVALSHA"]
        assert conn._sock is not stale and not getattr(conn, "should_reconnect", bool)()
        pool_state(get_client().connection_pool, found)


def in_thread(call: Any) -> Any:
    """``call()`` on a thread of its own (not the main one); its result, or its exception."""
    found: list[Any] = []

    def run() -> None:
        try:
            found.append(("value", call()))
        except BaseException as exc:
            found.append(("raised", exc))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    kind, value = found[0]
    if kind == "raised":
        raise value
    return value


def test_the_main_thread_keeps_redis_pys_timeout(server: RedisServer) -> None:
    """Threads drive a kept connection on its socket; the main thread, where the process's
    signals land (a periodic one would restart a blocking receive's kernel timeout), uses it
    through redis-py's methods, its socket given its Python timeout back."""
    if not sockets.SOCKET_API:
        pytest.skip("Linux TCP_INFO and hiredis only")
    with on(server, LEAN):
        limited = policy("1000/m")
        found = channel(LEAN)
        assert found is not None
        assert limited.hit("a").remaining == 999
        (conn,) = found._idle
        assert conn not in found._direct and conn._sock.gettimeout() == TIMEOUT
        assert in_thread(lambda: limited.hit("a")).remaining == 998
        assert conn in found._direct and conn._sock.gettimeout() is None
        assert limited.hit("a").remaining == 997
        assert conn not in found._direct and conn._sock.gettimeout() == TIMEOUT
        pool_state(get_client().connection_pool, found)


@pytest.mark.parametrize("where", ["main thread", "another thread"])
def test_a_periodic_signal_does_not_stretch_the_timeout(
    server: RedisServer, where: str
) -> None:
    """A process with a periodic signal (a sampling profiler's ``ITIMER_REAL``, every 0.1 s,
    under a 0.3 s timeout) and a hung server: the call still fails on its timeout, never waits
    for the server to come back (a blocking receive is started again, with the kernel's whole
    timeout, after each signal)."""
    previous = signal.signal(signal.SIGALRM, lambda *args: None)
    try:
        with on(server, LEAN):
            limited = policy()
            call = (lambda: limited.hit("a")) if where == "main thread" else (
                lambda: in_thread(lambda: limited.hit("a")))
            assert call().allowed
            assert server.process is not None
            pid = server.process.pid
            # Resumed after 3 s whatever happens: a call that kept waiting would then succeed
            # (and the test fail) rather than hang with the server.
            resume = threading.Timer(3, os.kill, (pid, signal.SIGCONT))
            signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)
            os.kill(pid, signal.SIGSTOP)
            resume.start()
            try:
                with pytest.raises(redis.TimeoutError):
                    call()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                resume.cancel()
                os.kill(pid, signal.SIGCONT)
            assert call().allowed
    finally:
        signal.signal(signal.SIGALRM, previous)


# -- 5. timeouts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_timeout_then_recovery(server: RedisServer, path: str) -> None:
    with on(server, path):
        limited = policy()
        found = channel(path)
        assert limited.hit("a").allowed
        with paused(server):
            start = time.monotonic()
            with pytest.raises(redis.TimeoutError):
                limited.hit("a")
            elapsed = time.monotonic() - start
            # the ordinary client, beside it, fails the same way
            with pytest.raises(redis.TimeoutError):
                get_client().execute_command("PING")
        # The socket timeout: the server answered nothing until the block's end, after the
        # call (a bound on the time taken would fail on a loaded machine).
        assert elapsed >= TIMEOUT * 0.9
        assert limited.hit("a").allowed  # same process: the connection was dropped, remade
        pool_state(get_client().connection_pool, found)


@pytest.mark.parametrize("path", PATHS)
def test_timeouts_while_reconnecting_leak_nothing(
    server: RedisServer, path: str
) -> None:
    """A hung server answers nothing, the handshake of a reconnect included: the second call
    of an outage times out while reconnecting. Afterwards the pool must be whole."""
    with on(server, path):
        limited = policy()
        found = channel(path)
        assert limited.hit("a").allowed
        with paused(server):
            for _ in range(3):
                with pytest.raises(redis.TimeoutError):
                    limited.hit("a")
        assert limited.hit("a").allowed
        assert limited.hit("a").allowed
        pool_state(get_client().connection_pool, found)


@pytest.mark.parametrize("path", ASYNC_PATHS)
async def test_async_timeout_then_recovery(
    server: RedisServer, path: str
) -> None:
    with on(server, path):
        limited = policy()
        found = achannel(path)
        assert (await limited.ahit("a")).allowed
        with paused(server):
            start = time.monotonic()
            with pytest.raises(redis.TimeoutError):
                await limited.ahit("a")
            elapsed = time.monotonic() - start
        assert elapsed >= TIMEOUT * 0.9  # and the server answered nothing meanwhile
        assert (await limited.ahit("a")).allowed
        apool_state(found)


# -- 6. one round trip per decision ------------------------------------------------------------


@pytest.mark.parametrize("path", ASYNC_PATHS)
async def test_one_command_per_decision(server: RedisServer, path: str) -> None:
    with on(server, path):
        limited = policy()
        channel(path)
        achannel(path)
        limited.hit("warm")
        await limited.ahit("warm")
        with recorded(server) as rec:
            for identity in ("a", "b", "c"):
                assert limited.hit(identity).allowed
                assert (await limited.ahit(identity)).allowed
        assert rec.commands == ["EVALSHA"] * 6  # no PING, no CLIENT, no handshake
        assert rec.script_commands  # the script did its work server-side


# -- 7. fork -----------------------------------------------------------------------------------


# Python 3.12+ warns when forking a process that has threads (another test's leftovers).
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_forked_child_uses_its_own_connection(server: RedisServer) -> None:
    with on(server, LEAN):
        limited = policy()
        found = channel(LEAN)
        assert found is not None
        assert limited.hit("parent").allowed
        parent_id = lean_call(found, "CLIENT", "ID")  # the parent's kept lean connection
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            report: dict[str, Any] = {}
            try:
                os.close(read_end)
                report["allowed"] = limited.hit("child").allowed
                report["id"] = lean_call(found, "CLIENT", "ID")
                # The connections the child dropped are collected here: closing its copies of
                # the parent's sockets must not shut them down for the parent.
                gc.unfreeze()  # conftest froze what earlier modules left: collect it all here
                gc.collect()
                report["again"] = limited.hit("child").allowed
            except BaseException as exc:
                report["error"] = repr(exc)
            finally:
                os.write(write_end, json.dumps(report).encode())
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            report = json.loads(pipe.read() or b"{}")
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert "error" not in report, report["error"]
        assert report["allowed"] and report["again"]
        assert report["id"] != parent_id
        # The parent goes on, on the connection it had: unharmed by the child.
        assert limited.hit("parent").allowed
        assert lean_call(found, "CLIENT", "ID") == parent_id
        assert limited.peek("child").remaining == 100 - 2  # the child's calls counted
        pool_state(get_client().connection_pool, found)


@pytest.mark.skipif(not sockets.SOCKET_API, reason="kept connections driven on their sockets")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.parametrize("how", ["close", "collected", "close, the lock held"])
def test_a_forked_child_giving_up_the_parents_connections_leaves_their_sockets_alone(
        server: RedisServer, how: str) -> None:
    """A child that never used the kept connections it inherited and drops them (a settings
    change closes the transport; the interpreter's exit runs the finalizer) must not give
    their sockets a Python timeout: that makes the socket non-blocking for both processes,
    and the parent's blocking receive fails at once (EAGAIN) on the next call. Nor may it wait
    for their lock, which a thread of the parent may have held when it forked (never freed
    in the child)."""
    with on(server, LEAN):
        limited = policy()
        found = channel(LEAN)
        assert found is not None
        assert in_thread(lambda: limited.hit("parent")).allowed  # driven on its socket
        (driven,) = found._direct
        descriptor = driven._sock.fileno()
        assert not fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_NONBLOCK
        held = how == "close, the lock held"
        if held:
            found._lock.acquire()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports by its exit status
            code = 1
            try:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not a Python handler's
                signal.alarm(5)  # stuck on the lock: killed by the signal, the parent sees it
                found._finalizer() if how == "collected" else found.close()
                code = 0
            finally:
                os._exit(code)
        if held:
            found._lock.release()
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert not fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_NONBLOCK
        assert in_thread(lambda: limited.hit("parent")).allowed
        assert found._direct  # still driven on its socket


# -- 8. pool limits ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_pool_of_one_connection(server: RedisServer, path: str) -> None:
    with on(server, path, CONNECTION_OPTIONS={"max_connections": 1}):
        limited = policy()
        channel(path)
        assert limited.hit("a").allowed
        assert limited.reset("a")  # an ordinary-path command needs the pool's connection
        assert get_client().ping()
        assert limited.hit("a").allowed


def hammer(threads: int, calls_each: int) -> list[BaseException]:
    limited = policy("1000/m")
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(n: int) -> None:
        start.wait()
        for _ in range(calls_each):
            try:
                assert limited.hit(f"t{n}").allowed
            except BaseException as exc:
                errors.append(exc)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    return errors


def connections_received(control: redis.Redis) -> int:
    return int(control.info("stats")["total_connections_received"])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("pool", "threads"), [("blocking", 8), ("plain", 4)])
def test_pool_limit_under_concurrency(
    server: RedisServer, control: redis.Redis, path: str, pool: str, threads: int
) -> None:
    """max_connections=4. A BlockingConnectionPool (Django's RedisCache ``pool_class``) makes
    8 threads wait their turn; a plain pool (a URL) raises MaxConnectionsError beyond 4 on
    either path, so it gets 4 threads: the lean path must never need a fifth connection."""
    if pool == "blocking":
        options = {"pool_class": "redis.BlockingConnectionPool", "max_connections": 4,
                   "timeout": 10, "socket_timeout": 2}
        config = override_settings(REDISLUA={"CONNECTION": "dj", "LEAN_CALLS": path != ORDINARY},
                                   CACHES=caches(server, dj=options))
    else:
        config = on(server, path, SOCKET_TIMEOUT=2, CONNECTION_OPTIONS={"max_connections": 4})
    before = connections_received(control)
    with config:
        client = get_client()
        assert type(client.connection_pool) is (
            redis.BlockingConnectionPool if pool == "blocking" else redis.ConnectionPool)
        found = channel(path)
        errors = hammer(threads, 40)
        assert errors == []
        opened = connections_received(control) - before
        assert opened <= 4  # never more than max_connections, and no churn either
        others = [c for c in control.client_list() if int(c["id"]) != control.client_id()]
        assert len(others) <= 4
        if found is not None:
            assert len(found._kept) == 2  # half the pool, kept; the other half for the rest
        pool_state(client.connection_pool, found)
        assert client.ping()  # the ordinary path still gets a connection


# -- 9. asyncio cancellation ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ASYNC_PATHS)
async def test_cancelled_call_leaves_the_channel_usable(
    server: RedisServer, path: str
) -> None:
    with on(server, path):
        limited = policy()
        found = achannel(path)
        assert (await limited.ahit("a")).allowed
        with paused(server):
            task = asyncio.ensure_future(limited.ahit("a"))
            await asyncio.sleep(0.1)  # sent, waiting for the reply
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert (await limited.ahit("a")).allowed
        assert (await limited.ahit("a")).allowed
        apool_state(found)


@pytest.mark.parametrize("path", ASYNC_PATHS)
async def test_cancelled_reconnect_leaks_nothing(
    server: RedisServer, path: str
) -> None:
    """A request cancelled (client gone, a timeout wrapper) while its connection reconnects
    to a hung server: the connection must go back all the same."""
    with on(server, path):
        limited = policy()
        found = achannel(path)
        assert (await limited.ahit("a")).allowed
        with paused(server):
            with pytest.raises(redis.TimeoutError):
                await limited.ahit("a")  # the connection is dropped
            task = asyncio.ensure_future(limited.ahit("a"))
            await asyncio.sleep(0.1)  # reconnecting: the handshake waits for the server
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert (await limited.ahit("a")).allowed
        assert (await limited.ahit("a")).allowed
        apool_state(found)


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("parser", ["hiredis", "python"])
def test_a_pubsub_message_read_off_the_connection_is_what_get_message_gives(
    protocol: int, parser: str
) -> None:
    """The lean read of a kept inbox (transport._read_message) on either protocol and parser: a
    published message as get_message gives it, the subscribe confirmation through PubSub's own
    bookkeeping, None when nothing comes in time."""
    from redis._parsers import _RESP2Parser, _RESP3Parser

    from django_redislua.transport import _read_message

    lean_or_skip(LEAN)  # the read is the lean transport's (lean_reads): redis-py 8.1 and newer

    options: dict[str, Any] = {"protocol": protocol}
    if parser == "python":
        options["parser_class"] = _RESP3Parser if protocol == 3 else _RESP2Parser
    client = redis.Redis.from_url(settings.REDISLUA["CONNECTION"], **options)
    reference, lean_read = client.pubsub(), client.pubsub()
    try:
        for pubsub in (reference, lean_read):
            pubsub.subscribe("lean-read")
        assert _read_message(lean_read, 1.0) == reference.get_message(timeout=1.0)
        assert lean_read.subscribed and lean_read.channels == reference.channels
        client.publish("lean-read", "granted abc 1 1000")
        got = _read_message(lean_read, 1.0)
        assert got == reference.get_message(timeout=1.0)
        assert got["type"] == "message" and got["data"] == b"granted abc 1 1000"
        assert _read_message(lean_read, 0.05) is None
    finally:
        for pubsub in (reference, lean_read):
            pubsub.close()
        client.close()
