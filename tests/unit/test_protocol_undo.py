"""Undoing what a lost reply may have done (protocol.retried, undone) and the small protocols
(performed, raising, interrupted), driven by scripted replies in virtual time."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis

from django_redislua import exchange, protocol
from django_redislua.connection import TornDown
from django_redislua.drivers import drive
from django_redislua.protocol import (
    FIRST_RETRY,
    Execute,
    Now,
    Pause,
    Spawn,
    interrupted,
    performed,
    raising,
    retried,
    undone,
)
from tests.unit.scripted import After, Scripted, Unsent, names

GIVE_BACK = Execute(("DEL", "held"))


def giving_back() -> protocol.Protocol[Any]:
    return performed(GIVE_BACK)


def test_a_give_back_that_lands_at_once_is_sent_once() -> None:
    transport = Scripted([1])
    assert drive(retried(giving_back, transport.clock.now + 10), transport) == 1
    assert transport.log == [GIVE_BACK]


def test_a_give_back_is_sent_again_with_doubling_pauses_until_it_lands() -> None:
    lost = [redis.TimeoutError("lost")] * 7
    transport = Scripted([*lost, 1])
    started = transport.clock.now
    assert drive(retried(giving_back, started + 60), transport) == 1
    pauses = [op.seconds for op in transport.log if isinstance(op, Pause)]
    assert pauses == [FIRST_RETRY, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]  # doubling, at most 1 s
    assert names(transport.log) == ["Execute", "Now", "Pause"] * 7 + ["Execute"]
    assert transport.clock.now - started == pytest.approx(sum(pauses))


def test_a_give_back_stops_once_what_it_gives_back_has_expired() -> None:
    transport = Scripted([redis.ConnectionError("lost")] * 3)
    started = transport.clock.now
    # Expires 0.3 s on: tried at 0, 0.05 and 0.15; the next pause (0.2) would end past it.
    assert drive(retried(giving_back, started + 0.3), transport) is None
    assert names(transport.log) == ["Execute", "Now", "Pause", "Execute", "Now", "Pause",
                                    "Execute", "Now"]
    assert transport.clock.now - started == pytest.approx(0.15)


def test_time_a_give_back_spends_waiting_for_its_reply_counts_against_its_deadline() -> None:
    transport = Scripted([After(5.0, redis.TimeoutError("lost"))])
    assert drive(retried(giving_back, transport.clock.now + 5.0), transport) is None
    assert names(transport.log) == ["Execute", "Now"]


def test_a_refused_give_back_is_not_tried_again() -> None:
    transport = Scripted([Unsent(redis.ConnectionError("Connection refused"))])
    assert drive(retried(giving_back, transport.clock.now + 60), transport) is None
    assert transport.log == [GIVE_BACK]  # not even the clock is read


@pytest.mark.parametrize("busy", [redis.TimeoutError("connect timed out"),
                                  TornDown("closed by another thread")])
def test_a_busy_server_is_tried_again_though_nothing_was_sent(busy: BaseException) -> None:
    transport = Scripted([Unsent(busy), 1])
    assert drive(retried(giving_back, transport.clock.now + 60), transport) == 1
    assert transport.log == [GIVE_BACK, Now(), Pause(FIRST_RETRY), GIVE_BACK]


@pytest.mark.parametrize("failure", [ValueError("a bug"), KeyboardInterrupt()])
def test_a_give_back_raises_what_is_not_a_redis_failure(failure: BaseException) -> None:
    transport = Scripted([failure])
    with pytest.raises(type(failure)):
        drive(retried(giving_back, transport.clock.now + 60), transport)
    assert transport.log == [GIVE_BACK]


def test_after_a_redis_failure_the_give_back_goes_on_apart() -> None:
    transport = Scripted([1])
    back = giving_back()
    drive(undone(redis.TimeoutError("lost"), back, "unit-undo"), transport)
    assert names(transport.log) == ["Spawn"]
    spawn = transport.log[0]
    assert isinstance(spawn, Spawn) and spawn.name == "unit-undo" and spawn.protocol is back
    assert isinstance(spawn.stop, threading.Event) and not spawn.stop.is_set()
    assert drive(transport.spawned[0].protocol, transport) == 1  # the background, run now
    assert transport.log[1:] == [GIVE_BACK]


@pytest.mark.parametrize("failure", [asyncio.CancelledError(), KeyboardInterrupt(),
                                     ValueError("the caller's own code failed")])
def test_after_anything_else_the_give_back_runs_before_the_failure_reaches_the_caller(
        failure: BaseException) -> None:
    transport = Scripted([1])
    drive(undone(failure, giving_back(), "unit-undo"), transport)
    assert transport.log == [GIVE_BACK]
    assert not transport.spawned


def test_performed_is_one_operation() -> None:
    transport = Scripted([b"v"])
    assert drive(performed(Execute(("GET", "k"))), transport) == b"v"
    assert transport.log == [Execute(("GET", "k"))]


def test_raising_raises_before_asking_for_anything() -> None:
    failure = ValueError("x")
    transport = Scripted()
    with pytest.raises(ValueError) as raised:
        drive(raising(failure), transport)
    assert raised.value is failure and transport.log == []


@pytest.mark.parametrize(("failure", "expected"), [
    (asyncio.CancelledError(), True), (KeyboardInterrupt(), True), (SystemExit(1), True),
    (ValueError("x"), False), (redis.ConnectionError("x"), False),
])
def test_interrupted(failure: BaseException, expected: bool) -> None:
    assert interrupted(failure) is expected


def test_a_failure_is_unsent_only_once_marked_so() -> None:
    failure = redis.ConnectionError("refused")
    assert not protocol.was_unsent(failure)
    assert protocol.unsent(failure) is failure
    assert protocol.was_unsent(failure)


@pytest.mark.parametrize("failure", [
    redis.ConnectionError("refused"), redis.TimeoutError("handshake"),
    OSError(9, "Bad file descriptor")])
def test_a_connection_that_cannot_be_taken_sent_nothing(failure: BaseException) -> None:
    """Whatever taking a connection raises is marked as sending nothing (so a cluster may send
    the call elsewhere, FAIL_OPEN decides): redis-py's errors as they are, a socket's own
    OSError (which the mark cannot hold) as redis-py's ConnectionError."""

    class Failing:
        def take(self) -> Any:
            raise failure

    with pytest.raises((redis.ConnectionError, redis.TimeoutError)) as raised:
        exchange.opened(Failing())
    assert protocol.was_unsent(raised.value)
    assert raised.value is failure or raised.value.__cause__ is failure


def test_a_pools_poll_of_a_socket_closed_meanwhile_sent_nothing() -> None:
    """redis-py's check of a pooled connection polls its socket object; closed meanwhile by
    another thread (descriptor -1) that is a ValueError raised in redis-py's parsers: a lost
    connection that sent nothing, not an error of the caller's."""
    import socket

    import redis._parsers.hiredis

    can_read = getattr(redis._parsers.hiredis, "_socket_can_read", None)
    if can_read is None:
        pytest.skip(f"redis-py {redis.__version__} polls elsewhere")
    closed = socket.socket()
    closed.close()

    class Checking:
        def take(self) -> Any:
            return can_read(closed, 0)

    with pytest.raises(redis.ConnectionError, match="closed while in use") as raised:
        exchange.opened(Checking())
    assert protocol.was_unsent(raised.value)
