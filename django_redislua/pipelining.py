"""Automatic pipelining (asyncio): the script calls a loop's tasks make while others are in
flight share one connection, its writes and its reads.

Without it, 64 tasks deciding at once take 64 connections, and each call is its own write, its
own read and its own wake-up of Redis. With it (``REDISLUA["PIPELINING"]``, on by
default), a server's asyncio transport keeps one connection of the pool checked out, and:

- a call made while nothing else is written, pending or awaited is **alone**: its own task
  writes it at once and reads its reply (no timer, no hand-off through the loop: it costs what
  a call on a connection of its own costs);
- the calls made while one is being written, in one iteration of the event loop, go out in
  **one write** at the end of that iteration, from a writer task;
- calls made while earlier replies are awaited are written at once behind them (Redis answers a
  connection's commands in order), and one reader reads the replies back, in order, to each
  caller (the task of a call alone until its own reply is in, then a reader task it starts);
- a batch is at most :data:`MAX_BATCH` commands; the callers hold what is in flight.

Every guarantee of the per-call path holds:

- **sent once**: nothing is ever written twice. A call whose batch was being written, or whose
  reply was awaited, when the connection failed (a timeout, a reset) fails as a reply lost (the
  protocol never sends it again); a call not yet written when that happens goes out on the new
  connection; a call that could not be written because the connection could not be opened fails
  as *unsent* (:func:`django_redislua.protocol.unsent`), as on the per-call path;
- **timeouts**: each reply is read within the pool's socket timeout of the start of its read
  (on redis-py 8.1 and newer, where the writes and reads go straight to the connection's
  stream and parser, :mod:`django_redislua.direct`, one timer per connection keeps it,
  :class:`direct.Deadline`; before, redis-py's own timer on each read);
- **cancellation**: a task cancelled before its call was written withdraws it (it is never
  sent); one cancelled after reads nothing, and its reply is read and dropped, so its
  batch-mates' replies stay in order (a call alone cancelled while reading its own reply hands
  the reading to a reader task: its read leaves the connection as it was). The protocol's undo
  then runs as on the per-call path;
- **a connection the server closed** while idle (a restart, an idle timeout) is found before the
  next write (the pool's own readability check) and replaced, as the lean path does;
- **blocking commands** (``WAIT``: :class:`~django_redislua.locks.Lock` with ``replicas``) never
  share the connection (they would hold every other call behind them): they take the per-call
  path.

A single server's shared connection is one of its plain pool's; a cluster's transport keeps
one per primary, taken from that node's connections (:class:`NodePool`, redis-py 6.4 and newer),
so a batch is per node, and gives it back closed once the node leaves the cluster's table
(:meth:`SharedConnection.retire`). Threads take the per-call path (docs/ratelimit.md,
"Automatic pipelining").
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import math
from collections import deque
from collections.abc import Awaitable, Generator, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.connection
from redis.exceptions import ResponseError

from django_redislua import direct, lean
from django_redislua.conf import settings
from django_redislua.connection import checkout
from django_redislua.drivers import adrive, keep_running
from django_redislua.protocol import unsent, was_unsent

Command = tuple[Any, ...]
T = TypeVar("T")
# The writer's and the reader's steps: generators that yield awaitables (redis-py's connection
# calls), awaited by drivers.adrive through AWAITED, not the protocols' operations.
Steps = Generator[Any, Any, T]

# The most commands one write carries: a bound on a batch's buffer, not a window (the rest go
# out in the next write, at once).
MAX_BATCH = 512

# Commands that block their connection: never sent on the shared one.
BLOCKING = frozenset({"WAIT", "WAITAOF", "BLPOP", "BRPOP", "BLMOVE", "BRPOPLPUSH", "BZPOPMIN",
                      "BZPOPMAX", "BLMPOP", "BZMPOP", "XREAD", "XREADGROUP"})

def has_connection_api() -> bool:
    """Feature test (docs/versions.md): the asyncio connection methods the shared connection
    uses, public on every redis-py the package supports, and ``read_response``'s
    ``disconnect_on_error`` (a call alone reads its own reply with it off)."""
    conn = redis.asyncio.connection.Connection
    needed = ("is_connected", lean.ASYNC_CAN_READ, "connect", "disconnect",
              "send_packed_command", "read_response", "pack_commands")
    if not all(hasattr(conn, name) for name in needed):
        return False
    return "disconnect_on_error" in inspect.signature(conn.read_response).parameters


SUPPORTED = has_connection_api()
def eligible(pool: Any) -> bool:
    """Whether a server's asyncio transport shares a connection: the setting, a plain pool
    (:func:`lean.plain`) of at least two connections (one stays for everything else)."""
    return SUPPORTED and settings.PIPELINING and lean.plain(pool) and pool.max_connections >= 2


def has_node_release() -> bool:
    """Feature test (docs/versions.md): an asyncio cluster node hands out and takes back a
    connection through public methods (``ClusterNode.acquire_connection`` and ``release``,
    redis-py 6.4 and newer); before, a cluster's calls each go out as their node's pipeline."""
    node = redis.asyncio.cluster.ClusterNode
    return hasattr(node, "acquire_connection") and hasattr(node, "release")


NODE_RELEASE = has_node_release()


def node_eligible(node: Any) -> bool:
    """Whether a cluster's asyncio transport shares a connection to ``node``: the setting, and
    redis-py's node API (:func:`has_node_release`)."""
    return (SUPPORTED and NODE_RELEASE and settings.PIPELINING and node.max_connections >= 2
            and not node.connection_kwargs.get("cache_config"))


