"""The shared connection's writes and reads, made on a redis-py asyncio connection's own stream
and parser rather than through ``send_packed_command`` and ``read_response``.

redis-py wraps every write in ``asyncio.wait_for`` when the connection has a socket timeout
(which makes a task per write before Python 3.12) and awaits ``drain`` after it, and every
read in a timeout context of its own: for a script call on loopback, more client CPU than the
call's own work (docs/benchmarks.md, "A decision alone, on asyncio"). The shared connection
(django_redislua/pipelining.py) keeps its own timer for its reads and needs neither, so here:

- a write goes to the connection's ``StreamWriter`` at once; only when the transport could
  not hand it all to the socket (its buffer is not empty) is ``drain`` awaited, within the
  socket timeout, as redis-py does;
- a reply is read by the connection's own parser (``_read_response_from_parser``: hiredis or
  redis-py's, RESP2 or RESP3, with redis-py's push handling and error classes), the socket
  errors turned into redis-py's as ``read_response`` turns them.

What stays redis-py's: connecting (auth, TLS, ``HELLO``, ``SELECT``), the pool's check before a
connection is used, disconnecting. On a redis-py whose connections lack what this uses
(:func:`has_stream_api`), the connection's public methods are used instead.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Generator
from typing import Any

import redis
import redis.asyncio.connection

Steps = Generator[Any, Any, Any]


def has_stream_api() -> bool:
    """Feature test (docs/versions.md, "Other packages' internals"): a redis-py asyncio
    connection's stream writer (``_writer``) and the read of one reply by its parser, without
    the connection's timeout (``_read_response_from_parser``)."""
    conn = redis.asyncio.connection.Connection()
    return (hasattr(conn, "_writer") and hasattr(conn, "_reader")
            and hasattr(conn, "_read_response_from_parser"))


STREAM_API = has_stream_api()


def sent(conn: Any, data: bytes | list[bytes]) -> Steps:
    """Write ``data`` (packed commands) on ``conn``: steps for the shared connection's driver,
    yielding only when the socket did not take it all."""
    writer = conn._writer if STREAM_API else None
    if writer is None:
        yield conn.send_packed_command(data, check_health=False)
        return
    if writer.transport.is_closing():
        # Written to a closing transport, the data would be dropped in silence.
        raise redis.ConnectionError(f"Error while writing to {address(conn)}: connection closed")
    try:
        if isinstance(data, bytes):
            writer.write(data)
        else:
            writer.writelines(data)
        if writer.transport.get_write_buffer_size():
            yield asyncio.wait_for(writer.drain(), conn.socket_timeout)
    except BaseException as exc:
        # Part of it may be out: the socket is closed at once, as redis-py's own send does,
        # so that a read waiting on it ends now (its replies lost with the connection).
        writer.transport.abort()
        if isinstance(exc, TimeoutError):
            raise redis.TimeoutError("Timeout writing to socket") from None
        if isinstance(exc, OSError):
            raise redis.ConnectionError(f"Error while writing to {address(conn)}: {exc}") from exc
        raise


def closing(conn: Any) -> bool:
    """Whether ``conn``'s socket is being closed (its timer or a failed write aborted it) while
    the connection still counts as connected: nothing may be written on it any more."""
    writer = conn._writer if STREAM_API else None
    return writer is not None and writer.transport.is_closing()


def reply(conn: Any) -> Awaitable[Any]:
    """The next reply on ``conn``: an awaitable giving it, an error reply as redis-py's
    exception for it (returned, not raised), a socket's failure raised as is
    (:meth:`Deadline.failure` says what it means); no timer (the caller keeps the socket
    timeout). Cancelled, it leaves the connection as it was: the parser keeps what it had
    taken in."""
    read: Awaitable[Any] = conn._read_response_from_parser()
    return read


class Deadline:
    """A connection's socket timeout, on redis-py 8.1 and newer (the reads are
    :func:`reply`'s, with no timer of redis-py's): each reply due within the
    connection's ``socket_timeout`` of the start of its read (the timeout read again when the
    timer fires: redis-py relaxes it during a server's maintenance, also mid-read), watched by
    one timer that is re-armed only when it fires early (a reply came in the meantime), never
    per reply. Expired, it aborts the connection's transport: the read fails, and its reader
    reports a timeout (:meth:`failure`). Nothing is cancelled: the reader may be the task of
    a call alone, whose cancellation is its caller's own. One per connection (a connection
    dropped after a failure may still be read while its successor is)."""

    __slots__ = ("conn", "expired", "handle", "started")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.started = math.inf  # when the read now waiting started; inf: none waits
        self.expired: Any = None  # the transport it aborted
        self.handle: asyncio.TimerHandle | None = None

    def reading(self) -> None:
        """A read starts: its reply is due within the socket timeout."""
        timeout = self.conn.socket_timeout
        if timeout is None:
            self.started = math.inf
            return
        loop = asyncio.get_running_loop()
        self.started = loop.time()
        if self.handle is None:
            self.handle = loop.call_at(self.started + timeout, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self.handle = None
        timeout = self.conn.socket_timeout
        if self.started == math.inf or timeout is None:
            return  # nothing read now: armed again by the next read
        due = self.started + timeout
        if loop.time() < due:  # a reply came meanwhile (or the timeout grew): not yet
            self.handle = loop.call_at(due, self._check, loop)
            return
        self.started = math.inf
        writer = self.conn._writer
        if writer is not None:
            self.expired = writer.transport
            writer.transport.abort()

    def failure(self, exc: BaseException) -> BaseException:
        """What a failed read of its connection means, as redis-py's ``read_response`` says
        it: a timeout when the timer aborted the socket (not a connection opened again since:
        its transport is another), a socket's error (``OSError``) as its ``ConnectionError``,
        anything else as it is."""
        writer = self.conn._writer
        if writer is not None and writer.transport is self.expired:
            return redis.TimeoutError(f"Timeout reading from {address(self.conn)}")
        if isinstance(exc, OSError):
            return redis.ConnectionError(
                f"Error while reading from {address(self.conn)} : {exc.args}")
        return exc

    def stop(self) -> None:
        """Its connection is given back: no timer left behind."""
        self.started = math.inf
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


def address(conn: Any) -> str:
    """Where ``conn`` reads from, for a failure's message (a host and port, or a socket path)."""
    path = getattr(conn, "path", None)
    return str(path) if path else f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"
