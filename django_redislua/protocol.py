"""What this app asks of Redis, as data: the operations a protocol yields, without any I/O.

Every operation of the app (a rate decision, each lock step, a semaphore permit, a recipe, a
request's skeleton) is written once, as a *protocol*: a generator that yields the operations
below and receives what each produced (a reply, a message, a handle), or has the failure thrown
into it at that point. A driver (:mod:`django_redislua.drivers`) runs any protocol, sync or
asyncio, over a transport (:mod:`django_redislua.transport`); so a protocol's decisions, undo,
metering and error mapping exist once, and sync and asyncio cannot drift apart.

A driver never abandons a protocol: a failure (a timeout, a dropped connection, a cancelled
task, KeyboardInterrupt) is thrown into it where it waits, and whatever it yields then (its
clean-up) is run before the failure reaches the caller. A protocol may therefore yield in
``except`` and ``finally`` blocks.

The script calls here (:func:`call`, :func:`call_groups`, :func:`call_replicated`) keep the one
rule every transport must: **a script is sent once**. A reply that may have been lost raises;
only replies that say the script did not run (NOSCRIPT, a missing function, and on a cluster
MOVED, ASK, TRYAGAIN, CLUSTERDOWN, or a connection that could not even be opened) lead to the
same script being sent again.

A protocol does no I/O and has no side effect of its own: the clock is read by yielding
:class:`Now`, a pause is a :class:`Pause`, a Redis failure is counted by yielding
:class:`Failed`. So a scripted transport and a virtual clock can drive any protocol
(``tests/unit/scripted.py``). This module imports neither Django nor redis-py nor the app's
metrics: the failure families it matches come from :mod:`django_redislua.failures`.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from typing import Protocol as Interface

from django_redislua.failures import families

if TYPE_CHECKING:
    from redis.exceptions import AskError

T = TypeVar("T")
Command = tuple[Any, ...]
KeyArg = str | bytes


class LuaScript(Interface):
    """What a protocol and a transport need of a script: its name (a Function's, a metric's
    label) and the command that loads it. :class:`django_redislua.scripts.Script` is one; the
    protocols do not import it (it calls a transport, which runs protocols)."""

    name: str

    def load_command(self) -> tuple[str, ...]: ...


# -- the operations ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Call:
    """One script call (``command``: :meth:`Script.head <django_redislua.scripts.Script.head>`,
    the number of keys, the keys, the arguments), sent once (see :func:`call_groups`).
    Produces its reply; an error reply is raised into the protocol."""

    script: LuaScript
    command: Command


@dataclass(frozen=True, slots=True)
class Send:
    """Each group's commands in one write on one connection of the server that holds the
    group's key (a cluster's primary for that slot; the only server otherwise), every group
    written before any reply is read, each command exactly once. ``address`` sends a group to
    that node instead (an ASK redirect). Produces, per group, the replies in order, an error
    reply as its exception."""

    groups: tuple[tuple[KeyArg | None, tuple[Command, ...]], ...]
    address: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Load:
    """Load a script (``command``: ``SCRIPT LOAD`` or ``FUNCTION LOAD REPLACE``) on every
    primary: one that lacks it has most likely lost every script (a restart, a flush, a new
    node), and so have the others. Produces None; an error reply raises."""

    command: Command


@dataclass(frozen=True, slots=True)
class Refresh:
    """The cluster's slot table is stale (a redirect, a failed node): read it again. Produces
    True when sending again may reach another server (a cluster), False on a single server."""


@dataclass(frozen=True, slots=True)
class Clustered:
    """Produces True when the transport is a cluster: keys of different slots then need one
    script call per slot (all-or-nothing holds per slot only)."""


@dataclass(frozen=True, slots=True)
class Execute:
    """One plain command through the redis-py client, with its own routing and retry policy:
    only for idempotent reads and deletes (EXISTS, HMGET, DEL, ZREM...). Produces its reply."""

    args: Command


@dataclass(frozen=True, slots=True)
class Pause:
    """Sleep ``seconds``; with ``wake``, a :class:`threading.Event` set meanwhile ends the
    sleep early on a thread (a task is cancelled instead). Produces None."""

    seconds: float
    wake: threading.Event | None = None


@dataclass(frozen=True, slots=True)
class Now:
    """Produces the monotonic clock's reading, in seconds (``time.monotonic()``)."""


