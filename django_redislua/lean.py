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
- a connection the server closed (a restart, an idle timeout, ``CLIENT KILL``) or that has
  data waiting is found before use by the pool's own check (``can_read``) and reconnected
  inside the call, so a reconnect that fails or is cancelled still gives the connection back;
- fork safety: a child process drops the connections it inherited;
- pool limits: connections are checked out of the client's pool and count against its
  ``max_connections``. This path keeps at most half of them (rounded down: none of a pool of
  one) checked out between calls, so the ordinary path always has the other half; beyond that
  it borrows and returns per call.

Used for ``redis.Redis`` clients on a plain ``ConnectionPool`` or ``BlockingConnectionPool``
without client-side caching, RESP2 or RESP3 (redis-py 8.1's default; ``read_response``
handles push messages, and a connection with one waiting is reconnected by the readability
check). Every other client (cluster, Sentinel, client-side caching) takes the ordinary path,
whose extra machinery those need; so does every client with ``REDISLUA["LEAN_CALLS"] = False``
(for instance to keep redis-py's own OpenTelemetry metrics, which this path bypasses).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import redis
import redis.asyncio
from redis.utils import HIREDIS_AVAILABLE

from django_redislua.conf import on_change, settings

hiredis_pack: Any
try:  # redis-py packs with hiredis too, when installed, after encoding each argument in Python
    from hiredis import pack_command as hiredis_pack
except ImportError:  # pragma: no cover - hiredis is an optional dependency
    hiredis_pack = None

Connection = Any  # redis.connection.AbstractConnection: its send/read methods are untyped
AsyncConnection = Any  # redis.asyncio.connection.AbstractConnection


def _packer(pool: Any) -> Any:
    """hiredis's ``pack_command`` where it packs exactly as the pool's own connections do, which
    saves redis-py's Python pass over every argument (about 2 us a call); None: ``send_command``
    packs. redis-py's sync connections pack with hiredis themselves whenever it is installed and
    no ``command_packer`` is given (text as UTF-8, whatever the pool's encoding); redis.asyncio
    packs in Python with the pool's encoder, which hiredis matches for UTF-8 text (numbers are
    ``repr`` in both)."""
    if hiredis_pack is None:
        return None
    kwargs = pool.connection_kwargs
    if isinstance(pool, redis.asyncio.ConnectionPool):
        encoding = str(kwargs.get("encoding", "utf-8")).lower().replace("_", "-")
        utf8 = encoding in ("utf-8", "utf8") and kwargs.get("encoding_errors", "strict") == "strict"
        return hiredis_pack if utf8 else None
    return hiredis_pack if HIREDIS_AVAILABLE and kwargs.get("command_packer") is None else None


def _packed(pack: Any, args: tuple[Any, ...]) -> bytes | None:
    """``args`` packed as the connection would, or None to let ``send_command`` pack them: a
    command name with a space ("SCRIPT LOAD"), which redis-py splits, or an argument hiredis
    refuses (a bytearray), which redis-py converts or reports as a DataError."""
    if pack is None or " " in args[0]:
        return None
    try:
        packed: bytes = pack(args)
    except TypeError:
        return None
    return packed


def _eligible(pool: Any) -> bool:
    return (
        settings.LEAN_CALLS
        and type(pool) in (redis.ConnectionPool, redis.BlockingConnectionPool,
                           redis.asyncio.ConnectionPool, redis.asyncio.BlockingConnectionPool)
        and getattr(pool, "cache", None) is None
        and not pool.connection_kwargs.get("cache_config")
    )


class Channel:
    """The lean path to one sync client's server. Thread-safe; see the module docstring."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self._pool = pool
        self._keep = pool.max_connections // 2
        self._pack = _packer(pool)
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
            return self._idle.pop()
        except IndexError:
            conn = self._pool.get_connection()  # connected and checked by the pool
            with self._lock:
                if len(self._kept) < self._keep:
                    self._kept.add(conn)
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
            if conn in self._kept:
                _check(conn)
            return conn.retry.call_with_retry(
                lambda: _exchange(conn, args, self._pack), lambda _error: conn.disconnect()
            )
        finally:
            self._give(conn)


def _check(conn: Connection) -> None:
    """The pool's check before a kept connection is used again: data waiting (a push message, a
    reply nobody read) or a socket the server closed means a reconnect, at the next send."""
    try:
        if conn.is_connected and conn.can_read():
            conn.disconnect()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        conn.disconnect()


def _exchange(conn: Connection, args: tuple[Any, ...], pack: Any) -> Any:
    packed = _packed(pack, args)
    if packed is None:
        conn.send_command(*args)
    else:
        conn.send_packed_command([packed])
    return conn.read_response()


class AsyncChannel:
    """The lean path to one asyncio client's server (one event loop, like the client)."""

    def __init__(self, pool: redis.asyncio.ConnectionPool) -> None:
        self._pool = pool
        self._keep = pool.max_connections // 2
        self._pack = _packer(pool)
        self._idle: list[AsyncConnection] = []
        self._kept: set[AsyncConnection] = set()

    async def _take(self) -> AsyncConnection:
        try:
            return self._idle.pop()
        except IndexError:
            conn = await self._pool.get_connection()
            if len(self._kept) < self._keep:
                self._kept.add(conn)
            return conn

    async def call(self, *args: Any) -> Any:
        conn = await self._take()
        try:
            if conn in self._kept:
                await _acheck(conn)
            return await conn.retry.call_with_retry(
                lambda: _aexchange(conn, args, self._pack), lambda _error: conn.disconnect()
            )
        finally:
            # A call cancelled mid-read leaves a disconnected connection (read_response sees
            # to that), which the next call reconnects.
            if conn in self._kept:
                self._idle.append(conn)
            else:
                await self._pool.release(conn)


async def _acheck(conn: AsyncConnection) -> None:
    """The asyncio twin of :func:`_check`."""
    try:
        if conn.is_connected and await conn.can_read():
            await conn.disconnect()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        await conn.disconnect()


async def _aexchange(conn: AsyncConnection, args: tuple[Any, ...], pack: Any) -> Any:
    packed = _packed(pack, args)
    if packed is None:
        await conn.send_command(*args)
    else:
        await conn.send_packed_command(packed)
    return await conn.read_response()


_channels: weakref.WeakKeyDictionary[Any, Channel | AsyncChannel | None] = (
    weakref.WeakKeyDictionary()
)


_last: tuple[Any, Channel | None] = (None, None)  # the last sync client asked, and its channel


@on_change
def _forget_channels() -> None:
    global _last
    _channels.clear()  # LEAN_CALLS may have changed; clients the app built are rebuilt anyway
    _last = (None, None)


def channel_for(client: Any) -> Channel | None:
    """The lean channel of a sync client, or None when the client must take the ordinary path."""
    global _last
    last = _last
    if last[0] is client:  # the process client, nearly always: no weak-dictionary lookup
        return last[1]
    try:
        known = _channels[client]
    except KeyError:
        known = None
        if type(client) is redis.Redis and _eligible(client.connection_pool):
            known = Channel(client.connection_pool)
        _channels[client] = known
    found = known if isinstance(known, Channel) else None
    _last = (client, found)
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