class NodePool:
    """An asyncio cluster node as the pool its shared connection is taken from: what
    :class:`SharedConnection` asks of a pool, on the node's own connections (counted against
    its ``max_connections``, closed with the cluster client)."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.connection_class = node.connection_class
        self.connection_kwargs = node.connection_kwargs

    def get_connection(self) -> Awaitable[Any]:
        """A connection of the node's, connected and checked as a pool's (a failure here
        sent nothing, and the connection goes back)."""
        return adrive(self._opened(), AWAITED)

    def _opened(self) -> Steps[Any]:
        conn = self.node.acquire_connection()
        try:
            yield lean.arefreshed(conn)
        except BaseException:
            self.node.release(conn)
            raise
        return conn

    async def release(self, conn: Any) -> None:
        self.node.release(conn)


def shares(commands: Sequence[Command]) -> bool:
    """Whether an exchange may go on the shared connection (no blocking command)."""
    return not any(str(command[0]).upper() in BLOCKING for command in commands)


class _Exchange:
    """One caller's commands, and the future its replies go to."""

    __slots__ = ("commands", "future", "replies")

    def __init__(self, commands: Sequence[Command], future: asyncio.Future[list[Any]]) -> None:
        self.commands = commands
        self.future = future
        self.replies: list[Any] = []


def _fail(exchanges: Any, failure: Exception | None, nothing_sent: bool = False) -> None:
    """Each caller still waiting gets its own copy of ``failure`` (marked :func:`unsent` when
    ``nothing_sent``); None: the calls are cancelled (the task that would send or read them
    was)."""
    for exchange in exchanges:
        if exchange.future.done():
            continue
        if failure is None:
            exchange.future.cancel()
        else:
            mine = _own_copy(failure)
            if nothing_sent:
                # A failure only a class of its own can be marked (a built-in exception takes
                # no weak reference): unmarked, the call counts as possibly sent.
                with contextlib.suppress(TypeError):
                    mine = unsent(mine)
            exchange.future.set_exception(mine)


def gathered(exchanges: list[Awaitable[list[Any]]]) -> Awaitable[list[list[Any]]]:
    """The replies of exchanges made on several shared connections at once (a cluster's
    nodes), in order. A failure is raised once every exchange has ended, and as possibly sent
    unless none of them went out: a send is retried whole, and what one node applied must not
    be sent again because another's connection could not be opened."""
    if len(exchanges) == 1:
        return _listed(exchanges[0])
    return adrive(_gathering(exchanges), AWAITED)


async def _listed(exchange: Awaitable[list[Any]]) -> list[list[Any]]:
    return [await exchange]


def _gathering(exchanges: list[Awaitable[list[Any]]]) -> Steps[list[list[Any]]]:
    outcomes = yield asyncio.gather(*exchanges, return_exceptions=True)
    failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if not failures:
        return outcomes  # type: ignore[no-any-return]
    failure = failures[0]
    nothing_sent = len(failures) == len(outcomes) and all(map(was_unsent, failures))
    if was_unsent(failure) and not nothing_sent:
        failure = _own_copy(failure)  # a new exception, not marked unsent
    raise failure


