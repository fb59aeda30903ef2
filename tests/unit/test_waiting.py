"""A wait woken by Redis (locks.waiting.until), in virtual time: subscribed and confirmed before
the first try, sleeping until a message or the state's own change (a lease's end), never past
the caller's deadline, unsubscribed however it ends."""

from __future__ import annotations

import math
from typing import Any

import pytest

from django_redislua.drivers import drive
from django_redislua.locks.waiting import LONGEST_SLEEP, OnMessage, until
from django_redislua.protocol import (
    Execute,
    Inbox,
    Listen,
    Mailbox,
    Now,
    Protocol,
    Subscribe,
    Unsubscribe,
    performed,
)
from tests.unit.scripted import After, Scripted, names

CHANNEL = "lock:ch"
SUB = f"subscription:{CHANNEL}"
TRY = Execute(("TRY",))
CONFIRMED = {"type": "subscribe", "channel": CHANNEL, "data": 1}
RELEASED = {"type": "message", "channel": CHANNEL, "data": "released"}


def attempt() -> Protocol[float | None]:
    """One try: None when it succeeded, else the seconds after which the state changes."""
    return performed(TRY)


def waited(script: list[Any], deadline_in: float | None = None,
           on_message: OnMessage | None = None) -> tuple[bool, Scripted, float]:
    """``until`` on CHANNEL, driven to its end: (its result, the transport, seconds it took)."""
    transport = Scripted(script)
    started = transport.clock.now
    deadline = None if deadline_in is None else started + deadline_in
    result = drive(until(CHANNEL, attempt, deadline, on_message), transport)
    assert not transport.script, f"answers left unused: {transport.script}"
    return result, transport, transport.clock.now - started


def test_a_first_try_that_succeeds_ends_the_wait_after_subscribing_first() -> None:
    result, transport, took = waited([CONFIRMED, None])
    assert result is True and took == 0
    assert transport.log == [Subscribe(CHANNEL), Now(), Listen(SUB, 1.0), TRY,
                             Unsubscribe(SUB, CHANNEL)]


def test_an_unconfirmed_subscription_is_waited_for_at_most_a_second_then_tried_anyway() -> None:
    other = {"type": "subscribe", "channel": "another", "data": 1}
    result, transport, took = waited([After(0.4, other), None, None])
    assert result is True
    assert transport.log[:5] == [Subscribe(CHANNEL), Now(), Listen(SUB, 1.0), Now(),
                                 Listen(SUB, pytest.approx(0.6))]
    assert transport.log[5:] == [Now(), TRY, Unsubscribe(SUB, CHANNEL)]
    assert took == pytest.approx(1.0)


def test_the_subscription_is_not_waited_for_past_the_caller_s_deadline() -> None:
    result, transport, _took = waited([CONFIRMED, None], deadline_in=0.3)
    assert result is True
    assert transport.log[2] == Listen(SUB, pytest.approx(0.3))


def test_a_wait_sleeps_until_the_state_changes_by_itself_then_tries_again() -> None:
    # The lease ends in 2.5 s: no message comes; the second try takes it.
    result, transport, took = waited([CONFIRMED, 2.5, None, None])
    assert result is True
    assert transport.log[3:] == [TRY, Now(), Listen(SUB, 2.5), Now(), TRY,
                                 Unsubscribe(SUB, CHANNEL)]
    assert took == pytest.approx(2.5)


def test_a_message_wakes_the_wait_at_once() -> None:
    result, transport, took = waited([CONFIRMED, math.inf, After(0.2, RELEASED), None])
    assert result is True
    assert names(transport.log[3:]) == ["Execute", "Now", "Listen", "Execute", "Unsubscribe"]
    assert transport.log[5] == Listen(SUB, LONGEST_SLEEP)  # a state without end: re-checked
    assert took == pytest.approx(0.2)


def test_a_wait_ends_false_at_its_deadline_and_unsubscribes() -> None:
    result, transport, took = waited([CONFIRMED, math.inf, None, math.inf], deadline_in=5.0)
    assert result is False
    assert transport.log[3:] == [TRY, Now(), Listen(SUB, 5.0), Now(), TRY, Now(),
                                 Unsubscribe(SUB, CHANNEL)]
    assert took == pytest.approx(5.0)


def test_a_wait_whose_deadline_passed_during_a_try_does_not_sleep() -> None:
    result, transport, _took = waited([CONFIRMED, After(2.0, 1.0)], deadline_in=1.0)
    assert result is False
    assert names(transport.log[3:]) == ["Execute", "Now", "Unsubscribe"]


