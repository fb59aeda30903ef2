"""A scripted transport and a virtual clock: any protocol driven with no Redis and no waiting.

In the spirit of h11's ``tests/helpers.py`` (feed the protocol, read what it asks for) and
httpcore's ``_backends/mock.py`` (a network that answers from a script): :class:`Scripted` is a
transport for the real drivers (:func:`django_redislua.drivers.drive` and ``adrive``). Every
operation a protocol yields is appended to ``log``; what only Redis could answer (a send, a
load, a slot-table refresh, a plain command, a pub/sub message) is answered by the next entry
of the script, in order:

- a value is the operation's result;
- an exception instance is raised where the protocol waits (``Unsent(exc)``: raised, marked as
  sent nowhere, like a connection that could not be opened);
- ``After(seconds, answer)``: the virtual clock moves ``seconds`` on, then ``answer``;
- ``Doing(action, answer)``: ``action()`` runs (a stop event set meanwhile), then ``answer``;
- on asyncio only: ``Hang()``, the operation never completes (until the task is cancelled);
  ``Held(event, answer)``, the answer once ``event`` is set; ``Swallowed(answer)``, the task is
  cancelled during the operation, which loses the cancellation and answers.

What needs no Redis is performed at once, in virtual time: ``Now`` reads :class:`Clock`,
``Pause`` moves it on (a wake event already set ends it at once), ``Listen`` answered None
(no message) moves it on by the wait's timeout, ``Failed`` is only logged, ``Invoke`` calls the
code, ``Spawn`` keeps the protocol in ``spawned`` for the test to drive (in the background, as
a test sees it: deterministically, when the test says), ``Join`` sets its stop event.
``Call`` is what it means for a transport without a shorter way: :func:`protocol.call`,
driven on this same transport (its sends are answered by the script).

Interruptions at a chosen point: ``Scripted(interrupt_at=i)`` raises KeyboardInterrupt at the
i-th operation (sync), ``AsyncScripted(cancel_at=i)`` suspends there until the test cancels
the task; so a test can try every point a protocol waits at.

A script that runs out, or an operation nobody scripted, fails the test at once (``Unscripted``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django_redislua import protocol
from django_redislua.drivers import adrive, drive
from django_redislua.protocol import (
    Call,
    Clustered,
    Execute,
    Failed,
    Inbox,
    Invoke,
    Join,
    Listen,
    Load,
    Mailbox,
    Now,
    Pause,
    Refresh,
    Send,
    Spawn,
    Subscribe,
    Unsubscribe,
)

# Operations only Redis can answer: each takes the script's next entry.
SCRIPTED = (Send, Load, Refresh, Clustered, Execute, Listen)


class Unscripted(AssertionError):
    """The protocol asked for something the script does not answer."""


@dataclass
class Clock:
    """Virtual monotonic time, in seconds."""

    now: float = 1000.0

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self.now += seconds


@dataclass(frozen=True)
class Unsent:
    """Raise ``failure`` as a transport does when it could not even open a connection."""

    failure: BaseException


@dataclass(frozen=True)
class After:
    """The answer after ``seconds`` of virtual time."""

    seconds: float
    answer: Any


@dataclass(frozen=True)
class Doing:
    """Run ``action()`` (the world changing meanwhile: a stop event set), then ``answer``."""

    action: Callable[[], object]
    answer: Any


@dataclass(frozen=True)
class Hang:
    """An operation that never completes (asyncio): a cancellation is the only way out."""


@dataclass(frozen=True)
class Held:
    """The answer once ``event`` is set (asyncio): an operation that takes a while, which a
    second cancellation does not end when it is shielded."""

    event: asyncio.Event
    answer: Any


@dataclass(frozen=True)
class Swallowed:
    """The answer, after the task was cancelled during the operation and the operation
    swallowed the cancellation (asyncio): what Python 3.11's ``asyncio.wait_for``, which
    redis-py wraps socket reads in, does when the cancellation meets the read's end."""

    answer: Any


@dataclass
class Spawned:
    """A protocol the driver would have run apart: the test drives it (``drive``/``adrive``)."""

    protocol: Any
    name: str
    stop: Any


