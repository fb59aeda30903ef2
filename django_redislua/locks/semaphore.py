"""``Semaphore``: at most ``limit`` holders at once; each permit expires after ``timeout``, so a
crashed holder frees its own permit. Waiters are woken when a permit is given back."""

from __future__ import annotations

import asyncio
import math
import secrets
import threading
from types import TracebackType

from django_redislua.limiting.rates import parse_duration
from django_redislua.locks.keys import keys_for
from django_redislua.locks.lock import (
    LockNotAcquired,
    LockNotOwned,
    keep_running,
    parse_wait,
    redis_failures_as_lock_errors,
    release_shielded,
)
from django_redislua.locks.waiting import await_until, wait_until
from django_redislua.scripts import get_script


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

    def _acquire_args(self, permit: str) -> list[str | int]:
        return [permit, self.limit, max(1, math.ceil(self.timeout * 1000))]

    @staticmethod
    def _wait(reply: list[int]) -> float | None:
        granted, wait_ms = (int(x) for x in reply)
        return None if granted else max(wait_ms, 0) / 1000

    def _granted(self, permit: str) -> None:
        with self._guard:
            self._permits.append(permit)

    def _take(self) -> str:
        with self._guard:
            if not self._permits:
                raise LockNotOwned(f"semaphore {self.name!r}: this object holds no permit")
            return self._permits.pop()

    @redis_failures_as_lock_errors
    def acquire(self, blocking: bool | None = None,
                blocking_timeout: float | str | None = None) -> bool:
        """Take a permit; True when granted."""
        blocking = self.blocking if blocking is None else blocking
        limit = self.blocking_timeout if blocking_timeout is None else parse_wait(blocking_timeout)
        permit = secrets.token_hex(16)
        script = get_script("django_redislua.semaphore_acquire")

        def attempt() -> float | None:
            return self._wait(script(keys=[self.keys.base], args=self._acquire_args(permit)))

        if attempt() is not None and (
            not blocking or not wait_until(self.keys.channel, attempt, limit)
        ):
            return False
        self._granted(permit)
        return True

    @redis_failures_as_lock_errors
    def release(self) -> None:
        """Give back a permit; LockNotOwned when it had already expired."""
        permit = self._take()
        script = get_script("django_redislua.semaphore_release")
        if not script(keys=[self.keys.base], args=[permit, self.keys.channel]):
            raise LockNotOwned(f"semaphore {self.name!r}: the permit expired before release")

    @redis_failures_as_lock_errors
    async def aacquire(self, blocking: bool | None = None,
                       blocking_timeout: float | str | None = None) -> bool:
        """The asyncio twin of :meth:`acquire`. Cancelled mid-way, it holds no permit."""
        blocking = self.blocking if blocking is None else blocking
        limit = self.blocking_timeout if blocking_timeout is None else parse_wait(blocking_timeout)
        permit = secrets.token_hex(16)
        script = get_script("django_redislua.semaphore_acquire")

        async def attempt() -> float | None:
            reply = await script.acall(keys=[self.keys.base], args=self._acquire_args(permit))
            return self._wait(reply)

        try:
            if await attempt() is not None and (
                not blocking or not await await_until(self.keys.channel, attempt, limit)
            ):
                return False
        except asyncio.CancelledError:
            release = get_script("django_redislua.semaphore_release")
            keep_running(asyncio.get_running_loop().create_task(
                release.acall(keys=[self.keys.base], args=[permit, self.keys.channel])))
            raise
        self._granted(permit)
        return True

    @redis_failures_as_lock_errors
    async def arelease(self) -> None:
        """The asyncio twin of :meth:`release`."""
        permit = self._take()
        script = get_script("django_redislua.semaphore_release")
        if not await script.acall(keys=[self.keys.base], args=[permit, self.keys.channel]):
            raise LockNotOwned(f"semaphore {self.name!r}: the permit expired before release")

    def __enter__(self) -> Semaphore:
        if not self.acquire():
            raise LockNotAcquired(f"semaphore {self.name!r}: no permit within "
                                  f"{self.blocking_timeout}s")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.release()
        except LockNotOwned:
            if exc is None:
                raise

    async def __aenter__(self) -> Semaphore:
        if not await self.aacquire():
            raise LockNotAcquired(f"semaphore {self.name!r}: no permit within "
                                  f"{self.blocking_timeout}s")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await release_shielded(self.arelease(), exc is not None)
