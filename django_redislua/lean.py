"""The lean transport's connections: some kept checked out of the pool between calls.

The reference transport (:class:`django_redislua.transport.PoolSource`) checks a connection out
of the pool for every exchange, as redis-py's ``execute_command`` does: a lock, the pool's
readability check, and on redis-py 8 its observability hooks, which on loopback cost about as
much as the round trip. A decision is one script call per request, so with ``LEAN_CALLS`` a
server's transport keeps up to half of its pool's connections checked out (rounded down: none
of a pool of one), reusing them call after call, and packs commands with hiredis when redis-py
would. Every guarantee of the reference path is kept:

- a command is sent once: no retry after the send, as on every transport;
- timeouts: the connections are the pool's own, with its socket timeouts;
- a kept connection the server closed (a restart, an idle timeout, ``CLIENT KILL``) or that
  has data waiting (a reply nobody read, a push message) is found before use by the pool's
  own check (``can_read``) and reconnected before the send;
- fork safety: a child process drops the connections it inherited;
- pool limits: kept connections count against the pool's ``max_connections``, and the other
  half always remains for the project's own use of the pool (a cache's);
- a lifecycle: :meth:`KeptConnections.close` (settings changed, ``transport.close()``) and
  garbage collection give every kept connection back to its pool.

Only on redis-py versions the suite proves this on (:data:`SUPPORTED`: 8.1 and newer; the
sync readiness check needs ``Connection.is_connected``, new in 8.0, and 8.0's pools handled
server restarts differently), whose connections have what :func:`has_connection_api` checks:
elsewhere, and with ``LEAN_CALLS = False`` (for instance to keep
redis-py's own OpenTelemetry metrics), the reference transport is used, silently. Plain pools
only (``ConnectionPool``, ``BlockingConnectionPool``, sync or asyncio, without client-side
caching): Sentinel's and cluster nodes' pools of other classes take the reference path.
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.connection
import redis.connection
import redis.utils

from django_redislua import sockets
from django_redislua.conf import settings
from django_redislua.connection import TORN_DOWN, checkout
from django_redislua.exchange import PoolSource

hiredis_pack: Any
try:  # redis-py packs with hiredis too, when installed, after encoding each argument in Python
    from hiredis import pack_command as hiredis_pack
except ImportError:  # pragma: no cover - hiredis is an optional dependency
    hiredis_pack = None

Connection = Any  # redis-py's connection classes: their send/read methods are untyped
Command = tuple[Any, ...]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


# The redis-py versions the lean connections are proven on (tox envs redis8 and newest).
LEAN_SINCE = (8, 1)


def has_connection_api() -> bool:
    """Feature test (docs/versions.md, "Other packages' internals"): what the kept connections
    call on redis-py's connections, sync and asyncio, beyond the pool's public API."""
    needed = ("is_connected", "can_read", "connect", "disconnect", "send_packed_command",
              "pack_commands")
    return all(hasattr(cls, name) for cls in (redis.connection.Connection,
                                              redis.asyncio.connection.Connection)
               for name in needed)


SUPPORTED = _version(redis.__version__) >= LEAN_SINCE and has_connection_api()
# Whether redis-py's sync connections pack with hiredis (then hiredis packs here too, saving
# redis-py's pass): its module constant. Missing: redis-py packs, as without hiredis.
HIREDIS_AVAILABLE: bool = getattr(redis.utils, "HIREDIS_AVAILABLE", False) is True
PLAIN_POOLS = (redis.ConnectionPool, redis.BlockingConnectionPool,
               redis.asyncio.ConnectionPool, redis.asyncio.BlockingConnectionPool)


def plain(pool: Any) -> bool:
    """A plain pool (sync or asyncio) without client-side caching: one whose connections may be
    kept out of it between calls (here, and by django_redislua/pipelining.py)."""
    return (type(pool) in PLAIN_POOLS and getattr(pool, "cache", None) is None
            and not pool.connection_kwargs.get("cache_config"))


def eligible(pool: Any) -> bool:
    """Whether a transport to ``pool``'s server keeps connections (see the module docstring)."""
    return SUPPORTED and settings.LEAN_CALLS and plain(pool)


# The pool's own check of an asyncio connection it hands out: ``can_read`` since redis-py 8.0,
# which deprecates ``can_read_destructive`` (the only one before).
ASYNC_CAN_READ = ("can_read" if hasattr(redis.asyncio.connection.Connection, "can_read")
                  else "can_read_destructive")


