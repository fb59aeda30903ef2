"""Leases this process holds, and keeping them alive while the code they protect runs.

A lease is a Redis hash whose ``owner`` field names the holder and which expires: a Lock, a
``run_once`` run and a ``single_flight`` build each hold one. Locally a :class:`Lease` knows until
when it surely holds: the moment (monotonic clock) the last call that set its TTL was SENT, plus
that TTL. The server ran the call later, so its expiry is later still: ``expired`` never reads
False once the lease has really run out.

A renewer (a daemon thread, or an asyncio task) resets the TTL every third of it. A failed
renewal is retried with back-off until the lease has run out locally (a Redis pause or a short
outage loses nothing); only then, or when Redis says the lease is someone else's, is it lost:
``on_lost`` is called once, and the owner of the lease decides what to say.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from django_redislua.scripts import get_script

logger = logging.getLogger("django_redislua.locks")

# The first retry after a failed renewal; each further one waits twice as long (at most a
# renewal interval, and never past the lease's end).
FIRST_RETRY = 0.05


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

    def _args(self, seconds: float, replace: bool) -> list[str | int]:
        return [self.owner, milliseconds(seconds), "replace" if replace else "add"]

    def _read(self, reply: object, sent_at: float) -> bool:
        ttl_ms = int(reply)  # type: ignore[call-overload]
        if ttl_ms < 0:
            return False
        self.deadline = sent_at + ttl_ms / 1000
        return True

    def extend(self, seconds: float, replace: bool = True) -> bool:
        """Make the lease ``seconds`` (or add them); False when it is no longer ours."""
        sent_at = time.monotonic()
        reply = get_script("django_redislua.lock_extend")(keys=[self.key],
                                                         args=self._args(seconds, replace))
        return self._read(reply, sent_at)

    async def aextend(self, seconds: float, replace: bool = True) -> bool:
        sent_at = time.monotonic()
        reply = await get_script("django_redislua.lock_extend").acall(
            keys=[self.key], args=self._args(seconds, replace))
        return self._read(reply, sent_at)


class _Schedule:
    """When a renewer tries next, without I/O: every third of the lease; after a failure,
    back-off until the lease has run out. The thread and the task below only drive it."""

    def __init__(self, lease: Lease, seconds: float) -> None:
        self.lease, self.seconds = lease, seconds
        self.failures = 0
        self.taken = False  # Redis said the lease is someone else's

    def next_delay(self) -> float | None:
        """Seconds until the next try, or None when the lease is lost (ran out, or taken)."""
        left = self.lease.deadline - time.monotonic()
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


def _client_errors() -> tuple[type[BaseException], ...]:
    from django_redislua.connection import CLIENT_ERRORS

    return CLIENT_ERRORS


class Renewer:
    """Keeps ``lease`` at ``seconds`` from a daemon thread until :meth:`stop`; calls ``on_lost``
    (on that thread) once if it runs out or is taken first."""

    def __init__(self, lease: Lease, seconds: float, on_lost: Callable[[], None],
                 name: str) -> None:
        self.lease, self.seconds, self.on_lost = lease, seconds, on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"redislua-renew:{name}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        schedule = _Schedule(self.lease, self.seconds)
        while (delay := schedule.next_delay()) is not None:
            if self._stop.wait(delay):
                return
            try:
                schedule.record(self.lease.extend(self.seconds))
            except _client_errors():
                schedule.record(None)
        if not self._stop.is_set():
            self.on_lost()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


class AsyncRenewer:
    """The asyncio twin of :class:`Renewer`: a task on the running loop.

    :meth:`stop` cancels the task, and also sets a flag the task checks after every await: a
    cancellation can be lost on its way (before Python 3.12, ``asyncio.wait_for``, which
    redis-py wraps every socket write in, returns the result instead of raising when the
    cancellation arrives just as the write finished), and a renewer that missed it would renew
    the lease for ever while ``stop`` waited for it."""

    def __init__(self, lease: Lease, seconds: float, on_lost: Callable[[], None]) -> None:
        self.lease, self.seconds, self.on_lost = lease, seconds, on_lost
        self._stopped = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        schedule = _Schedule(self.lease, self.seconds)
        while (delay := schedule.next_delay()) is not None:
            await asyncio.sleep(delay)
            if self._stopped:
                return
            try:
                schedule.record(await self.lease.aextend(self.seconds))
            except _client_errors():
                schedule.record(None)
            if self._stopped:
                return
        self.on_lost()  # a stop ends the task before it gets here

    async def stop(self) -> None:
        self._stopped = True
        task = self._task
        if task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task])
