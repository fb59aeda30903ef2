"""Automatic pipelining's shared connection (django_redislua/pipelining.py), on a scripted
connection: what is written when (one write per loop iteration, a batch at most MAX_BATCH
commands), whose reply goes to whom (in order, a cancelled caller's dropped), and what a
failure means for each call (written: a reply lost, never sent again; not written: sent on the
next connection; the connection could not be opened: unsent)."""

from __future__ import annotations

import asyncio
import gc
import math
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError

from django_redislua import direct, pipelining
from django_redislua.pipelining import MAX_BATCH, SharedConnection, shares
from django_redislua.protocol import was_unsent


class ScriptedTransport:
    """The asyncio transport under a connection's stream writer (redis-py 8.1 and newer, where
    the shared connection writes and reads on the stream, django_redislua/direct.py)."""

    def __init__(self, conn: ScriptedConnection) -> None:
        self.conn = conn
        self.aborted = False

    def is_closing(self) -> bool:
        return self.aborted

    def get_write_buffer_size(self) -> int:
        """Not empty while a write hangs (the socket took none of it) or is about to fail."""
        conn = self.conn
        hangs = conn.write_gate is not None and not conn.write_gate.is_set()
        return int(hangs or conn.failing_write is not None or not conn.is_connected)

    def abort(self) -> None:
        """As asyncio's: closing at once, the reader told in a later iteration of the loop
        (``connection_lost`` is called soon), after what was already in."""
        self.aborted = True
        asyncio.get_running_loop().call_soon(
            self.conn.replies.put_nowait, redis.ConnectionError("Connection closed by server."))


class ScriptedWriter:
    """A connection's ``StreamWriter``: a write goes to the transport at once; ``drain``
    waits while the transport holds some of it, and fails when the connection did."""

    def __init__(self, conn: ScriptedConnection) -> None:
        self.conn = conn
        self.transport = ScriptedTransport(conn)

    def writelines(self, packed: Any) -> None:
        if self.conn.failing_write is None:
            self.conn.writes.append(packed)

    async def drain(self) -> None:
        conn = self.conn
        if conn.failing_write is not None:
            conn.is_connected = False
            raise conn.failing_write
        if conn.write_gate is not None:
            await conn.write_gate.wait()
        if not conn.is_connected:
            raise redis.ConnectionError("closed while writing")