async def arefreshed(conn: Connection) -> None:
    """Check a kept asyncio connection as the pool checks one it hands out: data waiting (a
    push message, a reply nobody read) or a socket the server closed means a reconnect, before
    anything is sent on it (a failure here sent nothing). So does a connection redis-py marked
    for one (a cluster's table changed, a server's maintenance): the pool would reconnect it as
    it comes back, which a kept connection never does."""
    try:
        if conn.is_connected and (_marked_for_reconnect(conn)
                                  or await getattr(conn, ASYNC_CAN_READ)()):
            await conn.disconnect()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        await conn.disconnect()
    if not conn.is_connected:
        await conn.connect()


def _marked_for_reconnect(conn: Connection) -> bool:
    """redis-py 7.1 and newer mark a connection in use for a reconnect on release."""
    marked = getattr(conn, "should_reconnect", None)
    return marked is not None and marked() is True


def packer(pool: Any) -> Any:
    """hiredis's ``pack_command`` where it packs exactly as the pool's own connections do, which
    saves redis-py's Python pass over every argument (about 2 us a call); None: redis-py packs.
    redis-py's sync connections pack with hiredis themselves whenever it is installed and no
    ``command_packer`` is given (text as UTF-8, whatever the pool's encoding); redis.asyncio
    packs in Python with the pool's encoder, which hiredis matches for UTF-8 text (numbers are
    ``repr`` in both)."""
    if hiredis_pack is None:
        return None
    kwargs = pool.connection_kwargs
    if issubclass(pool.connection_class, redis.asyncio.connection.AbstractConnection):
        encoding = str(kwargs.get("encoding", "utf-8")).lower().replace("_", "-")
        utf8 = encoding in ("utf-8", "utf8") and kwargs.get("encoding_errors", "strict") == "strict"
        return hiredis_pack if utf8 else None
    return hiredis_pack if HIREDIS_AVAILABLE and kwargs.get("command_packer") is None else None


def packed(pack: Any, args: Command) -> bytes | None:
    """``args`` packed as the connection would, or None to let redis-py pack them: a command
    name with a space ("SCRIPT LOAD"), which redis-py splits, or an argument hiredis refuses
    (a bytearray), which redis-py converts or reports as a DataError."""
    if pack is None or " " in str(args[0]):
        return None
    try:
        packed: bytes = pack(args)
    except TypeError:
        return None
    return packed


def _give_back(pool: Any, idle: list[Connection], kept: set[Connection],
               direct: dict[Connection, sockets.Direct], owner: int) -> None:
    """Return every idle kept connection to ``pool`` (a sync pool's ``release``). In a forked
    child (``owner`` is the pid they were kept in), their sockets are the parent's too: none
    gets its Python timeout back, which would make the socket non-blocking for the parent
    driving it (redis-py's pool closes the child's copies without shutting them down)."""
    mine = os.getpid() == owner
    while idle:
        conn = idle.pop()
        kept.discard(conn)
        try:
            if mine:
                _restored(conn, direct)
        finally:
            pool.release(conn)


def _restored(conn: Connection, direct: dict[Connection, sockets.Direct]) -> None:
    """A connection leaving the kept ones as redis-py set it up (its socket's Python
    timeout)."""
    state = direct.pop(conn, None)
    if state is not None:
        state.restore(conn)


