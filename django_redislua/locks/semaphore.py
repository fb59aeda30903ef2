"""``Semaphore``: at most ``limit`` holders at once; each permit expires after ``timeout``, so a
crashed holder frees its own permit. Waiters are woken when a permit is given back.

Each operation is a protocol (see :mod:`django_redislua.protocol`) written once for both
drivers. A permit is named by a random id, so giving one back is safe to send twice: an acquire
interrupted after its call was sent (a cancellation, a lost reply) gives its permit back by id,
and a release interrupted the same way is sent again."""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Awaitable
from types import TracebackType

from django_redislua.atransport import arun
from django_redislua.limiting.rates import parse_duration
from django_redislua.locks.errors import LockNotAcquired, LockNotOwned, lock_errors, parse_wait
from django_redislua.locks.keys import keys_for
from django_redislua.locks.waiting import deadline_after, seconds_left, until
from django_redislua.protocol import Call, Protocol, interrupted, performed, retried, undone
from django_redislua.scripts import get_script
from django_redislua.transport import run

ACQUIRE = "django_redislua.semaphore_acquire"
RELEASE = "django_redislua.semaphore_release"


class Semaphore:
    """A counting semaphore named ``name`` with ``limit`` permits, each leased for ``timeout``.

    Permits are interchangeable: one Semaphore object may hold several (from several threads or
    coroutines); ``release()`` gives back the one taken last.
    """

    def __init__(self, name: str, limit: int, timeout: float | str, blocking: bool = True,
                 blocking_timeout: float | str | None = None) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"a semaphore's limit must be a whole number >= 1, not {limit!r}")
        self.name = name
        self.limit = limit
        self.timeout = parse_duration(timeout)
        self.blocking = blocking
        self.blocking_timeout = parse_wait(blocking_timeout)
        self.keys = keys_for("sem", name)
        self._permits: list[str] = []
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"<Semaphore {self.name!r} limit={self.limit}>"

    def _take(self) -> str:
        with self._guard:
            if not self._permits:
                raise LockNotOwned(f"semaphore {self.name!r}: this object holds no permit")
            return self._permits.pop()

    def _attempt(self, permit: str) -> Protocol[float | None]:
        script = get_script(ACQUIRE)
        reply = yield Call(script, script.command(
            [self.keys.base], [permit, self.limit, max(1, math.ceil(self.timeout * 1000))]))
        granted, wait_ms = (int(x) for x in reply)
        return None if granted else seconds_left(max(wait_ms, 0))  # no -1 here

    def _giving_back(self, permit: str) -> Protocol[int | None]:
        script = get_script(RELEASE)
        return (yield from retried(
            lambda: performed(Call(script, script.command([self.keys.base],
                                                          [permit, self.keys.channel]))),
            time.monotonic() + self.timeout))

    def _acquiring(self, blocking: bool | None, blocking_timeout: float | str | None
                   ) -> Protocol[bool]:
        blocking = self.blocking if blocking is None else blocking
        limit = self.blocking_timeout if blocking_timeout is None else parse_wait(blocking_timeout)
        permit = secrets.token_hex(16)
        deadline = yield from deadline_after(limit)
        try:
            granted = (yield from self._attempt(permit)) is None or (blocking and (
                yield from until(self.keys.channel, lambda: self._attempt(permit), deadline)))
        except BaseException as exc:
            # The permit may have been granted by a call whose reply never came: give it back.
            yield from undone(exc, self._giving_back(permit), f"redislua-permit:{self.name}")
            raise
        if not granted:
            return False
        with self._guard:
            self._permits.append(permit)
        return True

    def _releasing(self) -> Protocol[None]:
        permit = self._take()
        script = get_script(RELEASE)
        try:
            released = yield Call(script, script.command([self.keys.base],
                                                         [permit, self.keys.channel]))
        except BaseException as exc:
            if interrupted(exc):  # sent or not, a permit given back once more is no harm
                yield from self._giving_back(permit)
            raise
        if not released:
            raise LockNotOwned(f"semaphore {self.name!r}: the permit expired before release")

    def _entering(self) -> Protocol[Semaphore]:
        if not (yield from lock_errors(self._acquiring(None, None))):
            raise LockNotAcquired(f"semaphore {self.name!r}: no permit within "
                                  f"{self.blocking_timeout}s")
        return self

    def _leaving(self, body_failed: bool) -> Protocol[None]:
        try:
            yield from lock_errors(self._releasing())
        except LockNotOwned:
            if not body_failed:
                raise

    def acquire(self, blocking: bool | None = None,
                blocking_timeout: float | str | None = None) -> bool:
        """Take a permit; True when granted."""
        return run(lock_errors(self._acquiring(blocking, blocking_timeout)))

    def aacquire(self, blocking: bool | None = None,
                 blocking_timeout: float | str | None = None) -> Awaitable[bool]:
        """The asyncio twin of :meth:`acquire`. Cancelled mid-way, it holds no permit."""
        return arun(lock_errors(self._acquiring(blocking, blocking_timeout)))

    def release(self) -> None:
        """Give back a permit; LockNotOwned when it had already expired."""
        run(lock_errors(self._releasing()))

    def arelease(self) -> Awaitable[None]:
        """The asyncio twin of :meth:`release`."""
        return arun(lock_errors(self._releasing()))

    def __enter__(self) -> Semaphore:
        return run(self._entering())

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        run(self._leaving(exc is not None))

    def __aenter__(self) -> Awaitable[Semaphore]:
        return arun(self._entering())

    def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                  tb: TracebackType | None) -> Awaitable[None]:
        return arun(self._leaving(exc is not None))
