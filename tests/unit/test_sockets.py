"""django_redislua/sockets.py's logic on a loopback TCP pair, the far end scripted by the test
(no Redis): the kernel's counts it relies on, the socket it sets up, the reply read across
partial reads, push messages, error replies, a peer that closes, a reply later than the
timeout.

A redis-py connection object is used as it is after its handshake (its socket and hiredis
parser), without connecting: the test holds the server's end.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.connection
from redis.exceptions import ResponseError

from django_redislua import sockets

pytestmark = pytest.mark.skipif(not sockets.SOCKET_API, reason="Linux TCP_INFO and hiredis only")

TIMEOUT = 0.2


@pytest.fixture(autouse=True)
def off_the_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests run on the main thread, which keeps redis-py's methods in production (see
    sockets._on_main_thread and test_the_main_thread_is_left_to_redis_py): here the socket
    path runs as on any other thread."""
    monkeypatch.setattr(sockets, "_on_main_thread", lambda: False)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected loopback TCP pair: (the client's end, the scripted server's end)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    with client, server:
        yield client, server


def connection(sock: socket.socket, protocol: int = 3, **options: Any) -> Any:
    """A redis-py connection as its handshake leaves it, on ``sock``."""
    timeout = options.pop("socket_timeout", TIMEOUT)
    conn = redis.connection.Connection(protocol=protocol, socket_timeout=timeout, **options)
    sock.settimeout(timeout)
    conn._sock = sock
    conn._parser.on_connect(conn)
    return conn


def taken(conn: Any) -> sockets.Direct:
    state = sockets.direct_state(conn, sockets.mark(conn))
    assert state is not None
    return state


def received_by_kernel(sock: socket.socket) -> int:
    marked = sockets.kernel_received(sock)
    assert marked is not None
    return marked


def until(condition: Any) -> None:
    """Wait (bounded) for something the kernel does on its own: loopback delivery."""
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_the_kernel_counts_bytes_received_where_this_reads_them(
        pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    before = received_by_kernel(client)
    server.sendall(b"x" * 1000)
    until(lambda: received_by_kernel(client) == before + 1000)
    info = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 136)
    assert info[0] == 1  # ESTABLISHED
    server.close()
    until(lambda: client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 136)[0] != 1)


@pytest.mark.parametrize(("timeout", "timeval"), [
    (0.2, (0, 200_000)), (2.5, (2, 500_000)), (1e-9, None), (None, (0, 0))])
def test_the_socket_blocks_with_the_timeout_kept_by_the_kernel(
        pair: tuple[socket.socket, socket.socket], timeout: float | None,
        timeval: tuple[int, int] | None) -> None:
    """``timeval`` None: the least the kernel keeps (its clock's tick), never none at all."""
    client, _ = pair
    conn = connection(client, socket_timeout=timeout)
    state = taken(conn)
    assert client.gettimeout() is None and state.timeout == timeout
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        kept = struct.unpack("@ll", client.getsockopt(socket.SOL_SOCKET, option, 16))
        assert kept == timeval if timeval is not None else (0, 0) < kept < (0, 100_000)
    state.restore(conn)
    assert client.gettimeout() == timeout


def test_vouches_only_for_what_it_read(pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    conn = connection(client)
    state = taken(conn)
    assert state.vouches(conn)
    state.send((b"*1\r\n$4\r\nPING\r\n",))
    assert server.recv(100) == b"*1\r\n$4\r\nPING\r\n"
    server.sendall(b"+PONG\r\n")
    assert state.reply() == b"PONG"
    assert state.vouches(conn)
    server.sendall(b"+STRAY\r\n")  # a reply nobody asked for: never the answer to a later call
    until(lambda: not state.vouches(conn))
    assert conn.can_read()  # what redis-py's check then finds


@pytest.mark.parametrize("change", ["timeout set again", "new socket", "closed by the server",
                                    "data buffered in the reader"])
def test_anything_unexpected_goes_to_redis_pys_check(
        pair: tuple[socket.socket, socket.socket], change: str) -> None:
    client, server = pair
    conn = connection(client)
    state = taken(conn)
    if change == "timeout set again":
        conn.update_current_socket_timeout(1.5)  # what a maintenance notice does
    elif change == "new socket":
        conn._sock = socket.socket()
    elif change == "closed by the server":
        server.close()
        until(lambda: client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 136)[0] != 1)
    else:
        state.reader.feed(b"+OK\r\n")
    assert not state.vouches(conn)
    if change == "new socket":
        conn._sock.close()


