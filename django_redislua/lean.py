"""A lean call path for this app's script calls on a single Redis server (or one primary).

redis-py 8's ``Redis.execute_command`` checks a connection out of the pool (a lock, a
readability poll, observability counters), wraps the call in its Retry, dispatches events and
records metrics: on loopback that costs about as much as the round trip itself. A decision is
one script call per request, so it goes to a connection directly, through redis-py's public
connection API (``send_command``, ``read_response``, ``can_read``, the connection's ``retry``),
keeping every guarantee of the ordinary path:

- timeouts: the connections are the pool's own, with its socket timeouts;
- reconnect after errors: each call runs under the connection's own ``Retry``, which
  disconnects after every failure (so the next attempt reconnects), exactly as redis-py does;
- a connection the server closed (a restart, an idle timeout) or that has data waiting is found
  before use by the pool's own check (``can_read``) and reconnected;
- fork safety: a child process drops the connections it inherited;
- pool limits: connections are checked out of the client's pool and count against its
  ``max_connections``. This path keeps at most half of them checked out between calls (so the
  ordinary path always has the other half); beyond that it borrows and returns per call.

Used for ``redis.Redis`` clients on a plain ``ConnectionPool`` or ``BlockingConnectionPool``
speaking RESP2 without client-side caching; every other client (cluster, Sentinel, RESP3,
client-side caching) takes the ordinary path, whose extra machinery those need.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import redis
import redis.asyncio

Connection = Any  # redis.connection.AbstractConnection: its send/read methods are untyped
AsyncConnection = Any  # redis.asyncio.connection.AbstractConnection


def _eligible(pool: Any) -> bool:
    kwargs = pool.connection_kwargs
    return (
        type(pool) in (redis.ConnectionPool, redis.BlockingConnectionPool,
                       redis.asyncio.ConnectionPool, redis.asyncio.BlockingConnectionPool)
        and kwargs.get("protocol") in (None, 2, "2")
        and getattr(pool, "cache", None) is None
        and not kwargs.get("cache_config")
    )


class Channel:
    """The lean path to one sync client's server. Thread-safe; see the module docstring."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._pool = pool
        self._keep = max(1, pool.max_connections // 2)
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._idle: list[Connection] = []  # list.pop/append are atomic: no lock on the hot path
        self._kept: set[Connection] = set()
        self._lock = threading.Lock()

    def _take(self) -> Connection:
        if self._pid != os.getpid():  # a forked child: the parent's sockets are not ours
            self._reset()
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._pool.get_connection()  # connected and checked by the pool
            with self._lock:
                if len(self._kept) < self._keep:
                    self._kept.add(conn)
            return conn
        try:
            if conn.can_read():  # the pool's check: data waiting, or closed by the server
                conn.disconnect()  # the next send reconnects
        except redis.ConnectionError:
            pass  # can_read disconnected it already
        return conn

    def _give(self, conn: Connection) -> None:
        if conn in self._kept:
            self._idle.append(conn)
        else:
            self._pool.release(conn)

    def call(self, *args: Any) -> Any:
        """Send one command and return its reply, under the connection's Retry."""
        conn = self._take()
        try:
            return conn.retry.call_with_retry(
                lambda: _exchange(conn, args), lambda _error: conn.disconnect()
            )
        finally:
            self._give(conn)


def _exchange(conn: Connection, args: tuple[Any, ...]) -> Any:
    conn.send_command(*args)
    return conn.read_response()


class AsyncChannel:
    """The lean path to one asyncio client's server (one event loop, like the client)."""

    def __init__(self, pool: redis.asyncio.ConnectionPool) -> None:
        self._pool = pool
        self._keep = max(1, pool.max_connections // 2)
        self._idle: list[AsyncConnection] = []
        self._kept: set[AsyncConnection] = set()

    async def _take(self) -> AsyncConnection:
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = await self._pool.get_connection()
            if len(self._kept) < self._keep:
                self._kept.add(conn)
            return conn
        try:
            if not conn.is_connected:
                await conn.connect()
            elif await conn.can_read():  # the pool's check, as in Channel._take
                await conn.disconnect()
        except redis.ConnectionError:
            pass
        return conn

    async def call(self, *args: Any) -> Any:
        conn = await self._take()
        try:
            return await conn.retry.call_with_retry(
                lambda: _aexchange(conn, args), lambda _error: conn.disconnect()
            )
        finally:
            # A call cancelled mid-read leaves a disconnected connection (read_response sees
            # to that), which the next call reconnects.
            if conn in self._kept:
                self._idle.append(conn)
            else:
                await self._pool.release(conn)


async def _aexchange(conn: AsyncConnection, args: tuple[Any, ...]) -> Any:
    await conn.send_command(*args)
    return await conn.read_response()


_channels: weakref.WeakKeyDictionary[Any, Channel | AsyncChannel | None] = (
    weakref.WeakKeyDictionary()
)


def channel_for(client: Any) -> Channel | None:
    """The lean channel of a sync client, or None when the client must take the ordinary path."""
    try:
        return _channels[client]  # type: ignore[return-value]
    except KeyError:
        pass
    found = None
    if type(client) is redis.Redis and _eligible(client.connection_pool):
        found = Channel(client.connection_pool)
    _channels[client] = found
    return found


def async_channel_for(client: Any) -> AsyncChannel | None:
    """The lean channel of an asyncio client, or None (see :func:`channel_for`)."""
    try:
        return _channels[client]  # type: ignore[return-value]
    except KeyError:
        pass
    found = None
    if type(client) is redis.asyncio.Redis and _eligible(client.connection_pool):
        found = AsyncChannel(client.connection_pool)
    _channels[client] = found
    return found