def test_a_message_on_another_channel_is_slept_through() -> None:
    stale = {"type": "message", "channel": "lock:old-inbox", "data": "released"}
    result, transport, took = waited([CONFIRMED, 3.0, After(1.0, stale), None, None])
    assert result is True
    assert transport.log[5:9] == [Listen(SUB, 3.0), Now(), Listen(SUB, pytest.approx(2.0)),
                                  Now()]
    assert took == pytest.approx(3.0)


def test_on_message_true_ends_the_wait_without_another_try() -> None:
    seen: list[str] = []

    def granted(data: str) -> bool:
        seen.append(data)
        return True

    result, transport, _took = waited(
        [CONFIRMED, 5.0, {"type": b"message", "channel": CHANNEL.encode(), "data": b"yours"}],
        on_message=granted)
    assert result is True and seen == ["yours"]
    assert names(transport.log[3:]) == ["Execute", "Now", "Listen", "Unsubscribe"]


def test_on_message_false_sleeps_on_to_the_same_moment() -> None:
    result, transport, took = waited([CONFIRMED, 4.0, After(1.5, RELEASED), None, None],
                                     on_message=lambda data: False)
    assert result is True
    assert transport.log[7] == Listen(SUB, pytest.approx(2.5))
    assert took == pytest.approx(4.0)


def test_on_message_seconds_shorten_the_sleep() -> None:
    # An offer to another waiter that runs out in 0.5 s if unconfirmed: try again then.
    result, transport, took = waited([CONFIRMED, 4.0, After(1.0, RELEASED), None, None],
                                     on_message=lambda data: 0.5)
    assert result is True
    assert transport.log[7] == Listen(SUB, pytest.approx(0.5))
    assert took == pytest.approx(1.5)


def test_on_message_seconds_never_stretch_past_the_deadline() -> None:
    result, _transport, took = waited([CONFIRMED, 4.0, After(1.0, RELEASED), None, 4.0],
                                      deadline_in=2.0, on_message=lambda data: 30.0)
    assert result is False
    assert took == pytest.approx(2.0)


def test_a_long_wait_is_cut_into_sleeps_of_at_most_longest_sleep() -> None:
    result, transport, _took = waited([CONFIRMED, 3600.0, None, None])
    assert result is True
    listens = [op.timeout for op in transport.log[3:] if isinstance(op, Listen)]
    assert listens == [LONGEST_SLEEP]


def test_a_wait_on_a_kept_inbox_confirms_it_once_and_leaves_it_subscribed() -> None:
    box = Mailbox("kept-subscription", "inbox:k", "k", confirmed=False, kept=True)
    transport = Scripted([{"type": "subscribe", "channel": "inbox:k", "data": 1}, None])
    transport._inbox = lambda op: box  # type: ignore[method-assign]
    told: list[Mailbox] = []
    assert drive(until(Inbox(CHANNEL, "inbox:"), attempt, None, on_inbox=told.append),
                 transport) is True
    assert told == [box] and box.confirmed  # the next wait on it reads no confirmation
    assert transport.log == [Inbox(CHANNEL, "inbox:"), Now(), Listen("kept-subscription", 1.0),
                             TRY]  # and no Unsubscribe: the inbox stays subscribed


def test_a_wait_on_an_inbox_of_its_own_gives_it_back() -> None:
    transport = Scripted([{"type": "subscribe", "channel": "inbox:t0", "data": 1}, None])
    assert drive(until(Inbox(CHANNEL, "inbox:"), attempt, None), transport) is True
    assert transport.log[-1] == Unsubscribe("subscription:inbox:t0", "inbox:t0")


def test_a_confirmed_inbox_is_not_confirmed_again() -> None:
    transport = Scripted([None])
    confirmed = Mailbox("kept-subscription", "inbox:k", "k", confirmed=True, kept=True)
    transport._inbox = lambda op: confirmed  # type: ignore[method-assign]
    assert drive(until(Inbox(CHANNEL, "inbox:"), attempt, None), transport) is True
    assert names(transport.log) == ["Inbox", "Execute"]


@pytest.mark.parametrize("at", range(7))
def test_an_interrupted_wait_unsubscribes_wherever_it_was(at: int) -> None:
    script = [CONFIRMED, 2.0, None, None]
    transport = Scripted(list(script), interrupt_at=at)
    whole = [Subscribe(CHANNEL), Now(), Listen(SUB, 1.0), TRY, Now(), Listen(SUB, 2.0), Now()]
    with pytest.raises(KeyboardInterrupt):
        drive(until(CHANNEL, attempt, None), transport)
    # Everything up to the interrupted operation, then the unsubscription (none before the
    # subscription was made).
    assert transport.log[:at + 1] == whole[:at + 1]
    assert transport.log[at + 1:] == ([] if at == 0 else [Unsubscribe(SUB, CHANNEL)])
