"""A kept sync connection's exchanges made on its socket directly, with two system calls that let
go of the interpreter lock per call (its send and its receive) instead of five.

redis-py keeps a sync connection's socket timeout in Python (``settimeout``), so CPython polls
before every send and every receive, and the check before a kept connection is used again (the
pool's ``can_read``) polls once more. Each of those system calls releases the interpreter lock,
and with threads waiting for it each release wakes one: 16 threads of a bare socket ``INCR``
ran 1.7x as many calls a second without the three polls (docs/benchmarks.md, "Threads: the
socket's system calls"). So, for a connection :class:`lean.KeptConnections` keeps:

- its socket is blocking, the same timeout kept by the kernel (``SO_RCVTIMEO``,
  ``SO_SNDTIMEO``): a reply or a write later than it fails as redis-py's do
  (``redis.TimeoutError``, the connection closed); a write the kernel takes only in part is
  finished under the Python timeout, one deadline for the rest, as redis-py's ``sendall``;
- the check before each use reads ``TCP_INFO`` (``getsockopt`` keeps the lock): the connection
  still ``ESTABLISHED``, and nothing received beyond what was read here (the kernel's
  ``tcpi_bytes_received`` against a count of the bytes read, from a baseline taken when the
  socket was last checked redis-py's way). Anything else (a socket the server closed, a reply
  nobody read, a push message, a new socket, a timeout redis-py set again) sends the connection
  through redis-py's own check, then a new baseline;
- a reply is parsed by the connection's own hiredis reader, with redis-py's error classes and
  its handling of push messages.

What stays redis-py's: connecting (auth, ``HELLO``, ``SELECT``), its check whenever this one
cannot vouch, disconnecting, and every connection it owns; a kept connection given back to the
pool gets its Python timeout back. Only where :func:`direct_state` finds what this needs: a
thread other than the main one (the kernel delivers the process's signals there, and a blocking
receive a signal interrupts starts again with the kernel's whole timeout: a periodic signal
would stretch it; the main thread keeps the Python timeout's deadline), Linux's ``TCP_INFO``
with ``tcpi_bytes_received`` (4.1+), the standard library's own socket class (neither TLS nor
gevent's), TCP, redis-py's hiredis parser, no ``health_check_interval`` (redis-py pings before a
send then); elsewhere the kept connection takes redis-py's methods. Threads are where it pays:
one thread alone has no one to hand the lock to.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import sys
import threading
from typing import Any

import redis
import redis.connection
from redis.exceptions import ConnectionError as RedisConnectionError

hiredis_parsers: Any
try:  # redis-py's hiredis parser, and what its reader returns for an incomplete reply
    import redis._parsers.hiredis as hiredis_parsers
except ImportError:  # pragma: no cover - a redis-py whose parsers live elsewhere
    hiredis_parsers = None
_HiredisParser = getattr(hiredis_parsers, "_HiredisParser", None)
NOT_ENOUGH_DATA = getattr(hiredis_parsers, "NOT_ENOUGH_DATA", None)

Connection = Any  # redis-py's sync connection: its socket and parser are untyped internals

_TCP_INFO = getattr(socket, "TCP_INFO", None)
_ESTABLISHED = 1  # tcp_info.tcpi_state
_RECEIVED_AT = 128  # tcpi_bytes_received, a u64 (Linux 4.1)
_INFO_LENGTH = _RECEIVED_AT + 8  # tcp_info read through it
_RECEIVED = struct.Struct("=Q")
_FIELD = {16: "q", 8: "l"}  # struct timeval's two fields by its size: 64-bit or 32-bit
# redis-py's message for a socket the server closed (its parsers' SERVER_CLOSED_CONNECTION_ERROR)
SERVER_CLOSED = "Connection closed by server."


def has_socket_api() -> bool:
    """Feature test (docs/versions.md, "Other packages' internals"): Linux's ``TCP_INFO``, a
    redis-py sync connection's socket (``_sock``) and address (``_host_error``), and its hiredis
    parser (``_buffer``, ``_hiredis_PushNotificationType``, ``handle_push_response``, and the
    reader ``on_connect`` makes, returning ``NOT_ENOUGH_DATA`` for an incomplete reply), hiredis
    installed."""
    if (sys.platform != "linux" or _TCP_INFO is None or _HiredisParser is None
            or NOT_ENOUGH_DATA is None):
        return False
    try:
        parser = _HiredisParser(1024)
    except redis.RedisError:  # hiredis is not installed
        return False
    return (hasattr(parser, "_buffer") and hasattr(parser, "_hiredis_PushNotificationType")
            and callable(getattr(parser, "handle_push_response", None))
            and callable(getattr(parser, "on_connect", None))
            and hasattr(redis.connection.Connection(), "_sock")
            and callable(getattr(redis.connection.Connection, "_host_error", None)))


SOCKET_API = has_socket_api()


class Direct:
    """One kept connection's socket as this module drives it (see the module docstring)."""

    __slots__ = ("address", "buffer", "parser", "reader", "received", "sock", "timeout")

    def __init__(self, conn: Connection, sock: socket.socket, timeout: float | None,
                 received: int) -> None:
        self.sock, self.timeout, self.received = sock, timeout, received
        self.parser = conn._parser
        self.reader = self.parser._reader
        self.buffer = self.parser._buffer
        self.address = conn._host_error()

    def vouches(self, conn: Connection) -> bool:
        """Whether ``conn`` may be used as it is, by this thread: the same socket, still
        blocking, the timeout redis-py means, still established, nothing received that was
        not read. False: redis-py's check decides."""
        sock = conn._sock
        if (sock is not self.sock or sock.gettimeout() is not None or self.reader.has_data()
                or self.parser._socket_timeout != self.timeout or _on_main_thread()):
            return False
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _INFO_LENGTH)  # type: ignore[arg-type]
        except OSError:  # closed by another thread meanwhile
            return False
        return (info[0] == _ESTABLISHED
                and _RECEIVED.unpack_from(info, _RECEIVED_AT)[0] == self.received)

    def send(self, chunks: list[bytes] | tuple[bytes, ...]) -> None:
        """Packed commands written; a failure leaves the connection for the caller to close.
        Each chunk in one ``send``, the common case; what the kernel did not take at once is
        written by ``sendall`` under the Python timeout, whose deadline covers the whole rest
        (the kernel's ``SO_SNDTIMEO`` starts again with every part sent)."""
        sock = self.sock
        try:
            for n, chunk in enumerate(chunks):
                sent = sock.send(chunk)
                if sent < len(chunk):
                    self._send_rest([memoryview(chunk)[sent:], *chunks[n + 1:]])
                    break
        except (BlockingIOError, TimeoutError) as exc:  # the timeout ran out
            raise redis.TimeoutError(f"Timeout writing to socket{self._shared()}") from exc
        except OSError as exc:
            raise RedisConnectionError(
                f"Error {exc.errno} while writing to socket. {exc.strerror}.") from exc
        if sock.fileno() < 0:  # closed by another thread: the write may have gone to a socket
            # that took its descriptor since; nothing of ours is read from it
            raise RedisConnectionError("Error while writing to socket: closed while in use.")

    def _send_rest(self, rest: list[Any]) -> None:
        sock = self.sock
        sock.settimeout(self.timeout)
        try:
            for chunk in rest:
                sock.sendall(chunk)
        finally:
            with contextlib.suppress(OSError):
                sock.settimeout(None)

    def reply(self) -> Any:
        """One reply, an error reply as its exception object (not raised), as redis-py's parser
        gives it; a push message is handled by the parser, as there, and the next read."""
        reader = self.reader
        while True:
            reply = reader.gets()
            while reply is NOT_ENOUGH_DATA:
                self._received()
                reply = reader.gets()
            push = self.parser._hiredis_PushNotificationType
            if push is None or not isinstance(reply, push):
                break
            self.parser.handle_push_response(reply)
            retimed(self)  # a maintenance notice may have set another timeout
        if isinstance(reply, RedisConnectionError):
            raise reply
        if isinstance(reply, list) and reply and isinstance(reply[0], RedisConnectionError):
            raise reply[0]
        return reply

    def _received(self) -> None:
        sock = self.sock
        try:
            count = sock.recv_into(self.buffer)
        except (BlockingIOError, TimeoutError) as exc:  # SO_RCVTIMEO ran out
            raise redis.TimeoutError(
                f"Timeout reading from {self.address}{self._shared()}") from exc
        except OSError as exc:
            raise RedisConnectionError(
                f"Error while reading from {self.address} : {exc.args}") from exc
        if sock.fileno() < 0:  # closed by another thread: what came may be another socket's
            # that took its descriptor meanwhile, never a reply to this call
            raise RedisConnectionError(
                f"Error while reading from {self.address}: closed while in use.")
        if not count:
            raise RedisConnectionError(SERVER_CLOSED)
        self.received += count
        self.reader.feed(self.buffer, 0, count)

    def _shared(self) -> str:
        """What a timeout's message adds when the socket turned non-blocking under this
        connection: then the kernel did not wait, another process sharing the socket (a
        forked child) changed it."""
        try:
            blocking = not fcntl.fcntl(self.sock.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        except (OSError, ValueError):  # closed meanwhile (descriptor -1)
            return ""
        return "" if blocking else (" (not waited for: the socket was made non-blocking by another "
                                    "process sharing it)")

    def restore(self, conn: Connection) -> None:
        """The socket's Python timeout back, the one redis-py means now, for redis-py's own
        methods (the connection leaves the kept ones, or this module stops driving it)."""
        if conn._sock is self.sock and self.sock.gettimeout() is None:
            with contextlib.suppress(OSError):  # closed by another thread: nothing to restore
                self.sock.settimeout(getattr(self.parser, "_socket_timeout", self.timeout))


def _on_main_thread() -> bool:
    """The main thread is where the kernel delivers a process's signals: a blocking receive
    interrupted by one is started again with the whole SO_RCVTIMEO (PEP 475), so a periodic
    signal (a profiler's, an ``ITIMER_REAL``) would keep a silent server's call waiting past
    the timeout. There the socket keeps redis-py's Python timeout, a deadline over the
    retries; threads, where many calls contend for the lock, take this module."""
    return threading.get_ident() == threading.main_thread().ident


def applies_here() -> bool:
    """Whether this thread's calls on a kept connection may go on its socket: the feature is
    there (:data:`SOCKET_API`) and this is not the main thread (:func:`_on_main_thread`)."""
    return SOCKET_API and not _on_main_thread()


def mark(conn: Connection) -> tuple[socket.socket, int] | None:
    """``conn``'s socket and the bytes its kernel has received so far, taken before redis-py's
    check: a reply landing after the mark is counted against it, one landing before is seen by
    the check. None where this module does not apply."""
    sock = conn._sock
    if not (SOCKET_API and type(sock) is socket.socket and socket.socket.__module__ == "socket"
            and sock.family in (socket.AF_INET, socket.AF_INET6)):
        return None
    received = kernel_received(sock)
    return None if received is None else (sock, received)


def kernel_received(sock: socket.socket) -> int | None:
    """The bytes the kernel has received on TCP socket ``sock`` (read or not); None on a
    kernel before 4.1 (no ``tcpi_bytes_received``) or a closed socket."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _INFO_LENGTH)  # type: ignore[arg-type]
    except OSError:
        return None
    if len(info) < _INFO_LENGTH:
        return None
    return int(_RECEIVED.unpack_from(info, _RECEIVED_AT)[0])


def direct_state(conn: Connection, marked: tuple[socket.socket, int] | None) -> Direct | None:
    """``conn``, just checked by redis-py (connected, nothing waiting), taken over, or None
    where this module does not apply (its socket then left as redis-py set it). ``marked``:
    :func:`mark` before that check; a socket opened since (redis-py reconnected) has sent
    nothing of ours, so its count is taken now."""
    parser = conn._parser
    if (type(parser) is not _HiredisParser or getattr(parser, "_reader", None) is None
            or not hasattr(parser, "_socket_timeout") or conn.health_check_interval
            or _on_main_thread()):
        return None
    sock = conn._sock
    if marked is None or marked[0] is not sock:
        marked = mark(conn)
        if marked is None:
            return None
    timeout = parser._socket_timeout  # what redis-py means now (relaxed during maintenance)
    if timeout == 0:
        return None  # a non-blocking socket is not redis-py's way: leave it be
    try:
        _blocking(sock, timeout)
    except (OSError, ValueError, OverflowError, struct.error):
        return None  # closed by another thread meanwhile, or a timeout the kernel refuses
    return Direct(conn, sock, timeout, marked[1])


def retimed(state: Direct) -> None:
    """A timeout redis-py set again (a maintenance notice, read mid-reply) taken over."""
    timeout = state.parser._socket_timeout
    if timeout != state.timeout or state.sock.gettimeout() is not None:
        _blocking(state.sock, timeout)
        state.timeout = timeout


def _blocking(sock: socket.socket, timeout: float | None) -> None:
    """``sock`` blocking, ``timeout`` kept by the kernel. The kernel's own timeouts first: if
    it refuses them, the socket keeps its Python timeout (never blocking without one)."""
    if timeout is None:
        seconds, micros = 0, 0  # none: block as long as it takes, as redis-py would
    else:
        seconds, micros = divmod(max(1, round(timeout * 1_000_000)), 1_000_000)  # 0: none
    # struct timeval's size as this kernel reads it (two longs; 64-bit fields under a 32-bit
    # time64 ABI, where SO_RCVTIMEO is the _NEW option)
    field = _FIELD.get(len(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)))
    if field is None:
        raise ValueError("a struct timeval of a size this module does not know")
    value = struct.pack(f"={field}{field}", seconds, micros)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    sock.settimeout(None)
