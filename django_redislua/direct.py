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
    except TimeoutError:
        raise redis.TimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        raise redis.ConnectionError(f"Error while writing to {address(conn)}: {exc}") from exc


def reply(conn: Any) -> Awaitable[Any]:
    """The next reply on ``conn``: an awaitable giving it, an error reply as redis-py's
    exception for it (returned, not raised), a socket's failure raised as is
    (:func:`failure`); no timer (the caller keeps the socket timeout). Cancelled, it leaves
    the connection as it was: the parser keeps what it had taken in."""
    read: Awaitable[Any] = conn._read_response_from_parser()
    return read


def failure(conn: Any, exc: BaseException) -> BaseException:
    """What a failed read means, as redis-py's ``read_response`` says it: a socket's error
    (``OSError``) as its ``ConnectionError``."""
    if isinstance(exc, OSError):
        return redis.ConnectionError(f"Error while reading from {address(conn)} : {exc.args}")
    return exc


def address(conn: Any) -> str:
    """Where ``conn`` reads from, for a failure's message (a host and port, or a socket path)."""
    path = getattr(conn, "path", None)
    return str(path) if path else f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"
