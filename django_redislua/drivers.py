"""The two drivers: run any protocol (:mod:`django_redislua.protocol`) to its end, sync or asyncio.

A protocol yields operations; the driver has its transport perform each one and sends the
result back in, or throws the failure in at that point. Both drivers are the same loop; the
asyncio one awaits. What a failure means (an undo, a retry, an error for the caller) is the
protocol's to say, once, for both.

Cancellation (asyncio): the ``CancelledError`` is thrown into the protocol where it waits, like
any failure, and whatever the protocol then yields (its clean-up: a wait withdrawn, a lease
given back) runs to its end shielded from the cancellation, before the caller sees it; a second
cancellation leaves the clean-up running in the background (:func:`keep_running`).

A decision on the hot path is not a generator (a generator costs about a microsecond): a
:class:`Step` is an object with the script call to make and what its reply means, run by
:func:`drive_step` and :func:`adrive_step` without the protocol loop (:func:`stepped` makes it
a protocol, for a caller inside one).

The drivers take the transport to perform on; ``transport.run`` and ``transport.arun`` run a
protocol on the process's (or the running loop's) transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, TypeVar
from typing import Protocol as Interface

from django_redislua.protocol import Call, Protocol

T = TypeVar("T")


class Performer(Interface):
    """A transport, as the drivers see it (:mod:`django_redislua.transport`)."""

    def perform(self, operation: Any) -> Any: ...

    def call(self, script: Any, command: tuple[Any, ...]) -> Any: ...


def drive(protocol: Protocol[T], transport: Performer,
          failure: BaseException | None = None) -> T:
    """Run ``protocol`` to its end on the sync ``transport`` (``failure``: thrown in first)."""
    perform = transport.perform
    reply: Any = None
    while True:
        try:
            operation = protocol.send(reply) if failure is None else protocol.throw(failure)
        except StopIteration as end:
            return end.value  # type: ignore[no-any-return]
        reply = failure = None
        try:
            reply = perform(operation)
        except BaseException as exc:
            failure = exc


async def adrive(protocol: Protocol[T], transport: Performer,
                 failure: BaseException | None = None) -> T:
    """Run ``protocol`` to its end on the asyncio ``transport``."""
    perform = transport.perform
    # A cancellation can be lost on its way: before Python 3.12, asyncio.wait_for (redis-py
    # wraps socket reads and writes in it) returns instead of raising when the cancellation
    # arrives as the inner call finishes. A request counted by the task (3.11+) but never
    # raised here is raised after the operation, as if it had interrupted it.
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    requested = cancelling() if cancelling is not None else 0
    reply: Any = None
    while True:
        try:
            operation = protocol.send(reply) if failure is None else protocol.throw(failure)
        except StopIteration as end:
            return end.value  # type: ignore[no-any-return]
        reply = failure = None
        try:
            reply = await perform(operation)
            if cancelling is not None and cancelling() > requested:
                raise asyncio.CancelledError
        except asyncio.CancelledError as cancelled:
            rest = asyncio.ensure_future(adrive(protocol, transport, cancelled))
            try:
                await asyncio.shield(rest)  # raises what the protocol raised: the cancellation
            except asyncio.CancelledError:
                keep_running(rest)
                raise
            raise
        except BaseException as exc:
            failure = exc


class Step(Interface):
    """One script call and what its reply means, for :func:`drive_step` and :func:`adrive_step`.
    ``decided`` is the result when no call is needed; ``failed`` is what a failure means (a
    protocol that may undo, then raises)."""

    decided: Any
    script: Any
    command: tuple[Any, ...]

    def result(self, reply: Any) -> Any: ...

    def failed(self, failure: BaseException) -> Generator[Any, Any, Any]: ...


def drive_step(step: Step, transport: Performer) -> Any:
    """The sync driver for one :class:`Step`, without the protocol loop (the hot path)."""
    if step.decided is not None:
        return step.decided
    try:
        reply = transport.call(step.script, step.command)
    except BaseException as exc:
        return drive(step.failed(exc), transport)
    return step.result(reply)


def stepped(step: Step) -> Protocol[Any]:
    """``step`` as a protocol (what :func:`drive_step` does, for the asyncio driver)."""
    if step.decided is not None:
        return step.decided
    try:
        reply = yield Call(step.script, step.command)
    except BaseException as exc:
        return (yield from step.failed(exc))
    return step.result(reply)


async def adrive_step(step: Step, transport: Performer) -> Any:
    """The asyncio driver for one :class:`Step`, without the protocol loop: what
    :func:`adrive` does with :func:`stepped`, cancellation included (a cancellation met while
    the call is awaited, or lost on its way, runs the step's ``failed`` shielded)."""
    if step.decided is not None:
        return step.decided
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    requested = cancelling() if cancelling is not None else 0
    try:
        reply = await transport.call(step.script, step.command)
        if cancelling is not None and cancelling() > requested:
            raise asyncio.CancelledError
    except asyncio.CancelledError as cancelled:  # as adrive does: the clean-up shielded
        rest = asyncio.ensure_future(adrive(step.failed(cancelled), transport))
        try:
            await asyncio.shield(rest)  # raises what the step's protocol raised
        except asyncio.CancelledError:
            keep_running(rest)
            raise
        raise
    except BaseException as exc:
        return await adrive(step.failed(exc), transport)
    return step.result(reply)


# Tasks that must finish although the coroutine that started them is gone (a clean-up after a
# second cancellation, a renewal): kept here so the event loop does not collect them mid-flight.
_background: set[asyncio.Task[Any]] = set()


def keep_running(task: asyncio.Task[Any]) -> None:
    """Hold ``task`` until it ends, and consume its outcome (nobody awaits it any more).

    A task started while its loop shuts down (a wait cancelled by ``asyncio.run``'s clean-up)
    may never run: once that loop is closed it is dropped here, not held for the process's
    life (with its loop and its coroutine)."""
    for held in list(_background):  # a snapshot: other threads' loops add and discard too
        if held.get_loop().is_closed():
            _background.discard(held)
    _background.add(task)

    def done(finished: asyncio.Task[Any]) -> None:
        _background.discard(finished)
        if not finished.cancelled():
            finished.exception()

    task.add_done_callback(done)