@dataclass(frozen=True, slots=True)
class Failed:
    """A Redis failure of ``operation`` (a script's name), counted in
    ``redislua_redis_errors_total``. Produces None."""

    operation: str


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Subscribe to ``channel``. Produces a subscription handle for :class:`Listen` and
    :class:`Unsubscribe` (every protocol that subscribes unsubscribes, in ``finally``)."""

    channel: str


@dataclass(frozen=True, slots=True)
class Listen:
    """The next pub/sub message of ``subscription`` (its type, channel and data, as redis-py
    gives it), or None when ``timeout`` seconds pass first."""

    subscription: Any
    timeout: float


@dataclass(frozen=True, slots=True)
class Inbox:
    """A channel of the caller's own to be woken on (a lock's hand-off names it), subscribed:
    ``<prefix><token>``, on a thread kept from one wait to the next (no SUBSCRIBE, no
    UNSUBSCRIBE after the first wait), on asyncio for this wait alone (subscribed together with
    ``channel``, the primitive's own); where a transport cannot subscribe (it polls),
    ``channel``, token "". Produces a :class:`Mailbox`; every protocol that takes one gives it
    back with :class:`Unsubscribe` in ``finally``, unless it is ``kept``."""

    channel: str
    prefix: str


@dataclass(slots=True)
class Mailbox:
    """What :class:`Inbox` produces: the subscription to :class:`Listen` to, the channel its
    messages come on, the token a hand-off script turns into that channel ("" for the
    primitive's channel), whether the subscription is confirmed already, and whether it is
    ``kept`` (a thread's: it stays subscribed after the wait, nothing to give back, and the
    first wait that reads its confirmation marks it ``confirmed`` for the next ones)."""

    subscription: Any
    channel: str
    token: str
    confirmed: bool
    kept: bool = False


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    subscription: Any
    channel: str


@dataclass(frozen=True, slots=True)
class Invoke:
    """Call application code: ``sync(*args)`` on the sync driver; on the asyncio driver
    ``asynchronous(*args)`` when given (else ``sync``), awaited when it returns an awaitable.
    Produces what it returned."""

    sync: Callable[..., Any]
    args: tuple[Any, ...] = ()
    asynchronous: Callable[..., Any] | None = None


@dataclass(frozen=True, slots=True)
class Spawn:
    """Run ``protocol`` apart from the caller (a daemon thread, or a task of the running loop)
    until it ends or ``stop`` is set. Produces a handle for :class:`Join`."""

    protocol: Generator[Any, Any, Any] = field(repr=False)
    name: str
    stop: threading.Event


@dataclass(frozen=True, slots=True)
class Join:
    """Set the spawned protocol's stop event, wake it, and wait for its end (not when called
    from that protocol itself). Produces None."""

    spawned: Any


Operation = (Call | Send | Load | Refresh | Clustered | Execute | Pause | Now | Failed | Subscribe
             | Inbox | Listen | Unsubscribe | Invoke | Spawn | Join)
Protocol = Generator[Operation, Any, T]


# Failures a transport raised before sending anything (no connection could be opened: refused,
# unreachable, the handshake timed out; a slot the table does not cover): the same command may
# be sent elsewhere (a cluster that failed over). The exception keeps its type for the caller.
_unsent: weakref.WeakSet[BaseException] = weakref.WeakSet()


def unsent(failure: BaseException) -> BaseException:
    """Mark ``failure`` as raised before anything was sent; returns it."""
    _unsent.add(failure)
    return failure


def was_unsent(failure: BaseException) -> bool:
    return failure in _unsent


def raising(failure: BaseException) -> Protocol[NoReturn]:
    """A protocol that raises ``failure`` at once (a step's failure with nothing to undo)."""
    raise failure
    yield  # never reached; makes this a generator, a protocol like any other


def performed(operation: Operation) -> Protocol[Any]:
    """One operation as a protocol of its own (to hand to a helper that takes protocols)."""
    return (yield operation)


# -- undoing what a lost reply may have done ------------------------------------------------------

FIRST_RETRY = 0.05  # the first pause before sending an undo again; each next one doubles (<= 1 s)


def interrupted(failure: BaseException) -> bool:
    """A cancellation, KeyboardInterrupt or SystemExit: not an error of Redis or of the code."""
    return not isinstance(failure, Exception)


def retried(step: Callable[[], Protocol[T]], until_monotonic: float) -> Protocol[T | None]:
    """``step`` (safe to send again) until it lands, with back-off, or until the moment after
    which it no longer matters (what it gives back has expired by then): None then. A step
    whose connection was refused is not tried again: Redis is down, and what it would give
    back expires there by itself (a connection that timed out is a busy server, one another
    thread closed a busy client: tried again)."""
    delay = FIRST_RETRY
    while True:
        try:
            return (yield from step())
        except families().client as failure:
            refused = was_unsent(failure) and not isinstance(failure, families().busy)
            if refused or (yield Now()) + delay >= until_monotonic:
                return None
            yield Pause(delay)
            delay = min(delay * 2, 1.0)


def undone(failure: BaseException, giving_back: Protocol[Any], name: str) -> Protocol[None]:
    """After ``failure`` interrupted an operation whose last call may have taken something (a
    lock, a permit, a lease, a concurrency slot): ``giving_back`` it (by an id, so safe to send
    twice). After a Redis failure it goes on apart (a thread or a task): the caller must not
    wait another socket timeout for it; after anything else (a cancellation, an exception of
    the caller's code), before the failure reaches the caller."""
    if isinstance(failure, families().client):
        yield Spawn(giving_back, name, threading.Event())
    else:
        yield from giving_back


# -- script calls, written once for every transport and topology --------------------------------

# Replies that say the command did not run and another node (or a moment) may run it:
# families().redirects (MOVED, ASK, TRYAGAIN, CLUSTERDOWN).
# At most this many sends of one command that came back "not run" (a redirect, a missing
# script): a slot moving twice during one call is possible, a loop is not.
MOST_SENDS = 5
# A cluster answers CLUSTERDOWN on every node while a failed primary's replica is not promoted
# yet (a second or two): like redis-py, wait a quarter second, read the slot table again and
# send again, for at most this many sends (2.5 s), then raise (FAIL_OPEN decides).
CLUSTER_DOWN_SENDS = 10
CLUSTER_DOWN_PAUSE = 0.25
# A send that could not open a connection is tried once more after the slot table is read
# again (a primary that failed over): more would only add connect timeouts to an outage.
CONNECT_ATTEMPTS = 2
TRY_AGAIN_PAUSE = 0.05  # before sending again after TRYAGAIN (a slot migrating its keys)


MISSING = object()  # the reply of a send before this one that found the script missing


def missing(reply: object) -> bool:
    """The server lacks the script (NOSCRIPT) or the function (FCALL's "function not found")."""
    if reply is MISSING:
        return True
    if not isinstance(reply, Exception):
        return False
    known = families()
    return isinstance(reply, known.no_script) or (
        isinstance(reply, known.response) and "function not found" in str(reply).lower())


def call(script: LuaScript, command: Command, loaded_first: bool = False) -> Protocol[Any]:
    """What performing a :class:`Call` means, for transports without a shorter way."""
    return (yield from call_groups(script, [command], loaded_first=loaded_first))[0]


def call_groups(script: LuaScript, commands: Sequence[Command], after: Command | None = None,
                loaded_first: bool = False) -> Protocol[list[Any]]:
    """:func:`_call_groups`, each failure counted in ``redislua_redis_errors_total``."""
    try:
        return (yield from _call_groups(script, commands, after, loaded_first))
    except families().client:
        yield Failed(script.name)
        raise


def _call_groups(script: LuaScript, commands: Sequence[Command], after: Command | None,
                 loaded_first: bool) -> Protocol[list[Any]]:
    """Several script calls, each routed by its first key and sent once; on a cluster every
    node's share is written before any reply is read (one round trip per node, overlapped).
    With ``after`` (a ``WAIT``), each call is followed by it on the same connection and its
    reply is ``(script reply, after's reply)``. The first error reply is raised once every
    call was answered. Where the script was missing, it is loaded (on every primary) and the
    calls that found it missing are sent again; ``loaded_first``: a first send found it missing
    already."""
    replies: list[Any] = [MISSING if loaded_first else None] * len(commands)
    todo = list(range(len(commands)))
    sends = down = 0
    while True:
        sends += 1
        if any(missing(replies[i]) for i in todo):
            yield Load(script.load_command())
        groups: dict[KeyArg | None, list[int]] = {}
        for i in todo:
            groups.setdefault(_first_key(commands[i]), []).append(i)
        batches = tuple(
            (key, tuple(part for i in members
                        for part in (commands[i], *((after,) if after is not None else ()))))
            for key, members in groups.items()
        )
        try:
            answered: list[list[Any]] = yield Send(batches)
        except families().client as failure:
            if not was_unsent(failure):
                yield from _refresh_quietly()  # the next call finds a server that took over
                raise
            if sends >= CONNECT_ATTEMPTS or not (yield Refresh()):
                raise
            continue
        chunk = 1 if after is None else 2
        for members, group_replies in zip(groups.values(), answered, strict=True):
            for n, i in enumerate(members):
                reply = group_replies[chunk * n]
                if after is not None and not isinstance(reply, Exception):
                    reply = (reply, group_replies[chunk * n + 1])
                replies[i] = reply
        known = families()
        todo = [i for i in todo
                if missing(replies[i]) or isinstance(replies[i], known.redirects)]
        down += any(isinstance(replies[i], known.cluster_down) for i in todo)
        if not todo or sends - down >= MOST_SENDS or down >= CLUSTER_DOWN_SENDS:
            break
        for i in [i for i in todo if _asked(replies[i])]:
            replies[i] = yield from _asking(script, commands[i], after, replies[i])
            todo.remove(i)
        if not todo:
            break
        if any(isinstance(replies[i], known.cluster_down) for i in todo):
            yield Pause(CLUSTER_DOWN_PAUSE)
        elif any(isinstance(replies[i], known.try_again) for i in todo):
            yield Pause(TRY_AGAIN_PAUSE)
        if any(isinstance(replies[i], known.moved + known.cluster_down) for i in todo):
            yield Refresh()
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _asked(reply: object) -> bool:
    """An ASK redirect (redis-py's MovedError is an AskError too: a MOVED is not one)."""
    known = families()
    return isinstance(reply, known.ask) and not isinstance(reply, known.moved)


def _first_key(command: Command) -> KeyArg | None:
    return command[3] if command[2] else None


def _asking(script: LuaScript, command: Command, after: Command | None, ask: AskError
            ) -> Protocol[Any]:
    """Send one call to the node an ASK redirect names, after ``ASKING``, on one connection
    (the script loaded first when it is missing there)."""
    group: tuple[Command, ...] = (("ASKING",), command, *((after,) if after is not None else ()))
    asked = Send(((None, group),), address=(ask.host, ask.port))
    replies: list[Any] = (yield asked)[0]
    if missing(replies[1]):
        yield Load(script.load_command())
        replies = (yield asked)[0]
    reply = replies[1]
    if isinstance(reply, Exception) or after is None:
        return reply
    return (reply, replies[2])


def _refresh_quietly() -> Protocol[None]:
    with contextlib.suppress(*families().redis_or_socket):
        yield Refresh()


def call_replicated(script: LuaScript, command: Command, replicas: int, timeout_ms: int
                    ) -> Protocol[tuple[Any, int]]:
    """The script call, then ``WAIT replicas timeout_ms`` on the same connection (WAIT counts
    the writes of its own connection) in the same write: ``(reply, replicas that acknowledged
    its writes)``."""
    reply, acked = (yield from call_groups(script, [command], ("WAIT", replicas, timeout_ms)))[0]
    if isinstance(acked, Exception):
        raise acked
    return reply, int(acked)