def test_a_timeout_set_again_is_taken_over(pair: tuple[socket.socket, socket.socket]) -> None:
    client, _ = pair
    conn = connection(client)
    state = taken(conn)
    conn.update_current_socket_timeout(1.5)
    assert not state.vouches(conn)
    again = sockets.direct_state(conn, sockets.mark(conn))
    assert again is not None and again.timeout == 1.5 and client.gettimeout() is None
    again.restore(conn)
    assert client.gettimeout() == 1.5


def test_a_timeout_redis_py_sets_back_to_none_is_taken_over(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """A relaxed timeout put back to none (``update_current_socket_timeout(-1)`` on a
    connection without ``socket_timeout``): redis-py's parser says so, the socket does not."""
    client, _ = pair
    conn = connection(client)
    conn.socket_timeout = None
    conn.update_current_socket_timeout(0.2)
    state = taken(conn)
    assert state.timeout == 0.2
    conn.update_current_socket_timeout(-1)  # back to the connection's own: none
    assert client.gettimeout() is None  # what the socket alone would not tell
    assert not state.vouches(conn)
    again = sockets.direct_state(conn, sockets.mark(conn))
    assert again is not None and again.timeout is None
    assert struct.unpack("@ll", client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16)) \
        == (0, 0)


def test_the_main_thread_is_left_to_redis_py(
        pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    client, _ = pair
    conn = connection(client)
    monkeypatch.undo()  # the real test of the thread
    assert sockets.direct_state(conn, sockets.mark(conn)) is None
    assert client.gettimeout() == TIMEOUT
    found: list[Any] = []
    worker = threading.Thread(target=lambda: found.append(
        sockets.direct_state(conn, sockets.mark(conn))))
    worker.start()
    worker.join(10)
    assert found[0] is not None and client.gettimeout() is None
    assert not found[0].vouches(conn)  # on the main thread again: redis-py's check


def test_a_write_the_kernel_takes_in_part_is_finished_within_the_timeout(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """A peer that reads slowly (64 KiB every 20 ms): the kernel takes part of a large write
    at a time; the whole write fails on one deadline, as redis-py's ``sendall`` does (the
    kernel's SO_SNDTIMEO starts again with each part that goes through, so a write making
    some progress in every window would never time out)."""
    client, server = pair
    conn = connection(client)
    state = taken(conn)
    stop = threading.Event()

    def read_slowly() -> None:
        server.settimeout(0.05)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                server.recv(64 << 10)
            time.sleep(0.02)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    started = time.monotonic()
    try:
        with pytest.raises(redis.TimeoutError, match="Timeout writing"):
            state.send((b"x" * (256 << 20),))  # about 80 s at that pace
    finally:
        stop.set()
        reader.join()
    assert time.monotonic() - started < 25 * TIMEOUT  # one deadline, not one per part
    assert client.gettimeout() is None  # back to blocking for the caller's clean-up


def test_a_reply_in_pieces(pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    conn = connection(client)
    state = taken(conn)
    before = state.received
    reply = b"*3\r\n:1\r\n:2\r\n$5\r\nhello\r\n"

    def dribble() -> None:  # a byte at a time, each read before the next is sent
        for n in range(len(reply)):
            server.sendall(reply[n:n + 1])
            until(lambda n=n: state.received > before + n)

    writer = threading.Thread(target=dribble)
    writer.start()
    assert state.reply() == [1, 2, b"hello"]
    writer.join()
    assert state.received == before + len(reply)
    assert state.vouches(conn)


def test_an_error_reply_is_returned_as_redis_pys_exception(
        pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    conn = connection(client)  # kept: collected, it would close the socket
    state = taken(conn)
    server.sendall(b"-NOSCRIPT No matching script.\r\n")
    error = state.reply()
    assert isinstance(error, redis.exceptions.NoScriptError)
    server.sendall(b"-WRONGTYPE Operation against a key\r\n")
    assert isinstance(state.reply(), ResponseError)


def test_a_connection_error_reply_is_raised(pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    conn = connection(client)  # kept: collected, it would close the socket
    state = taken(conn)
    server.sendall(b"-LOADING Redis is loading the dataset in memory\r\n")
    with pytest.raises(redis.exceptions.BusyLoadingError):
        state.reply()


def test_a_push_message_is_handled_then_the_reply_read(
        pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    conn = connection(client)
    state = taken(conn)
    pushed: list[Any] = []
    conn._parser.invalidation_push_handler_func = pushed.append
    server.sendall(b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n:7\r\n")
    assert state.reply() == 7
    assert pushed == [[b"invalidate", [b"k"]]]
    assert state.vouches(conn)


def test_the_server_closing_is_a_connection_error(
        pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    conn = connection(client)  # kept: collected, it would close the socket
    state = taken(conn)
    server.close()
    with pytest.raises(redis.ConnectionError, match="Connection closed by server"):
        state.reply()


def test_a_late_reply_is_a_timeout(pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    conn = connection(client)  # kept: collected, it would close the socket
    state = taken(conn)
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError, match="Timeout reading from"):
        state.reply()
    assert time.monotonic() - started >= TIMEOUT * 0.9  # the kernel waited the timeout out
    server.sendall(b":1\r\n")  # too late: whoever reads next must not take it (the caller
    # closes the connection on any failure; here the count says so)
    until(lambda: received_by_kernel(client) > state.received)


def test_a_write_to_a_reset_connection_is_a_connection_error(
        pair: tuple[socket.socket, socket.socket]) -> None:
    client, server = pair
    conn = connection(client)  # kept: collected, it would close the socket
    state = taken(conn)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    server.close()  # a reset, not a FIN
    until(lambda: client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 136)[0] != 1)
    with pytest.raises(redis.ConnectionError, match="while writing to socket"):
        for _ in range(3):  # the first write may still be taken by the kernel
            state.send((b"*1\r\n$4\r\nPING\r\n",))


@pytest.mark.parametrize("what", ["unix socket", "health checks", "python parser"])
def test_not_taken_over(what: str, tmp_path: Any) -> None:
    if what == "unix socket":
        path = str(tmp_path / "s")
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(path)
            listener.listen(1)
            client = socket.socket(socket.AF_UNIX)
            client.connect(path)
            with client:
                assert sockets.mark(connection(client)) is None
        return
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with socket.create_connection(listener.getsockname()) as client:
            options: dict[str, Any] = (
                {"health_check_interval": 30} if what == "health checks"
                else {"parser_class": redis.connection._RESP3Parser})
            conn = connection(client, **options)
            assert sockets.direct_state(conn, sockets.mark(conn)) is None
            assert client.gettimeout() == TIMEOUT  # left as redis-py set it


def test_a_socket_made_non_blocking_by_another_process_says_so(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """A forked child sharing the socket that sets a Python timeout on its copy makes it
    non-blocking for both: the read then fails at once, and its message says why."""
    import fcntl
    import os

    client, _ = pair
    conn = connection(client)
    state = taken(conn)
    flags = fcntl.fcntl(client.fileno(), fcntl.F_GETFL)
    fcntl.fcntl(client.fileno(), fcntl.F_SETFL, flags | os.O_NONBLOCK)  # as the child would
    with pytest.raises(redis.TimeoutError, match="made non-blocking by another process"):
        state.reply()


def test_restoring_a_socket_another_thread_closed_is_nothing(
        pair: tuple[socket.socket, socket.socket]) -> None:
    """A pool's ``disconnect`` from another thread may close the socket as the connection goes
    back: giving it back must not fail (the pool would never get it back)."""
    client, _ = pair
    conn = connection(client)
    state = taken(conn)
    client.close()
    state.restore(conn)