class KeptConnections:
    """A sync server's connections for the lean transport: ``take`` one, send on it, ``give``
    it back. Thread-safe; see the module docstring. A kept connection's exchanges are made on
    its socket directly where :mod:`django_redislua.sockets` applies."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self.pool = pool
        self._checkout = checkout(pool)
        self._keep = pool.max_connections // 2
        self._pack = packer(pool)
        self._closed = False
        self._reset()

    def _reset(self) -> None:
        self._idle: list[Connection] = []  # list.pop/append are atomic: no lock on the hot path
        self._kept: set[Connection] = set()
        self._direct: dict[Connection, sockets.Direct] = {}  # kept ones driven by sockets.py
        self._lock = threading.Lock()
        pid = os.getpid()
        # Collected without close(): the kept connections still go back to the pool.
        self._finalizer = weakref.finalize(self, _give_back, self.pool, self._idle, self._kept,
                                           self._direct, pid)
        # Last: in a forked child, a thread that finds its pid here finds the new lists too,
        # never the parent's connections (whose sockets the parent still uses: a timeout set
        # on one here would make the parent's socket non-blocking under it).
        self._pid = pid

    def take(self) -> Connection:
        if self._pid != os.getpid():  # a forked child: the parent's sockets are not ours
            self._finalizer.detach()
            self._reset()
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._checkout()  # connected and checked by the pool
            with self._lock:
                kept = len(self._kept) < self._keep and not self._closed
                if kept:
                    self._kept.add(conn)
            if kept and sockets.applies_here():
                self._taken_over(conn, None)
            return conn
        state = self._direct.get(conn)
        if state is not None and state.vouches(conn) and not _marked_for_reconnect(conn):
            return conn
        # The main thread takes redis-py's methods (sockets._on_main_thread): nothing of
        # sockets.py on its path, but a socket driven by another thread given its timeout back.
        driven = sockets.applies_here()
        marked = sockets.mark(conn) if driven else None
        try:
            # The pool's check before a kept connection is used again: data waiting (a push
            # message, a reply nobody read) or a socket the server closed means a reconnect;
            # so does a mark for one (see arefreshed).
            if conn.is_connected and (_marked_for_reconnect(conn) or conn.can_read()):
                conn.disconnect()
        except (redis.ConnectionError, redis.TimeoutError, OSError, ValueError, *TORN_DOWN):
            # TORN_DOWN, ValueError: another thread closed it meanwhile (redis-py polls the
            # socket object, whose descriptor is then -1); nothing was sent: a new one
            conn.disconnect()
        if not conn.is_connected:
            try:
                conn.connect()  # before the send: a failure here sent nothing
            except BaseException:
                self._idle.append(conn)
                raise
        if driven:
            self._taken_over(conn, marked)
        else:
            _restored(conn, self._direct)
        return conn

    def _taken_over(self, conn: Connection, marked: tuple[Any, int] | None) -> None:
        """``conn`` driven on its socket from now on where sockets.py applies; else as
        redis-py set it up (its socket's Python timeout back, if this drove it before)."""
        try:
            state = sockets.direct_state(conn, marked)
        except BaseException:
            self._direct.pop(conn, None)
            self.give(conn)  # not lost to the pool
            raise
        if state is None:
            _restored(conn, self._direct)
        else:
            self._direct[conn] = state

    def give(self, conn: Connection) -> None:
        if conn in self._kept and not self._closed:
            self._idle.append(conn)
            return
        with self._lock:
            self._kept.discard(conn)
        try:
            _restored(conn, self._direct)
        finally:
            self.pool.release(conn)

    def write(self, conn: Connection, commands: Sequence[Command]) -> None:
        data = packed(self._pack, commands[0]) if len(commands) == 1 else None
        state = self._direct.get(conn)
        if state is not None:
            state.send((data,) if data is not None else conn.pack_commands(commands))
        elif data is not None:
            conn.send_packed_command([data])
        else:
            PoolSource.write(conn, commands)

    def read_one(self, conn: Connection) -> Any:
        state = self._direct.get(conn)
        return conn.read_response() if state is None else state.reply()

    def close(self) -> None:
        """Give every kept connection back to the pool (one in use goes back when its call
        ends); connections taken after this are borrowed per call."""
        self._closed = True
        if self._pid != os.getpid():  # a forked child: the parent's are not its own to give
            self._finalizer.detach()  # (nor its lock, which a parent's thread may have held)
            self._reset()
        with self._lock:
            _give_back(self.pool, self._idle, self._kept, self._direct, self._pid)


class AsyncKeptConnections:
    """The asyncio twin of :class:`KeptConnections`, for one event loop's pool."""

    def __init__(self, pool: redis.asyncio.ConnectionPool) -> None:
        self.pool = pool
        self._checkout = checkout(pool)
        self._keep = pool.max_connections // 2
        self._pack = packer(pool)
        self._idle: list[Connection] = []
        self._kept: set[Connection] = set()

    async def take(self) -> Connection:
        if not self._idle:
            conn = await self._checkout()
            if len(self._kept) < self._keep:
                self._kept.add(conn)
            return conn
        conn = self._idle.pop()
        try:
            await arefreshed(conn)
        except BaseException:
            self._idle.append(conn)
            raise
        return conn

    def give(self, conn: Connection) -> Any:
        """Back to the kept ones (None), or the pool's ``release`` to await."""
        if conn in self._kept:
            self._idle.append(conn)
            return None
        return self.pool.release(conn)

    def pack(self, conn: Connection, commands: Sequence[Command]) -> Any:
        if len(commands) == 1:
            data = packed(self._pack, commands[0])
            if data is not None:
                return data
        return conn.pack_commands(commands)
