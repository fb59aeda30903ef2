"""Leases this process holds, and keeping them alive while the code they protect runs.

A lease is a Redis hash whose ``owner`` field names the holder and which expires: a Lock, a
``run_once`` run and a ``single_flight`` build each hold one. Locally a :class:`Lease` knows until
when it surely holds: the moment (monotonic clock) the last call that set its TTL was SENT, plus
that TTL. The server ran the call later, so its expiry is later still: ``expired`` never reads
False once the lease has really run out.

A renewer resets the TTL every third of it: the protocol :func:`renewing`, spawned on a daemon
thread (sync) or a task (asyncio) by whichever driver took the lease. A failed renewal is
retried with back-off until the lease has run out locally (a Redis pause or a short outage
loses nothing); only then, or when Redis says the lease is someone else's, is it lost:
``on_lost`` is called once, and the owner of the lease decides what to say. Stopping it (a
``Join``) sets its stop event; a task is also cancelled, and the protocol checks the event
after every operation, so a cancellation lost on its way (Python 3.11's ``wait_for``, which
redis-py wraps socket writes in, can return instead of raising) still stops it.

The protocols here read the clock through the transport (``protocol.Now``), so a scripted
transport runs a renewer in virtual time (``tests/unit/test_lease.py``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from django_redislua.connection import CLIENT_ERRORS

# FIRST_RETRY: the first retry after a failed renewal; each further one waits twice as long
# (at most a renewal interval, and never past the lease's end).
from django_redislua.protocol import FIRST_RETRY, Call, Join, Now, Pause, Protocol, Spawn
from django_redislua.scripts import get_script


def milliseconds(seconds: float) -> int:
    """Whole milliseconds, rounded up, at least 1 (Redis TTLs are whole and a 0 TTL deletes)."""
    return max(1, -(-int(seconds * 1_000_000) // 1000))


class Lease:
    """The lease on ``key`` held by ``owner``, known to last until ``deadline`` (monotonic)."""

    def __init__(self, key: str, owner: str, seconds: float, sent_at: float) -> None:
        self.key = key
        self.owner = owner
        self.deadline = sent_at + seconds

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def extending(self, seconds: float, replace: bool = True) -> Protocol[bool]:
        """Make the lease ``seconds`` (or add them); False when it is no longer ours."""
        script = get_script("django_redislua.lock_extend")
        sent_at: float = yield Now()
        reply = yield Call(script, script.command(
            [self.key], [self.owner, milliseconds(seconds), "replace" if replace else "add"]))
        ttl_ms = int(reply)
        if ttl_ms < 0:
            return False
        self.deadline = sent_at + ttl_ms / 1000
        return True


class _Schedule:
    """When a renewer tries next: every third of the lease; after a failure, back-off until
    the lease has run out."""

    def __init__(self, lease: Lease, seconds: float) -> None:
        self.lease, self.seconds = lease, seconds
        self.failures = 0
        self.taken = False  # Redis said the lease is someone else's

    def next_delay(self, now: float) -> float | None:
        """Seconds until the next try, or None when the lease is lost (ran out, or taken)."""
        left = self.lease.deadline - now
        if self.taken or left <= 0:
            return None
        interval = self.seconds / 3
        if self.failures == 0:
            return min(interval, left)
        retry: float = FIRST_RETRY * 2 ** (self.failures - 1)
        return min(retry, interval, left)

    def record(self, renewed: bool | None) -> None:
        """The outcome of a try: renewed, refused (not ours), or None (Redis failed)."""
        if renewed is None:
            self.failures += 1
        else:
            self.failures, self.taken = 0, not renewed


def renewing(lease: Lease, seconds: float, on_lost: Callable[[], None],
             stop: threading.Event) -> Protocol[None]:
    """Keep ``lease`` at ``seconds`` until ``stop`` is set; call ``on_lost`` once if it runs
    out or is taken first."""
    schedule = _Schedule(lease, seconds)
    while (delay := schedule.next_delay((yield Now()))) is not None:
        yield Pause(delay, wake=stop)
        if stop.is_set():
            return
        try:
            schedule.record((yield from lease.extending(seconds)))
        except CLIENT_ERRORS:
            schedule.record(None)
        if stop.is_set():
            return
    on_lost()


def start_renewing(lease: Lease, seconds: float, on_lost: Callable[[], None],
                   name: str) -> Protocol[object]:
    """Spawn :func:`renewing`; produces the handle :func:`stop_renewing` takes."""
    stop = threading.Event()
    return (yield Spawn(renewing(lease, seconds, on_lost, stop), f"redislua-renew:{name}", stop))


def stop_renewing(renewer: object) -> Protocol[None]:
    """Stop a renewer and wait for its end (at once when it is the caller itself)."""
    yield Join(renewer)
