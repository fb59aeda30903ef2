"""An operation interrupted wherever it waits gives back what it may hold, in order, before the
interruption reaches the caller: a Semaphore acquire (a first try, a wait woken by a release, a
second try) cancelled (asyncio) or interrupted (Ctrl-C) at each of its operations in turn. The
wait is unsubscribed first, then the permit (granted, perhaps, by a call whose reply was never
read) is given back by its id."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from django_redislua.drivers import adrive, drive
from django_redislua.locks.semaphore import ACQUIRE, RELEASE, Semaphore
from django_redislua.protocol import Call, Subscribe, Unsubscribe
from tests.unit.scripted import SCRIPTED, AsyncScripted, Scripted, names

RELEASED = {"type": "message", "data": "released"}


def semaphore() -> Semaphore:
    return Semaphore("unit", limit=1, timeout=30)  # waits without a deadline


def answers(sem: Semaphore) -> list[Any]:
    """One acquire's answers: refused (a permit frees in 2 s), subscribed, refused again, woken
    by a release, granted."""
    channel = sem.keys.channel
    return [[[[0, 2000]]], {"type": "subscribe", "channel": channel, "data": 1}, [[[0, 2000]]],
            {**RELEASED, "channel": channel}, [[[1, 0]]]]


def whole_acquire() -> list[Any]:
    """The operations of an acquire that was not interrupted."""
    sem = semaphore()
    transport = Scripted([answer for answer in answers(sem)])
    assert drive(sem._acquiring(None, None), transport) is True
    return transport.log


WHOLE = whole_acquire()


def test_the_acquire_this_module_interrupts() -> None:
    assert names(WHOLE) == ["Call", "Send", "Subscribe", "Now", "Listen", "Call", "Send", "Now",
                            "Listen", "Call", "Send", "Unsubscribe"]


def scripted_for(sem: Semaphore, at: int) -> list[Any]:
    """The answers of the operations before ``at``, then the give-back's reply."""
    answered = sum(isinstance(op, SCRIPTED) for op in WHOLE[:at])
    return [*answers(sem)[:answered], [[1]]]


def check_given_back(log: list[Any], at: int, sem: Semaphore) -> None:
    assert names(log[:at + 1]) == names(WHOLE[:at + 1])
    # Subscribed before the interruption, and not unsubscribed yet (or interrupted while it was).
    subscribed = (any(isinstance(op, Subscribe) for op in WHOLE[:at])
                  and not any(isinstance(op, Unsubscribe) for op in WHOLE[:at + 1]))
    rest = log[at + 1:]
    expected = ["Unsubscribe"] * subscribed + ["Call", "Send"]
    assert names(rest) == expected
    give_back = rest[-2]
    assert isinstance(give_back, Call) and give_back.script.name == RELEASE
    acquired = next(op for op in log if isinstance(op, Call))
    assert acquired.script.name == ACQUIRE
    permit = acquired.command[4]  # the permit's id: keys, then [permit, limit, ms]
    assert give_back.command[3:5] == (sem.keys.base, permit)
    if subscribed:
        assert rest[0] == Unsubscribe(f"subscription:{sem.keys.channel}", sem.keys.channel)


@pytest.mark.parametrize("at", range(len(WHOLE)))
def test_an_acquire_interrupted_anywhere_gives_its_permit_back_before_raising(at: int) -> None:
    sem = semaphore()
    transport = Scripted(scripted_for(sem, at), interrupt_at=at)
    with pytest.raises(KeyboardInterrupt):
        drive(sem._acquiring(None, None), transport)
    assert not transport.script
    check_given_back(transport.log, at, sem)


@pytest.mark.parametrize("at", range(len(WHOLE)))
async def test_an_acquire_cancelled_anywhere_gives_its_permit_back_before_raising(
        at: int) -> None:
    sem = semaphore()
    transport = AsyncScripted(scripted_for(sem, at), cancel_at=at)
    task = asyncio.ensure_future(adrive(sem._acquiring(None, None), transport))
    await transport.reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not transport.script
    check_given_back(transport.log, at, sem)
