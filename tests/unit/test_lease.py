"""Leases and their renewal (locks.lease) in virtual time: a renewer resets the TTL every third
of it, retries a failed renewal with back-off until the lease has run out locally, and says
it lost the lease once, when it ran out or Redis says it is someone else's."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from django_redislua.drivers import drive
from django_redislua.locks.lease import Lease, renewing, start_renewing, stop_renewing
from django_redislua.protocol import FIRST_RETRY, Call, Join, Now, Pause, Send, Spawn
from tests.unit.scripted import After, Doing, Scripted, names

LOST_REPLY = (redis.ConnectionError("lost"), True)  # the send fails, the slot table is read


def renewed(ttl_ms: int) -> list[list[int]]:
    """lock_extend's reply: the lease's TTL now (ms), -1 when it is not ours."""
    return [[ttl_ms]]


def test_extending_a_lease_moves_its_end_from_when_the_call_was_sent() -> None:
    transport = Scripted([renewed(30_000)])
    lease = Lease("lock:k", "me", 3.0, transport.clock.now)
    sent_at = transport.clock.now
    assert drive(lease.extending(30.0), transport) is True
    assert lease.deadline == sent_at + 30.0
    assert names(transport.log) == ["Now", "Call", "Send"]
    call = transport.log[1]
    assert isinstance(call, Call) and call.command[-4:] == ("lock:k", "me", 30_000, "replace")


def test_extending_a_lease_that_is_someone_else_s_says_so() -> None:
    transport = Scripted([renewed(-1)])
    lease = Lease("lock:k", "me", 3.0, transport.clock.now)
    assert drive(lease.extending(30.0, replace=False), transport) is False
    assert lease.deadline == transport.clock.now + 3.0
    call = transport.log[1]
    assert isinstance(call, Call) and call.command[-1] == "add"


def renewer(transport: Scripted, seconds: float = 3.0
            ) -> tuple[Lease, threading.Event, list[str], Any]:
    lease = Lease("lock:k", "me", seconds, transport.clock.now)
    stop = threading.Event()
    lost: list[str] = []
    return lease, stop, lost, renewing(lease, seconds, lambda: lost.append("lost"), stop)


def pauses(transport: Scripted) -> list[float]:
    return [op.seconds for op in transport.log if isinstance(op, Pause)]


def test_a_renewer_renews_every_third_of_the_lease_until_stopped() -> None:
    transport = Scripted()
    lease, stop, lost, protocol = renewer(transport)
    transport.script = [renewed(3000)] * 3 + [Doing(stop.set, renewed(3000))]
    drive(protocol, transport)
    assert not transport.script and lost == []
    assert pauses(transport) == [1.0] * 4
    assert names(transport.log) == ["Now", "Pause", "Now", "Call", "Send"] * 4
    assert lease.deadline == transport.clock.now + 3.0


def test_a_failed_renewal_is_retried_with_back_off_until_the_lease_has_run_out() -> None:
    transport = Scripted([item for _ in range(7) for item in LOST_REPLY])
    started = transport.clock.now
    _lease, _stop, lost, protocol = renewer(transport)
    drive(protocol, transport)
    assert not transport.script
    # A third of the lease, then FIRST_RETRY doubling; the last pause ends with the lease.
    assert pauses(transport) == pytest.approx([1.0, FIRST_RETRY, 0.1, 0.2, 0.4, 0.8, 0.45])
    assert transport.clock.now == started + 3.0
    assert lost == ["lost"]  # once, when it ran out


def test_a_renewal_that_lands_after_failures_resets_the_back_off() -> None:
    transport = Scripted()
    _lease, stop, lost, protocol = renewer(transport)
    transport.script = [*LOST_REPLY, *LOST_REPLY, renewed(3000), *LOST_REPLY,
                        Doing(stop.set, renewed(3000))]
    drive(protocol, transport)
    assert not transport.script and lost == []
    assert pauses(transport) == pytest.approx([1.0, FIRST_RETRY, 0.1, 1.0, FIRST_RETRY])


def test_a_lease_taken_by_someone_else_is_lost_at_once() -> None:
    transport = Scripted([renewed(-1)])
    _lease, _stop, lost, protocol = renewer(transport)
    drive(protocol, transport)
    assert lost == ["lost"]
    assert names(transport.log) == ["Now", "Pause", "Now", "Call", "Send", "Now"]


def test_a_renewer_stopped_while_it_sleeps_renews_no_more() -> None:
    transport = Scripted()
    _lease, stop, lost, protocol = renewer(transport)
    stop.set()
    drive(protocol, transport)
    assert lost == []
    assert names(transport.log) == ["Now", "Pause"]
    assert transport.clock.now == 1000.0  # the set event ended the sleep at once


def test_a_renewer_stopped_during_a_failed_renewal_stops_there() -> None:
    transport = Scripted()
    _lease, stop, lost, protocol = renewer(transport)
    transport.script = [Doing(stop.set, redis.TimeoutError("lost")), True]
    drive(protocol, transport)
    assert lost == [] and not transport.script
    assert names(transport.log) == ["Now", "Pause", "Now", "Call", "Send", "Refresh", "Failed"]


def test_a_renewer_is_started_apart_and_joined() -> None:
    transport = Scripted([renewed(-1)])
    lease = Lease("lock:k", "me", 3.0, transport.clock.now)
    lost: list[str] = []
    handle = drive(start_renewing(lease, 3.0, lambda: lost.append("lost"), "k"), transport)
    spawn = transport.log[0]
    assert isinstance(spawn, Spawn) and spawn.name == "redislua-renew:k"
    drive(stop_renewing(handle), transport)
    assert transport.log[1] == Join(handle) and spawn.stop.is_set()
    drive(transport.spawned[0].protocol, transport)  # stopped before its first renewal
    assert lost == [] and names(transport.log[2:]) == ["Now", "Pause"]


def test_the_clock_is_read_before_the_call_not_after_its_reply() -> None:
    # The reply comes 2 s after the call was sent: the lease's end counts from the send.
    transport = Scripted()
    lease = Lease("lock:k", "me", 3.0, transport.clock.now)
    sent_at = transport.clock.now
    transport.script = [After(2.0, renewed(5000))]
    assert drive(lease.extending(5.0), transport) is True
    assert lease.deadline == sent_at + 5.0
    assert transport.log[0] == Now() and isinstance(transport.log[2], Send)



def test_a_lease_is_expired_once_the_monotonic_clock_passes_its_end() -> None:
    # ``expired`` is read outside protocols (Lock.lost): the process's own clock.
    assert Lease("lock:k", "me", 3.0, time.monotonic() - 3.0).expired
    assert not Lease("lock:k", "me", 60.0, time.monotonic()).expired