class ScriptedConnection:
    """A redis-py asyncio connection as the shared connection uses it: what is written is
    recorded (one entry per write); each reply is given by the test, in order. With
    ``streams`` (the pool's), it has redis-py 8.1's stream writer and parser read, which the
    shared connection then uses instead of ``send_packed_command`` and ``read_response``."""

    def __init__(self, pool: ScriptedPool) -> None:
        self.pool = pool
        self._writer = ScriptedWriter(self) if pool.streams else None
        self.writes: list[list[tuple[Any, ...]]] = []
        self.replies: asyncio.Queue[Any] = asyncio.Queue()
        self.is_connected = True
        self.disconnects = 0
        self.write_gate: asyncio.Event | None = None  # set: a write waits until it is set
        self.waiting_data = False  # can_read_destructive: data waiting, or closed by the server
        self.failing_write: BaseException | None = None  # raised by the next write, at once
        self.reads: list[tuple[asyncio.Task[Any] | None, bool]] = []
        self.read_timeouts: list[float | None] = []  # what each read was asked to wait at most
        self.socket_timeout = pool.socket_timeout
        self.marked = False  # for a reconnect, as redis-py 7.1+ marks one in use
        self.check_gate: asyncio.Event | None = None  # set: can_read waits until it is set
        self.checking = False

    def should_reconnect(self) -> bool:
        return self.marked

    def pack_commands(self, commands: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return list(commands)

    async def send_packed_command(self, packed: Any, check_health: bool = True) -> None:
        assert check_health is False  # a PING's reply would be read by the reader
        if not self.is_connected:
            raise redis.ConnectionError("closed")
        if self.failing_write is not None:
            self.is_connected = False
            raise self.failing_write
        self.writes.append(packed)
        if self.write_gate is not None:
            await self.write_gate.wait()
            if not self.is_connected:
                raise redis.ConnectionError("closed while writing")

    async def read_response(self, *, disconnect_on_error: bool = True,
                            timeout: float | None = None) -> Any:
        # Which task read each reply, and whether a failure would have closed the connection.
        self.reads.append((asyncio.current_task(), disconnect_on_error))
        self.read_timeouts.append(timeout)
        reply = await self.replies.get()
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def _read_response_from_parser(self) -> Any:
        """The parser's read (redis-py 8.1): no timer, an error reply returned, not raised."""
        assert self._writer is not None, "a stream read on a connection without one"
        self.reads.append((asyncio.current_task(), False))
        self.read_timeouts.append(math.inf)
        reply = await self.replies.get()
        if isinstance(reply, BaseException) and not isinstance(reply, ResponseError):
            raise reply
        return reply

    async def can_read(self) -> bool:
        # The readiness check reads the socket (redis-py's hiredis parser, with a zero timeout):
        # like asyncio's StreamReader, one reader at a time.
        assert not self.checking, "two tasks read the connection at once"
        if self.check_gate is not None:
            self.checking = True
            try:
                await self.check_gate.wait()
            finally:
                self.checking = False
        return self.waiting_data or (self._writer is not None and self._writer.transport.aborted)

    can_read_destructive = can_read  # its name before redis-py 8.0

    async def connect(self) -> None:
        if self.pool.streams:
            self._writer = ScriptedWriter(self)  # a new socket
        self.is_connected = True
        self.waiting_data = False
        self.marked = False

    async def disconnect(self) -> None:
        self.is_connected = False
        self.disconnects += 1


class ScriptedPool:
    max_connections = 10
    connection_kwargs: dict[str, Any] = {"command_packer": object()}  # redis-py packs

    def __init__(self, streams: bool) -> None:
        self.streams = streams
        self.socket_timeout: float | None = None  # the connections' own
        self.handed: list[ScriptedConnection] = []
        self.released: list[ScriptedConnection] = []
        self.refuse: BaseException | None = None
        self.gate: asyncio.Event | None = None  # set: a checkout waits until it is set

    async def get_connection(self) -> ScriptedConnection:
        if self.gate is not None:
            await self.gate.wait()
        if self.refuse is not None:
            raise self.refuse
        conn = ScriptedConnection(self)
        self.handed.append(conn)
        return conn

    async def release(self, conn: ScriptedConnection) -> None:
        self.released.append(conn)


def caller(shared: SharedConnection, commands: Any) -> asyncio.Task[list[Any]]:
    """A task awaiting ``commands``' replies, as a transport's caller does."""
    async def call() -> list[Any]:
        return await shared.exchange(commands)

    return asyncio.ensure_future(call())


def cmd(n: int) -> tuple[Any, ...]:
    return ("EVALSHA", "sha", 1, f"k{n}", n)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture(params=["streams", "methods"])
def pool(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ScriptedPool:
    """Connections as redis-py 8.1's (the stream and parser used directly), and as older
    versions' (their public send and read methods): every test runs on both."""
    return scripted(monkeypatch, streams=request.param == "streams")


def scripted(monkeypatch: pytest.MonkeyPatch, streams: bool) -> ScriptedPool:
    """A scripted pool whose connections have redis-py 8.1's stream API (``streams``) or only
    the older public methods, the shared connection told which (``direct.STREAM_API``)."""
    monkeypatch.setattr(pipelining.lean, "packer", lambda pool: None)
    monkeypatch.setattr(direct, "STREAM_API", streams)
    return ScriptedPool(streams)


async def test_calls_of_one_iteration_share_one_write_and_get_their_own_replies(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    calls = [caller(shared, [cmd(n)]) for n in range(5)]
    await settle()
    conn, = pool.handed
    assert conn.writes == [[cmd(n) for n in range(5)]]  # one write, in call order
    for n in range(5):
        conn.replies.put_nowait(f"reply {n}")
    assert await asyncio.gather(*calls) == [[f"reply {n}"] for n in range(5)]


async def test_an_exchange_of_several_commands_gets_all_its_replies_an_error_as_exception(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    first = caller(shared, [cmd(1), ("WAITX",)])
    second = caller(shared, [cmd(2)])
    await settle()
    conn, = pool.handed
    error = ResponseError("NOSCRIPT No matching script")
    for reply in ("a", error, "b"):
        conn.replies.put_nowait(reply)
    assert await first == ["a", error]
    assert await second == ["b"]


async def test_a_call_made_while_others_await_replies_is_written_at_once(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    first = caller(shared, [cmd(1)])
    await settle()
    second = caller(shared, [cmd(2)])
    await settle()
    conn, = pool.handed
    assert conn.writes == [[cmd(1)], [cmd(2)]]  # not held until the first reply
    conn.replies.put_nowait(1)
    conn.replies.put_nowait(2)
    assert (await first, await second) == ([1], [2])


async def test_a_batch_is_at_most_max_batch_commands(pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    calls = [caller(shared, [cmd(n)]) for n in range(MAX_BATCH + 3)]
    await settle()
    conn, = pool.handed
    assert [len(write) for write in conn.writes] == [MAX_BATCH, 3]
    for n in range(MAX_BATCH + 3):
        conn.replies.put_nowait(n)
    assert [reply for reply, in await asyncio.gather(*calls)] == list(range(MAX_BATCH + 3))


async def test_a_call_cancelled_before_its_write_is_never_sent(pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    kept = caller(shared, [cmd(1)])
    withdrawn = caller(shared, [cmd(2)])
    await asyncio.sleep(0)  # both have queued their call; the write has not run yet
    withdrawn.cancel()
    await settle()
    conn, = pool.handed
    assert conn.writes == [[cmd(1)]]
    conn.replies.put_nowait("one")
    assert await kept == ["one"]
    assert withdrawn.cancelled()


async def test_a_call_cancelled_after_its_write_has_its_reply_dropped_in_order(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    calls = [caller(shared, [cmd(n)]) for n in range(3)]
    await settle()
    calls[1].cancel()
    await settle()
    conn, = pool.handed
    for n in range(3):
        conn.replies.put_nowait(f"reply {n}")
    assert await calls[0] == ["reply 0"]
    assert await calls[2] == ["reply 2"]  # not the cancelled one's
    assert calls[1].cancelled()
    later = caller(shared, [cmd(3)])
    await settle()
    conn.replies.put_nowait("reply 3")
    assert await later == ["reply 3"]
    assert len(pool.handed) == 1 and conn.disconnects == 0


async def test_a_lost_connection_fails_what_was_written_and_sends_the_rest_on_a_new_one(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    written = [caller(shared, [cmd(n)]) for n in range(2)]
    await settle()
    first, = pool.handed
    first.write_gate = asyncio.Event()  # the next write hangs: its calls are being written
    being_written = caller(shared, [cmd(2)])
    await settle()
    not_written = caller(shared, [cmd(3)])
    await settle()
    first.replies.put_nowait(redis.TimeoutError("Timeout reading from socket"))
    for lost in (*written, being_written):
        with pytest.raises(redis.TimeoutError) as failure:
            await lost
        assert not was_unsent(failure.value)  # possibly applied: never sent again
    first.is_connected = False
    first.write_gate.set()
    await settle()
    second = pool.handed[1]
    assert second.writes == [[cmd(3)]]  # only what was never written
    second.replies.put_nowait("three")
    assert await not_written == ["three"]
    assert [cmd(n) for n in range(4)] == [
        c for conn in pool.handed for write in conn.writes for c in write]  # each once
    assert pool.released == [first]  # given back once, after both tasks left it
    assert first.disconnects >= 1


async def test_a_connection_that_cannot_be_opened_fails_its_calls_as_unsent(
        pool: ScriptedPool) -> None:
    pool.refuse = redis.ConnectionError("Connection refused")
    shared = SharedConnection(pool)
    calls = [caller(shared, [cmd(n)]) for n in range(2)]
    for call in calls:
        with pytest.raises(redis.ConnectionError) as failure:
            await call
        assert was_unsent(failure.value)  # nothing was written: the protocol may send again
    assert failure.value.__cause__ is not None
    pool.refuse = None
    await answered_on(pool, 0, shared)


async def test_a_connection_closed_while_idle_is_reconnected_before_the_write(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    call = caller(shared, [cmd(1)])
    await settle()
    conn, = pool.handed
    conn.replies.put_nowait(1)
    await call
    conn.waiting_data = True  # the server closed it (an idle timeout, a restart)
    second = caller(shared, [cmd(2)])
    await settle()
    assert conn.disconnects == 1 and conn.is_connected  # reconnected before writing
    conn.replies.put_nowait(2)
    assert await second == [2]


def test_blocking_commands_never_share_the_connection() -> None:
    assert shares([cmd(1)])
    assert not shares([cmd(1), ("WAIT", 1, 100)])
    assert not shares([("wait", 1, 100)])


async def answered_on(pool: ScriptedPool, handed: int, shared: SharedConnection) -> None:
    """A call made now goes out on the pool's ``handed``-th connection and gets its reply: the
    shared connection works again after what the test did."""
    again = caller(shared, [cmd(9)])
    await settle()
    pool.handed[handed].replies.put_nowait("ok")
    assert await again == ["ok"]


async def opened(pool: ScriptedPool, shared: SharedConnection) -> ScriptedConnection:
    """The shared connection, open and idle: one call made and answered on it."""
    first = caller(shared, [cmd(0)])
    await settle()
    conn, = pool.handed
    conn.replies.put_nowait(0)
    assert await first == [0]
    await settle()  # its reader has ended
    return conn


async def test_a_call_alone_on_an_idle_connection_is_written_by_its_own_task(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    alone = caller(shared, [cmd(1)])
    others = [caller(shared, [cmd(n)]) for n in (2, 3)]  # made in the same iteration
    await asyncio.sleep(0)  # one step of each task: no writer task has run yet
    assert conn.writes[1:] == [[cmd(1)]]  # written at once, by the caller
    await settle()
    assert conn.writes[1:] == [[cmd(1)], [cmd(2), cmd(3)]]  # the others: one write behind it
    for n in (1, 2, 3):
        conn.replies.put_nowait(n)
    assert await asyncio.gather(alone, *others) == [[1], [2], [3]]


async def test_a_call_alone_cancelled_while_written_drops_the_connection_not_the_next_call(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    conn.write_gate = asyncio.Event()  # its write hangs
    alone = caller(shared, [cmd(1)])
    await settle()
    waiting = caller(shared, [cmd(2)])  # made meanwhile: waits for that write to end
    await settle()
    assert conn.writes[1:] == [[cmd(1)]]
    alone.cancel()  # part of it may have reached Redis: its reply would come out of order
    await settle()
    assert alone.cancelled()
    new = pool.handed[1]
    assert new.writes == [[cmd(2)]]  # on a new connection
    new.replies.put_nowait(2)
    assert await waiting == [2]
    conn.replies.put_nowait("late")  # whatever the dropped connection still delivers
    await settle()
    assert pool.released == [conn] and conn.disconnects >= 1


async def test_a_late_reply_on_a_dropped_connection_goes_to_no_call_of_the_new_one(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    first = caller(shared, [cmd(1)])
    await settle()
    old, = pool.handed
    old.write_gate = asyncio.Event()
    broken = caller(shared, [cmd(2)])
    await settle()  # written behind the first; its write hangs
    old.is_connected = False
    old.write_gate.set()  # the write fails: the connection is dropped, both replies lost
    for lost in (first, broken):
        with pytest.raises(redis.ConnectionError):
            await lost
    later = caller(shared, [cmd(3)])
    await settle()
    new = pool.handed[1]
    assert new.writes == [[cmd(3)]]
    old.replies.put_nowait("the first call's reply, late")  # read by the old reader
    await settle()
    new.replies.put_nowait("three")
    await settle()
    assert later.done() and later.result() == ["three"]  # its own reply, not the late one
    assert pool.released == [old]


async def test_a_write_that_fails_at_once_gives_the_connection_back_once(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    conn.failing_write = redis.ConnectionError("reset")
    with pytest.raises(redis.ConnectionError):
        await caller(shared, [cmd(1)])
    await settle()  # the reader started for that write has run and left
    assert pool.released == [conn]  # once: twice would hand it to two callers
    await answered_on(pool, 1, shared)


async def test_a_call_alone_reads_its_own_reply_in_its_own_task(pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    reader_before = shared._reader
    alone = caller(shared, [cmd(1)])
    await settle()
    conn.replies.put_nowait("one")
    assert await alone == ["one"]
    assert conn.reads[-1] == (alone, False)  # read by the caller, the connection kept on error
    assert shared._reader is reader_before  # no reader task was started for it
    assert not shared._using and shared._reading is None  # nothing left holding it


async def test_calls_written_behind_a_call_alone_are_read_by_a_reader_it_starts(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    alone = caller(shared, [cmd(1)])
    behind = [caller(shared, [cmd(n)]) for n in (2, 3)]
    await settle()
    for n in (1, 2, 3):
        conn.replies.put_nowait(n)
    assert await asyncio.gather(alone, *behind) == [[1], [2], [3]]
    readers = [task for task, _keep in conn.reads[1:]]
    assert readers[0] is alone and alone not in readers[1:]  # its own only; then a reader's
    assert len(set(readers[1:])) == 1 and readers[1] not in behind
    assert not shared._using and shared._reading is None


async def test_a_call_alone_cancelled_while_reading_costs_its_batch_mates_nothing(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    alone = caller(shared, [cmd(1)])
    behind = [caller(shared, [cmd(n)]) for n in (2, 3)]
    await settle()  # all written; the first caller waits for its reply
    alone.cancel()
    await settle()
    for n in (1, 2, 3):
        conn.replies.put_nowait(n)
    assert await asyncio.gather(*behind) == [[2], [3]]  # the first reply read and dropped
    assert alone.cancelled()
    assert conn.disconnects == 0 and len(pool.handed) == 1  # the connection goes on
    later = caller(shared, [cmd(4)])
    await settle()
    conn.replies.put_nowait(4)
    assert await later == [4]


async def test_a_call_alone_whose_read_fails_fails_the_calls_behind_it_as_lost(
        pool: ScriptedPool) -> None:
    unretrieved: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda _loop, context: unretrieved.append(context))
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    alone = caller(shared, [cmd(1)])
    behind = caller(shared, [cmd(2)])
    await settle()
    timeout = redis.TimeoutError("Timeout reading from socket")
    conn.replies.put_nowait(timeout)
    for lost in (alone, behind):
        with pytest.raises(redis.TimeoutError) as failure:
            await lost
        assert not was_unsent(failure.value)  # possibly applied: never sent again
        assert failure.value.__cause__ is timeout  # each its own copy, through its future
    del failure, lost, alone, behind
    gc.collect()
    assert unretrieved == []  # no future's failure left unread ("never retrieved")
    await settle()
    assert pool.released == [conn] and conn.disconnects >= 1  # closed, given back once
    await answered_on(pool, 1, shared)


async def test_calls_all_withdrawn_before_the_write_open_no_connection(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    calls = [caller(shared, [cmd(n)]) for n in range(2)]
    await asyncio.sleep(0)  # both queued; the writer has not run
    for call in calls:
        call.cancel()
    await settle()
    assert all(call.cancelled() for call in calls)
    assert pool.handed == []  # nothing to write: no connection was even checked out


async def test_a_writer_cancelled_as_its_loop_closes_cancels_the_calls_it_held(
        pool: ScriptedPool) -> None:
    pool.gate = asyncio.Event()  # the checkout hangs: the writer waits in it
    shared = SharedConnection(pool)
    before = asyncio.all_tasks()
    calls = [caller(shared, [cmd(n)]) for n in range(2)]
    await settle()
    writer, = asyncio.all_tasks() - before - set(calls)
    writer.cancel()  # what closing the loop does to it
    await settle()
    assert all(call.cancelled() for call in calls)  # never written: never sent


async def test_a_reader_cancelled_as_its_loop_closes_drops_the_connection(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    calls = [caller(shared, [cmd(n)]) for n in range(2)]  # a batch: a reader task reads it
    await settle()
    conn, = pool.handed
    assert shared._reader is not None
    shared._reader.cancel()
    await settle()
    assert all(call.cancelled() for call in calls)
    assert pool.released == [conn] and conn.disconnects >= 1  # its replies would be unread


# -- the socket timeout (redis-py 8.1: one timer per shared connection, not per reply) --------

@pytest.fixture
def streams_pool(monkeypatch: pytest.MonkeyPatch) -> ScriptedPool:
    """Connections as redis-py 8.1's only: the shared connection's own timer keeps the timeout."""
    return scripted(monkeypatch, streams=True)


def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The running loop's clock, moved by the test only: its timers fire when it says."""
    loop = asyncio.get_running_loop()
    now = [loop.time()]
    monkeypatch.setattr(loop, "time", lambda: now[0])
    return now


async def timed_batch(pool: ScriptedPool, monkeypatch: pytest.MonkeyPatch, calls: int
                      ) -> tuple[list[float], SharedConnection, list[asyncio.Task[list[Any]]]]:
    """``calls`` calls written as one batch, read by a reader task on redis-py 8.1's untimed
    reads, with a 5 s socket timeout and the loop's clock frozen: (clock, shared, calls)."""
    now = frozen_clock(monkeypatch)
    pool.socket_timeout = 5.0
    shared = SharedConnection(pool)
    tasks = [caller(shared, [cmd(n)]) for n in range(calls)]
    await settle()
    return now, shared, tasks


async def timed_idle(pool: ScriptedPool, monkeypatch: pytest.MonkeyPatch
                     ) -> tuple[list[float], SharedConnection, ScriptedConnection]:
    """A shared connection open and idle (one call answered on it), with a 5 s socket timeout
    and the loop's clock frozen: (clock, shared, its connection)."""
    now = frozen_clock(monkeypatch)
    pool.socket_timeout = 5.0
    shared = SharedConnection(pool)
    return now, shared, await opened(pool, shared)


async def test_a_reader_given_no_reply_within_the_socket_timeout_fails_its_calls_as_lost(
        streams_pool: ScriptedPool, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = streams_pool
    now, shared, calls = await timed_batch(pool, monkeypatch, 3)
    conn, = pool.handed
    assert conn.read_timeouts == [math.inf]  # no timer of redis-py's: the reader's own
    now[0] += 4.9
    await settle()
    assert not any(call.done() for call in calls)
    now[0] += 0.2
    await settle()
    await settle()
    for call in calls:
        with pytest.raises(redis.TimeoutError, match="Timeout reading from"):
            await call
        assert not was_unsent(call.exception())  # possibly applied: never sent again
    assert pool.released == [conn] and conn.disconnects >= 1
    again = caller(shared, [cmd(9)])  # the next call goes out on a new connection
    await settle()
    assert pool.handed[1].writes == [[cmd(9)]]
    pool.handed[1].replies.put_nowait("nine")
    await settle()
    assert await again == ["nine"]


async def test_each_reply_has_the_socket_timeout_from_the_start_of_its_own_read(
        streams_pool: ScriptedPool, monkeypatch: pytest.MonkeyPatch) -> None:
    now, shared, (first, second) = await timed_batch(streams_pool, monkeypatch, 2)
    conn, = streams_pool.handed
    now[0] += 4.0
    conn.replies.put_nowait("one")
    await settle()
    assert first.done()
    now[0] += 4.0  # 8 s since the batch's first read, 4 s since this one's
    await settle()
    assert not second.done()
    conn.replies.put_nowait("two")
    await settle()
    assert (await first, await second) == (["one"], ["two"])
    assert conn.disconnects == 0 and shared._conn is conn


async def test_a_call_alone_given_no_reply_within_the_socket_timeout_fails_as_lost(
        streams_pool: ScriptedPool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The caller's own task reads its reply: the timer closes the connection rather than
    # cancel that task (a cancellation there is its caller's own, and would reach it).
    pool = streams_pool
    now, shared, conn = await timed_idle(pool, monkeypatch)
    cancellations: list[int] = []

    async def alone_call() -> list[Any]:
        try:
            return await shared.exchange([cmd(1)])
        finally:
            task = asyncio.current_task()
            assert task is not None
            cancellations.append(task.cancelling())

    alone = asyncio.ensure_future(alone_call())
    await settle()
    assert conn.reads[-1][0] is alone and conn.read_timeouts[-1] == math.inf
    now[0] += 4.9
    await settle()
    assert not alone.done()
    now[0] += 0.2
    await settle()
    with pytest.raises(redis.TimeoutError, match="Timeout reading from"):
        await alone
    assert cancellations == [0] and not was_unsent(alone.exception())
    assert conn._writer is not None and conn._writer.transport.aborted
    await settle()
    assert pool.released == [conn] and conn.disconnects >= 1
    await answered_on(pool, 1, shared)


async def test_a_timer_that_fires_after_its_reply_came_closes_nothing(
        streams_pool: ScriptedPool, monkeypatch: pytest.MonkeyPatch) -> None:
    # One timer per connection, armed by the first read and never cancelled: when it fires
    # with no read waiting (or one started since, not yet due), the connection is kept.
    pool = streams_pool
    now, shared, conn = await timed_idle(pool, monkeypatch)
    now[0] += 6.0  # the timer armed by opened()'s read fires: nothing is read now
    await settle()
    later = caller(shared, [cmd(1)])
    await settle()
    now[0] += 4.0  # 10 s after the first read, 4 s after this one's
    await settle()
    conn.replies.put_nowait(1)
    assert await later == [1]
    assert conn._writer is not None and not conn._writer.transport.aborted
    assert conn.disconnects == 0 and shared._conn is conn
    unanswered = caller(shared, [cmd(2)])  # and the timer still keeps the next read's timeout
    await settle()
    now[0] += 5.1
    await settle()
    with pytest.raises(redis.TimeoutError):
        await unanswered


async def test_a_socket_error_reaches_the_callers_as_redis_pys_connection_error(
        streams_pool: ScriptedPool) -> None:
    # Read on the parser directly, a reset arrives as the OSError it is: the callers get what
    # redis-py's read_response would have raised (a ConnectionError, possibly sent).
    shared = SharedConnection(streams_pool)
    calls = [caller(shared, [cmd(n)]) for n in range(2)]
    await settle()
    conn, = streams_pool.handed
    conn.replies.put_nowait(ConnectionResetError(104, "Connection reset by peer"))
    for call in calls:
        with pytest.raises(redis.ConnectionError, match="Error while reading from"):
            await call
        assert not was_unsent(call.exception())
    await answered_on(streams_pool, 1, shared)


async def test_a_write_timing_out_ends_the_read_waiting_on_its_connection_at_once(
        streams_pool: ScriptedPool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The old connection is closed when its write fails (as redis-py's own send does): its
    # reader ends now and gives it back, and the next connection's reads keep their own timer.
    pool = streams_pool
    now = frozen_clock(monkeypatch)
    pool.socket_timeout = 5.0
    shared = SharedConnection(pool)
    first = caller(shared, [cmd(1)])
    await settle()
    old, = pool.handed
    now[0] += 3.0
    old.write_gate = asyncio.Event()  # the socket takes nothing more: the write waits
    stuck = caller(shared, [cmd(2)])
    await settle()
    now[0] += 1.0
    old.replies.put_nowait(1)  # the first reply; the reader now waits for the second
    await settle()
    assert await first == [1]
    now[0] += 4.1  # the write has waited 5.1 s
    await settle()
    await settle()
    with pytest.raises(redis.TimeoutError, match="Timeout writing"):
        await stuck
    assert not was_unsent(stuck.exception())  # part of it may be out: never sent again
    assert old._writer is not None and old._writer.transport.aborted
    assert pool.released == [old]  # its reader ended with it
    later = caller(shared, [cmd(3)])
    await settle()
    new = pool.handed[1]
    assert new.writes == [[cmd(3)]]
    old.replies.put_nowait("the old connection's late reply")
    now[0] += 5.1
    await settle()
    await settle()
    with pytest.raises(redis.TimeoutError, match="Timeout reading"):
        await later


async def test_a_call_made_as_the_timer_closes_the_connection_goes_out_on_a_new_one(
        streams_pool: ScriptedPool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The timer aborts the socket; its reader hears of it a loop iteration later. A call
    # written in between would go to a closing socket: it goes out on a new connection, and
    # the late call fails as the timeout it is.
    pool = streams_pool
    now, shared, conn = await timed_idle(pool, monkeypatch)
    late = caller(shared, [cmd(1)])
    await settle()
    now[0] += 5.1
    await asyncio.sleep(0)  # the timer fires in the next iteration, after this task
    await asyncio.sleep(0)  # it has: the socket is closing, the reader not told yet
    assert conn._writer is not None and conn._writer.transport.aborted
    assert not late.done()
    made_then = shared.exchange([cmd(2)])  # made now: its writer runs before the reader
    await settle()
    with pytest.raises(redis.TimeoutError, match="Timeout reading"):
        await late
    new = pool.handed[1]
    assert conn.writes[1:] == [[cmd(1)]] and new.writes == [[cmd(2)]]
    new.replies.put_nowait(2)
    assert await made_then == [2]
    assert pool.released == [conn]


async def test_a_timeout_relaxed_during_a_read_applies_to_that_read(
        streams_pool: ScriptedPool, monkeypatch: pytest.MonkeyPatch) -> None:
    # redis-py relaxes a connection's socket timeout when the server announces maintenance,
    # which may come while a reply is awaited: the timer reads the timeout when it fires.
    pool = streams_pool
    now, shared, conn = await timed_idle(pool, monkeypatch)
    now[0] += 10.0  # past the timer opened() armed: the next read arms a new one
    await settle()
    waiting = caller(shared, [cmd(1)])
    await settle()
    now[0] += 3.0
    conn.socket_timeout = 20.0
    now[0] += 3.0  # 6 s into the read: past 5, within 20
    await settle()
    await settle()
    assert not waiting.done() and conn._writer is not None and not conn._writer.transport.aborted
    conn.replies.put_nowait(1)
    assert await waiting == [1]


async def test_a_call_alone_reads_under_redis_pys_own_timeout_before_redis_py_8_1(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pool = scripted(monkeypatch, streams=False)
    pool.socket_timeout = 5.0
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    alone = caller(shared, [cmd(1)])
    await settle()
    conn.replies.put_nowait(1)
    assert await alone == [1]
    assert conn.read_timeouts[-1] is None  # the connection's socket timeout, redis-py's way


async def test_before_redis_py_8_1_every_reply_is_read_under_redis_pys_own_timer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pool = scripted(monkeypatch, streams=False)
    pool.socket_timeout = 5.0
    shared = SharedConnection(pool)
    calls = [caller(shared, [cmd(n)]) for n in range(2)]
    await settle()
    conn, = pool.handed
    for n in range(2):
        conn.replies.put_nowait(n)
    assert await asyncio.gather(*calls) == [[0], [1]]
    assert conn.read_timeouts == [None, None]


async def test_a_read_is_due_within_the_socket_timeout_the_connection_has_when_it_starts(
        streams_pool: ScriptedPool, monkeypatch: pytest.MonkeyPatch) -> None:
    # redis-py relaxes a connection's socket timeout while the server announces maintenance:
    # a read started then is due later.
    now, _shared, (first, second) = await timed_batch(streams_pool, monkeypatch, 2)
    conn, = streams_pool.handed
    conn.socket_timeout = 20.0  # relaxed before the first reply came
    conn.replies.put_nowait("one")
    await settle()
    now[0] += 10.0  # past 5 s, within 20
    await settle()
    await settle()
    assert not second.done()
    conn.replies.put_nowait("two")
    await settle()
    assert (await first, await second) == (["one"], ["two"])


async def test_a_connection_marked_for_reconnect_is_reconnected_before_the_write(
        pool: ScriptedPool) -> None:
    # redis-py marks the connections in use when a cluster's table changes (or a server
    # announces maintenance): a pool reconnects one as it comes back; a kept one, here.
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    conn.marked = True
    call = caller(shared, [cmd(1)])
    await settle()
    assert conn.disconnects == 1 and conn.is_connected and conn.writes[-1] == [cmd(1)]
    conn.replies.put_nowait(1)
    assert await call == [1]


async def test_a_retired_idle_connection_is_closed_and_given_back_at_once(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    shared.retire()
    await settle()
    assert pool.released == [conn] and conn.disconnects == 1
    shared.retire()  # again: nothing left to close
    await settle()
    assert pool.released == [conn]


async def test_a_retired_connection_is_closed_once_the_calls_in_flight_are_answered(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    calls = [caller(shared, [cmd(n)]) for n in range(3)]
    await settle()
    conn, = pool.handed
    shared.retire()
    await settle()
    assert pool.released == [] and conn.disconnects == 0  # their replies are still to come
    for n in range(3):
        conn.replies.put_nowait(n)
    assert await asyncio.gather(*calls) == [[0], [1], [2]]
    await settle()
    assert pool.released == [conn] and conn.disconnects == 1


async def test_a_retired_connection_waiting_for_its_write_is_closed_after_it(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    conn.waiting_data = True  # checked before the write, which waits for the reconnect
    connecting = asyncio.Event()
    plain_connect = conn.connect

    async def slow_connect() -> None:
        await connecting.wait()
        await plain_connect()

    conn.connect = slow_connect  # type: ignore[method-assign]
    call = caller(shared, [cmd(1)])
    await settle()
    shared.retire()  # nothing pending nor in flight: the writer holds the batch meanwhile
    connecting.set()
    await settle()
    assert conn.writes[-1] == [cmd(1)] and pool.released == []
    conn.replies.put_nowait(1)
    assert await call == [1]
    await settle()
    assert pool.released == [conn]


async def test_a_call_made_on_a_retired_connection_is_answered_then_closed_again(
        pool: ScriptedPool) -> None:
    # A caller that found the shared connection before it was retired still gets its reply,
    # on a connection of the pool's, closed when done: none is left open.
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    shared.retire()
    await settle()
    late = caller(shared, [cmd(1)])
    await settle()
    new = pool.handed[1]
    new.replies.put_nowait(1)
    assert await late == [1]
    await settle()
    assert pool.released == [conn, new] and new.disconnects == 1


async def _replied(reply: Any) -> list[Any]:
    return [reply]


async def _failing(failure: BaseException) -> list[Any]:
    raise failure


def _unsent_failure() -> BaseException:
    return pipelining.unsent(redis.ConnectionError("refused"))


async def test_several_nodes_replies_are_gathered_in_order() -> None:
    assert await pipelining.gathered([_replied(1), _replied(2)]) == [[1], [2]]
    assert await pipelining.gathered([_replied(3)]) == [[3]]


async def test_a_node_that_could_not_be_reached_while_another_was_sent_to_is_possibly_sent(
        ) -> None:
    # A send is retried whole when nothing of it went out: what another node applied must not
    # run twice because this node's connection could not be opened.
    with pytest.raises(redis.ConnectionError) as raised:
        await pipelining.gathered([_replied(1), _failing(_unsent_failure())])
    assert not was_unsent(raised.value)
    with pytest.raises(redis.ConnectionError) as raised:
        await pipelining.gathered([_failing(_unsent_failure()),
                                   _failing(redis.TimeoutError("lost"))])
    assert not was_unsent(raised.value)
    with pytest.raises(redis.ConnectionError) as raised:  # none went out: unsent, retried
        await pipelining.gathered([_failing(_unsent_failure()), _failing(_unsent_failure())])
    assert was_unsent(raised.value)


async def test_gathering_waits_for_every_node_before_raising() -> None:
    slow = asyncio.get_running_loop().create_future()
    gathering = asyncio.ensure_future(pipelining.gathered(
        [_failing(redis.TimeoutError("lost")), slow]))
    await settle()
    assert not gathering.done()  # the other node's reply is still to come
    slow.set_result(["late"])
    with pytest.raises(redis.TimeoutError):
        await gathering


async def test_a_cluster_node_is_a_pool_of_its_own_connections() -> None:
    """NodePool on redis-py's own ClusterNode (no server: nothing listens on port 1): a
    connection that cannot be opened goes back to the node, the error is the node's."""
    from redis.asyncio.cluster import ClusterNode

    if not pipelining.NODE_RELEASE:
        pytest.skip("redis-py before 6.4: cluster calls go out as their node's pipeline")
    node = ClusterNode("127.0.0.1", 1, server_type="primary", socket_connect_timeout=1,
                       max_connections=1)
    nodes = pipelining.NodePool(node)
    with pytest.raises(redis.ConnectionError):
        await nodes.get_connection()
    taken = node.acquire_connection()  # its only connection: the one that failed came back
    with pytest.raises(redis.exceptions.MaxConnectionsError):
        node.acquire_connection()
    await nodes.release(taken)
    assert node.acquire_connection() is taken
    await node.disconnect()


async def test_calls_found_alone_but_awaited_later_are_written_one_after_the_other(
        pool: ScriptedPool) -> None:
    # A cluster's send makes each node's exchange, then gathers them: two on one node both
    # found the connection idle, and their tasks start later. One writes (its readiness check
    # reads the socket meanwhile); the other queues behind it: never two readers at once.
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    conn.check_gate = asyncio.Event()
    first, second = shared.exchange([cmd(1)]), shared.exchange([cmd(2)])
    both = asyncio.ensure_future(asyncio.gather(first, second))
    await settle()
    conn.check_gate.set()
    await settle()
    assert conn.writes[1:] == [[cmd(1)], [cmd(2)]] and len(pool.handed) == 1
    conn.replies.put_nowait(1)
    conn.replies.put_nowait(2)
    assert await both == [[1], [2]]


async def test_a_retired_connection_that_fails_to_reconnect_goes_back_to_its_pool(
        pool: ScriptedPool) -> None:
    shared = SharedConnection(pool)
    conn = await opened(pool, shared)
    conn.waiting_data = True  # closed by the server: the next write reconnects first

    async def refused() -> None:
        raise redis.ConnectionError("refused")

    conn.connect = refused  # type: ignore[method-assign]
    conn.check_gate = asyncio.Event()
    call = caller(shared, [cmd(1)])
    await settle()
    shared.retire()  # while the writer checks the connection
    conn.check_gate.set()
    with pytest.raises(redis.ConnectionError):
        await call
    await settle()
    assert pool.released == [conn]  # nothing else would give it back
