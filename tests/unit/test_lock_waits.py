"""How long a lock, a semaphore and run_once wait, in virtual time: the deadline is read when the
call begins (a slow first try is part of the wait, not added to it), and a waiter sleeps until
the holder's lease would end, then tries again (not sooner, not later).

The tests on Redis (tests/test_locks_fair.py, tests/test_locks_coordination.py,
tests/test_locks_processes.py) check the same waits end to end by what the server receives
and by lower bounds on the time taken; the upper bounds are here, where no loaded machine can
stretch them.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_redislua.conf import settings
from django_redislua.drivers import drive
from django_redislua.locks import Lock, RunInProgress, Semaphore, once
from django_redislua.locks.once import run_once
from django_redislua.protocol import Call, Listen
from django_redislua.scripts import get_script
from tests.unit.scripted import After, Scripted

pytestmark = pytest.mark.unit

LEASE_MS = 30_000
# The subscription to a waiting thread's inbox confirmed (the scripted transport's first inbox).
CONFIRMED = {"type": "subscribe", "channel": "rl:inbox:t0", "data": 1}


def calls(transport: Scripted, name: str) -> int:
    """How many calls of the script ``name`` the protocol made."""
    script = get_script(name)
    return sum(1 for op in transport.log if isinstance(op, Call) and op.script is script)


def sleeps(transport: Scripted) -> list[float]:
    """The waits for a message, in order (each ends at its timeout when answered None)."""
    return [op.timeout for op in transport.log if isinstance(op, Listen)]


def replied(reply: Any) -> list[list[Any]]:
    """What a send of one script call answers: one group, one reply."""
    return [[reply]]


def held(ms_left: int) -> list[list[Any]]:
    """lock_acquire's reply when another owner holds the lock for ``ms_left`` more."""
    return replied([0, ms_left, 0])


def acquired(token: int) -> list[list[Any]]:
    return replied([1, token, 0])


def lock_waited(script: list[Any], limit: float) -> tuple[bool, Scripted, float]:
    """A blocking acquire of a lock held elsewhere, driven to its end: (its result, the
    transport, the virtual seconds it took)."""
    transport = Scripted(script)
    started = transport.clock.now
    result = drive(Lock("waits", timeout=30)._acquire(True, limit), transport)
    assert not transport.script, f"answers left unused: {transport.script}"
    return result, transport, transport.clock.now - started


def test_a_lock_s_slow_first_try_counts_against_blocking_timeout() -> None:
    # The first try takes 1 s of a 0.5 s wait (Redis paused): once subscribed, the wait tries
    # once more, finds the deadline passed, and leaves the queue. No sleep, no third try.
    result, transport, took = lock_waited(
        [After(1.0, held(LEASE_MS)), None, held(LEASE_MS), held(LEASE_MS)], limit=0.5)
    assert result is False
    assert took == 1.0
    assert calls(transport, "django_redislua.lock_acquire") == 2
    assert calls(transport, "django_redislua.lock_withdraw") == 1
    assert sleeps(transport) == [0.0]  # the subscription's confirmation, not waited for


def test_a_lock_waiter_sleeps_until_the_holder_s_lease_ends_then_takes_it() -> None:
    # A holder that died with 400 ms of its lease left: the waiter tries again at its end,
    # and not one moment sooner or later.
    result, transport, took = lock_waited(
        [held(400), After(0.1, CONFIRMED), held(300), None, acquired(7)], limit=5.0)
    assert result is True
    assert took == pytest.approx(0.4)
    assert calls(transport, "django_redislua.lock_acquire") == 3
    assert sleeps(transport)[-1] == pytest.approx(0.3)


def test_a_lease_in_its_last_millisecond_is_slept_through_not_spun_on() -> None:
    # PTTL says 0 through a key's last millisecond: the waiter sleeps that millisecond once,
    # instead of trying again at once until the key is gone.
    result, transport, took = lock_waited(
        [held(0), CONFIRMED, held(0), None, acquired(7)], limit=5.0)
    assert result is True
    assert sleeps(transport)[-1] == pytest.approx(0.001) and took == pytest.approx(0.001)
    assert calls(transport, "django_redislua.lock_acquire") == 3


def test_a_lock_found_free_by_its_ttl_is_tried_again_at_once() -> None:
    # PTTL -2: the key is gone (a hand-off's claim ran out unconfirmed, lock_confirm.lua):
    # nothing to sleep for.
    result, transport, took = lock_waited(
        [held(-2), CONFIRMED, held(-2), None, acquired(7)], limit=5.0)
    assert result is True
    assert sleeps(transport)[-1] == 0.0 and took == 0.0
    assert calls(transport, "django_redislua.lock_acquire") == 3


def test_a_lock_held_with_no_expiry_is_looked_at_again_each_claim_window() -> None:
    # PTTL -1: the lock never runs out by itself; a queued waiter still looks again after a
    # claim window (a hand-off to a heir that died runs out within one).
    result, transport, took = lock_waited(
        [held(-1), CONFIRMED, held(-1), None, acquired(7)], limit=5.0)
    assert result is True
    assert sleeps(transport)[-1] == pytest.approx(settings.LOCK_CLAIM_WINDOW)
    assert took == pytest.approx(settings.LOCK_CLAIM_WINDOW)


def test_a_lock_waiter_never_sleeps_past_its_deadline() -> None:
    # The lease lasts 30 s more, the wait 0.5 s: it sleeps until its deadline, tries a last
    # time there, and leaves the queue.
    result, transport, took = lock_waited(
        [held(LEASE_MS), CONFIRMED, held(LEASE_MS), None, held(LEASE_MS), held(LEASE_MS)],
        limit=0.5)
    assert result is False
    assert took == pytest.approx(0.5)
    assert sleeps(transport)[-1] == pytest.approx(0.5)
    assert calls(transport, "django_redislua.lock_acquire") == 3


def test_a_semaphore_s_slow_first_try_counts_against_blocking_timeout() -> None:
    transport = Scripted([After(1.0, replied([0, LEASE_MS])), None, replied([0, LEASE_MS])])
    started = transport.clock.now
    semaphore = Semaphore("waits", limit=1, timeout=30)
    assert drive(semaphore._acquiring(True, 0.5), transport) is False
    assert not transport.script
    assert transport.clock.now - started == 1.0
    assert calls(transport, "django_redislua.semaphore_acquire") == 2


def test_run_once_s_slow_first_try_counts_against_wait_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # once_begin's reply for a run in progress elsewhere: state 1, its lease's ms left, who
    # runs it, since when, the server's time (ms).
    running = replied([1, LEASE_MS, "another", 1_700_000_000_000, 1_700_000_000_000])
    transport = Scripted([After(1.0, running), None, running])
    # The handler's call, driven on the scripted transport instead of Redis.
    monkeypatch.setattr(once, "run", lambda protocol: drive(protocol, transport))

    @run_once(key="waits", wait_timeout=0.5)
    def handler() -> str:
        raise AssertionError("runs elsewhere")

    started = transport.clock.now
    with pytest.raises(RunInProgress):
        handler()
    assert not transport.script
    assert transport.clock.now - started == 1.0
    assert calls(transport, "django_redislua.once_begin") == 2