def _own_copy(failure: BaseException) -> BaseException:
    """A failure for one caller: each raises its own (a shared instance's traceback would grow
    with every caller that raises it), caused by the one the connection met."""
    try:
        mine = copy.copy(failure)
    except Exception:  # pragma: no cover - an exception that cannot be copied is shared
        return failure
    mine.__traceback__ = None
    mine.__cause__ = failure
    return mine


class SharedConnection:
    """One connection of an asyncio pool that carries every exchange of its loop's transport
    (see the module docstring)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._checkout = checkout(pool)
        self._packer = lean.packer(pool)
        self._conn: Any = None
        self._pending: deque[_Exchange] = deque()  # not written yet
        self._in_flight: deque[_Exchange] = deque()  # written, replies awaited in this order
        self._writing = False  # a writer (a task, or a caller alone) is writing
        self._reader: asyncio.Task[None] | None = None
        self._reading: Any = None  # the connection being read (a reader task, or a caller alone)
        # Tasks using each connection (the writer while it writes, the reader while it reads):
        # a connection dropped after a failure goes back to the pool when the last one leaves
        # it, never while another task could still touch its socket.
        self._using: dict[Any, int] = {}
        self._retired = False  # closed whenever idle (its cluster node left the table)
        # Each connection's timer (redis-py 8.1 and newer; before, redis-py's per read).
        self._deadlines: dict[Any, direct.Deadline] | None = {} if direct.STREAM_API else None

    def exchange(self, commands: Sequence[Command]) -> Awaitable[list[Any]]:
        """``commands``' replies (an error reply as its exception), sent once: an awaitable.
        Alone on an idle connection, the caller writes them itself, at once; else they go
        out in the current loop iteration's write, with the others'. A caller cancelled
        while awaiting withdraws its call if it was not written yet (never sent); written,
        its reply is read and dropped."""
        loop = asyncio.get_running_loop()
        exchange = _Exchange(commands, loop.create_future())
        if self._idle():
            return self._alone(exchange)
        self._pending.append(exchange)
        if not self._writing:
            self._start_writer()
        return exchange.future

    def _start_writer(self) -> None:
        """A writer task for what is pending. Started as a task: it runs once every task
        ready in this iteration has run, so their calls are written together."""
        self._writing = True
        writer = asyncio.get_running_loop().create_task(adrive(self._writes(), AWAITED))
        writer.add_done_callback(_consume)

    def _idle(self) -> bool:
        """Nothing being written, pending or awaited, on a connection already open: a call
        made now is alone, and saves the hand-off to a writer task."""
        return (not self._writing and not self._pending and not self._in_flight
                and self._conn is not None)

    async def _alone(self, exchange: _Exchange) -> list[Any]:
        """A call alone, written by its caller's own task (the writer's one step, driven the
        same way), and its reply read there too unless a reader runs already: no hand-off
        through the loop either way. Calls made meanwhile wait for the write, then go out
        from a writer task; their replies, from a reader task the caller starts once it has
        its own."""
        await adrive(self._alone_steps(exchange), AWAITED)  # one driver for both
        return await exchange.future

    def _alone_steps(self, exchange: _Exchange) -> Steps[None]:
        # Idle when the call was made, maybe not now: a caller may await it later, after
        # other calls (a cluster's send gathers its nodes' exchanges, two of them on one
        # node). Then it queues as they did: two tasks must never write or read at once.
        if not self._idle():
            self._pending.append(exchange)
            if not self._writing:
                self._start_writer()
            return
        self._writing = True
        try:
            leads = yield from self._write([exchange], lead=True)
        finally:
            self._writing = False
            if self._pending:  # calls made while it was written
                self._start_writer()
        if leads is not None:
            yield from self._reading_replies(leads, exchange)

    def _pack(self, conn: Any, commands: list[Command]) -> Any:
        if self._packer is not None:
            packed = [lean.packed(self._packer, command) for command in commands]
            if None not in packed:
                return b"".join(packed)  # type: ignore[arg-type]
        return conn.pack_commands(commands)

    def _batch(self) -> list[_Exchange]:
        """The next write's exchanges: at most MAX_BATCH commands (one exchange, if larger),
        those of cancelled callers left out (withdrawn: never sent)."""
        batch: list[_Exchange] = []
        count = 0
        while self._pending and (not batch or count + len(self._pending[0].commands)
                                 <= MAX_BATCH):
            exchange = self._pending.popleft()
            if not exchange.future.done():
                batch.append(exchange)
                count += len(exchange.commands)
        return batch

    # The writer and the reader are generators yielding what to await, run by the asyncio
    # driver (drivers.adrive), as every protocol is: their decisions are plain code.

    def _writes(self) -> Steps[None]:
        """The writer task: what is pending, a batch per write, until nothing is."""
        try:
            while self._pending:
                batch = self._batch()
                if batch:
                    yield from self._write(batch)
        finally:
            self._writing = False

    def _write(self, batch: list[_Exchange], lead: bool = False) -> Steps[Any]:
        """One write of ``batch`` (a failure is its callers', as their replies'). ``lead``:
        when no reader runs on the connection, none is started, and the connection is
        returned: the caller reads (:meth:`_reading_replies` with its exchange)."""
        try:
            conn = yield from self._ready()
        except Exception as exc:  # nothing of this batch was written: unsent
            _fail(batch, exc, nothing_sent=True)
            yield from self._closed_if_retired()
            return None
        except BaseException:  # this task cancelled (its loop closing): so are the calls
            _fail(batch, None)
            raise
        # From here to the write, nothing is awaited: the batch is in flight on ``conn``
        # before any other task runs, and a reader reads that connection.
        commands = [command for exchange in batch for command in exchange.commands]
        self._in_flight.extend(batch)
        leads = False
        if self._reading is not conn:
            self._reading = conn
            # Entered for the reader now, not when it first reads: a write failing before
            # then must not leave the connection unused and give it back, then the reader
            # give it back again (a pool then hands it to two callers).
            self._enter(conn)
            if lead:
                leads = True
            else:
                self._start_reader(conn)
        self._enter(conn)
        try:
            yield from direct.sent(conn, self._pack(conn, commands))
        except BaseException as exc:  # some of it may have reached Redis: lost replies
            self._lost(conn, exc)
            if leads:  # the caller will not read: its reader's part ends here
                leads = False
                self._reading = None
                yield from self._leave(conn)
            if not isinstance(exc, Exception):
                raise
        finally:
            yield from self._leave(conn)
        return conn if leads else None

    def _start_reader(self, conn: Any) -> None:
        """A reader task for ``conn`` (already entered for it)."""
        # Held here: the loop keeps only a weak reference to a task, and a reader collected
        # mid-read would leave its callers waiting forever.
        self._reader = asyncio.get_running_loop().create_task(
            adrive(self._reading_replies(conn), AWAITED))
        self._reader.add_done_callback(_consume)

    def _ready(self) -> Steps[Any]:
        """The connection to write on: connected, and, when nothing is in flight on it,
        checked as the pool checks one it hands out (data waiting, or closed by the server,
        means a new connection)."""
        conn = self._conn
        if conn is not None and direct.closing(conn):
            # Closed by its timer (a reply late) or a failed write, its reader not yet told:
            # what is in flight there is lost; nothing of this batch was written there.
            yield from self._abandoned(conn)
            conn = None
        if conn is None:
            conn = self._conn = yield self._checkout()  # connected and checked by the pool
            return conn
        if not self._in_flight:
            yield lean.arefreshed(conn)
        return conn

    def _reading_replies(self, conn: Any, own: _Exchange | None = None) -> Steps[None]:
        """The reader of ``conn`` (entered by its starter): each reply to its caller, in
        order, while any is awaited there. ``own``: a caller reading for itself, until its
        own reply is in; what is still awaited then goes on in a reader task. Cancelled
        while reading, it reads nothing more and its reply is dropped: the read leaves the
        connection as it was (``disconnect_on_error=False``; redis-py's parsers keep what a
        cancelled read had taken in), so its batch-mates lose nothing."""
        # This connection's calls: once it is dropped (_lost), self._in_flight holds the next
        # connection's, and a reply still read here must not be taken for one of theirs.
        in_flight = self._in_flight
        deadline = self._deadline_of(conn)
        try:
            while self._conn is conn and in_flight and (own is None or not own.future.done()):
                exchange = in_flight[0]
                try:
                    if deadline is not None:
                        deadline.reading()
                        reply = yield direct.reply(conn)  # an error reply returned, not raised
                    elif own is None:
                        reply = yield conn.read_response()
                    else:
                        reply = yield conn.read_response(disconnect_on_error=False)
                except ResponseError as error:
                    reply = error
                except BaseException as exc:
                    if own is not None and isinstance(exc, asyncio.CancelledError):
                        own.future.cancel()  # its reply is read and dropped, by a reader task
                        raise
                    if deadline is not None:  # a timeout if its timer closed the socket
                        exc = deadline.failure(exc)
                    # A failed read, or a reader task cancelled (its loop closing): whatever
                    # is in flight on the connection is lost with it.
                    self._lost(conn, exc)
                    if own is not None and isinstance(exc, Exception):
                        # The failure reaches this caller as every other: through its future
                        # (raised here, that future's copy would never be retrieved).
                        return
                    raise
                exchange.replies.append(reply)
                if len(exchange.replies) == len(exchange.commands):
                    in_flight.popleft()
                    if not exchange.future.done():  # done: its caller was cancelled
                        exchange.future.set_result(exchange.replies)
        finally:
            if deadline is not None:
                deadline.started = math.inf  # no read waits now
            if own is not None and self._conn is conn and in_flight:
                self._start_reader(conn)  # this one's part on the connection passes to it
            else:
                if self._reading is conn:
                    self._reading = None
                yield from self._leave(conn)

    def retire(self) -> None:
        """Its cluster node left the table (a failover, a node removed): the connection is
        closed and given back now if idle, else once the calls in flight on it are answered,
        and again after any call made on it later (a caller that found it before)."""
        self._retired = True
        conn = self._conn
        if conn is None or self._writing or not self._unused(conn):
            return
        self._conn = None
        closing = asyncio.get_running_loop().create_task(adrive(self._dropped(conn), AWAITED))
        keep_running(closing)

    def _lost(self, conn: Any, failure: BaseException) -> None:
        """``conn`` failed: every exchange written on it (or being written) fails as a reply
        lost, and it is dropped (the next write opens another)."""
        if self._conn is not conn:
            return  # already dropped, by the other of the writer and the reader
        self._conn = None
        lost, self._in_flight = self._in_flight, deque()
        _fail(lost, failure if isinstance(failure, Exception) else None)

    def _enter(self, conn: Any) -> None:
        self._using[conn] = self._using.get(conn, 0) + 1

    def _leave(self, conn: Any) -> Steps[None]:
        left = self._using[conn] - 1
        if left:
            self._using[conn] = left
            return
        del self._using[conn]
        if conn is self._conn and self._retired and self._unused(conn):
            self._conn = None
        if conn is not self._conn:  # dropped: closed (what was sent on it is lost), given back
            yield from self._dropped(conn)

    def _closed_if_retired(self) -> Steps[None]:
        """A retired connection that failed to reconnect, with nothing in flight on it and no
        task using it, goes back to its pool (no later call may come to give it back)."""
        conn = self._conn
        if self._retired and conn is not None and self._unused(conn):
            self._conn = None
            yield from self._dropped(conn)

    def _unused(self, conn: Any) -> bool:
        """No task uses ``conn`` and no call waits to be written or answered: closing it (a
        retired connection) loses nothing."""
        return conn not in self._using and not self._pending and not self._in_flight

    def _deadline_of(self, conn: Any) -> direct.Deadline | None:
        deadlines = self._deadlines
        if deadlines is None:
            return None
        deadline = deadlines.get(conn)
        if deadline is None:
            deadline = deadlines[conn] = direct.Deadline(conn)
        return deadline

    def _abandoned(self, conn: Any) -> Steps[None]:
        """``conn``'s transport is closing: the calls in flight on it fail (a timeout, if its
        timer closed it), and it is given back unless a task still reads it (that one does)."""
        failure: BaseException = redis.ConnectionError(
            f"Connection to {direct.address(conn)} closed")
        deadline = self._deadlines.get(conn) if self._deadlines is not None else None
        if deadline is not None:
            failure = deadline.failure(failure)  # a timeout if its timer closed it
        self._lost(conn, failure)
        if conn not in self._using:
            yield from self._dropped(conn)

    def _dropped(self, conn: Any) -> Steps[None]:
        if self._deadlines is not None:
            deadline = self._deadlines.pop(conn, None)
            if deadline is not None:
                deadline.stop()
        try:
            yield conn.disconnect()
        finally:
            yield self.pool.release(conn)


class _Awaited:
    """The driver's transport for the writer and the reader: what they yield is awaited as
    it is."""

    @staticmethod
    def perform(operation: Any) -> Any:
        return operation

    @staticmethod
    def call(script: Any, command: tuple[Any, ...]) -> Any:  # pragma: no cover - never called
        raise NotImplementedError


AWAITED = _Awaited()


def _consume(task: asyncio.Task[None]) -> None:
    """A writer's or reader's failure is its callers' (each got it); nothing is left
    unretrieved."""
    if not task.cancelled():
        task.exception()