@dataclass
class Scripted:
    """The sync transport: ``perform`` answers each operation (see the module docstring).
    ``interrupt_at``: the operation of that index in ``log`` raises KeyboardInterrupt instead
    (its answer is not taken), as a Ctrl-C there would."""

    script: list[Any] = field(default_factory=list)
    clock: Clock = field(default_factory=Clock)
    interrupt_at: int | None = None
    log: list[Any] = field(default_factory=list)
    spawned: list[Spawned] = field(default_factory=list)
    _tokens: Iterator[int] = field(default_factory=itertools.count)

    def perform(self, operation: Any) -> Any:
        if self.stopped(operation):
            raise KeyboardInterrupt
        if isinstance(operation, Call):
            return drive(protocol.call(operation.script, operation.command), self)
        return self.performed(operation)

    def call(self, script: Any, command: tuple[Any, ...]) -> Any:
        """The hot path's ``transport.call`` (``drive_step``): performed as a Call."""
        return self.perform(Call(script, command))

    def stopped(self, operation: Any) -> bool:
        """Log ``operation``; whether it is the one to interrupt."""
        self.log.append(operation)
        return len(self.log) - 1 == self.interrupt_at

    def performed(self, operation: Any) -> Any:
        """The script's next answer to an operation only Redis answers; else what performing
        it means here, in virtual time."""
        if isinstance(operation, SCRIPTED):
            if not self.script:
                raise Unscripted(f"no answer scripted for {operation!r}")
            return self.answered(operation, self.script.pop(0))
        handler: Callable[[Any], Any] | None = getattr(
            self, f"_{type(operation).__name__.lower()}", None)
        if handler is None:
            raise Unscripted(f"nothing performs {operation!r} here")
        return handler(operation)

    def answered(self, operation: Any, answer: Any) -> Any:
        if isinstance(answer, After):
            self.clock.advance(answer.seconds)
            return self.answered(operation, answer.answer)
        if isinstance(answer, Doing):
            answer.action()
            return self.answered(operation, answer.answer)
        if isinstance(answer, Unsent):
            raise protocol.unsent(answer.failure)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, (Hang, Held, Swallowed)):
            raise Unscripted(f"{answer!r} is for the asyncio transport")
        if isinstance(operation, Listen) and answer is None:
            self.clock.advance(operation.timeout)  # no message: the whole wait passed
        return answer

    # what needs no Redis, in virtual time
    def _now(self, op: Now) -> float:
        return self.clock.now

    def _pause(self, op: Pause) -> None:
        if op.wake is None or not op.wake.is_set():
            self.clock.advance(op.seconds)

    def _failed(self, op: Failed) -> None:
        return None

    def _invoke(self, op: Invoke) -> Any:
        return op.sync(*op.args)

    def _spawn(self, op: Spawn) -> Spawned:
        spawned = Spawned(op.protocol, op.name, op.stop)
        self.spawned.append(spawned)
        return spawned

    def _join(self, op: Join) -> None:
        op.spawned.stop.set()

    def _subscribe(self, op: Subscribe) -> str:
        return f"subscription:{op.channel}"

    def _inbox(self, op: Inbox) -> Mailbox:
        token = f"t{next(self._tokens)}"
        return Mailbox(f"subscription:{op.prefix}{token}", f"{op.prefix}{token}", token,
                       confirmed=False)

    def _unsubscribe(self, op: Unsubscribe) -> None:
        return None


@dataclass
class AsyncScripted(Scripted):
    """The asyncio transport: ``perform`` returns an awaitable, which completes without
    suspending (as a scripted answer may), but for ``Hang()`` and ``cancel_at`` (the operation
    of that index in ``log``): those suspend until the task is cancelled, and set ``reached``
    first, so the test knows when to cancel."""

    cancel_at: int | None = None
    reached: asyncio.Event = field(default_factory=asyncio.Event)

    def perform(self, operation: Any) -> Any:
        return self._performing(operation)

    async def _performing(self, operation: Any) -> Any:
        self.log.append(operation)
        first = self.script[0] if isinstance(operation, SCRIPTED) and self.script else None
        if isinstance(first, Hang):
            self.script.pop(0)
        if isinstance(first, Hang) or len(self.log) - 1 == self.cancel_at:
            self.reached.set()
            await asyncio.Event().wait()  # only a cancellation ends it
        if isinstance(first, Held):
            await first.event.wait()
            self.script[0] = first.answer
        elif isinstance(first, Swallowed):
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):  # lost on its way, as
                await asyncio.sleep(0)  # wait_for can lose it
            self.script[0] = first.answer
        if isinstance(operation, Call):
            return await adrive(protocol.call(operation.script, operation.command), self)
        if isinstance(operation, Invoke):
            result = (operation.asynchronous or operation.sync)(*operation.args)
            return await result if inspect.isawaitable(result) else result
        return self.performed(operation)


def names(log: Iterable[Any]) -> list[str]:
    """The operations' kinds, in order: ``["Send", "Load", "Send"]``."""
    return [type(operation).__name__ for operation in log]


@dataclass(frozen=True)
class FakeScript:
    """What the script calls need of a :class:`~django_redislua.scripts.Script`: its name and
    how to load it."""

    name: str = "unit.script"

    def load_command(self) -> tuple[str, ...]:
        return ("SCRIPT LOAD", f"-- {self.name}")


def command(*keys: str, args: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """A script call as :meth:`Script.command` makes it: head, number of keys, keys, args."""
    return ("EVALSHA", "0" * 40, len(keys), *keys, *args)
