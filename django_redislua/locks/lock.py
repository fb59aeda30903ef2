"""``Lock``: a fenced, owner-checked, optionally reentrant and self-renewing distributed lock.

Acquire is one script: SET NX PX semantics on a hash that also records the owner, a re-entry
count and a fencing token taken from a per-name counter that never goes back. The owner token is
128 random bits held by the Lock object, so any thread or coroutine holding the object may
release it, and nobody else can. Waiters are woken by the release (see ``waiting``).

A blocked waiter queues itself (in the retry it makes once subscribed), and a full release hands
the lock straight to the queued waiter whose registration expires first, announcing
``granted <owner> <token>``: that waiter owns the lock on reading the message, with no acquire
round trip between release and hand-off. A ``granted`` mark in the lock hash means a hand-off is
never lost: the heir's next retry, or its withdrawal at its timeout, finds it.
"""

from __future__ import annotations

import asyncio
import functools
import math
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from redis.exceptions import RedisError

from django_redislua.limiting.rates import parse_duration
from django_redislua.locks.keys import keys_for
from django_redislua.locks.waiting import LONGEST_SLEEP, await_until, wait_until
from django_redislua.scripts import get_script

P = ParamSpec("P")
R = TypeVar("R")

# Tasks that must finish even though the coroutine that started them was cancelled (a release
# after cancellation). Kept here so the event loop does not garbage-collect them mid-flight.
_background: set[asyncio.Task[Any]] = set()


def keep_running(task: asyncio.Task[Any]) -> None:
    """Hold ``task`` until it ends, and consume its outcome (nobody awaits it any more)."""
    _background.add(task)

    def done(finished: asyncio.Task[Any]) -> None:
        _background.discard(finished)
        if not finished.cancelled():
            finished.exception()

    task.add_done_callback(done)


async def release_shielded(release: Awaitable[None], body_raised: bool) -> None:
    """Leave ``async with``: a cancellation arriving now must not leave the lock (or permit) held,
    so the release is shielded and, if cancelled, finishes in the background. LockNotOwned is
    raised only when the body itself succeeded (its end ran unprotected: the caller must know)."""
    task = asyncio.ensure_future(release)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        keep_running(task)
        raise
    except LockNotOwned:
        if not body_raised:
            raise


class LockError(Exception):
    """Base class of lock errors."""


class LockNotOwned(LockError):
    """Release or extend by a caller that does not hold the lock (it expired, or was taken)."""


class LockNotAcquired(LockError):
    """``with Lock(...)`` (or the decorator) could not acquire within ``blocking_timeout``."""


class LockUnavailable(LockError):
    """Redis failed while locking (down, timed out, refused the credentials, no cluster node):
    never a bare redis-py error. The lock's state is unknown; the lease ends by itself."""


def redis_failures_as_lock_errors(method: Callable[P, R]) -> Callable[P, R]:
    """Turn every client failure family (``connection.CLIENT_ERRORS``) of ``method`` (sync or
    ``async def``) into :class:`LockUnavailable`."""
    from django_redislua.connection import CLIENT_ERRORS

    if iscoroutinefunction(method):
        @functools.wraps(method)
        async def async_translated(*args: P.args, **kwargs: P.kwargs) -> Any:
            try:
                return await method(*args, **kwargs)
            except CLIENT_ERRORS as exc:
                raise LockUnavailable(f"Redis failed while locking: {exc}") from exc

        return cast(Callable[P, R], async_translated)

    @functools.wraps(method)
    def translated(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except CLIENT_ERRORS as exc:
            raise LockUnavailable(f"Redis failed while locking: {exc}") from exc

    return translated


def parse_wait(value: float | str | None) -> float | None:
    """A blocking timeout: None (wait as long as it takes), 0 or more seconds, or "500ms"..."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0.0
    return parse_duration(value)


def milliseconds(seconds: float) -> int:
    """Whole milliseconds, rounded up, at least 1 (Redis TTLs are whole and a 0 TTL deletes)."""
    return max(1, math.ceil(seconds * 1000))


class Lock:
    """A distributed lock named ``name`` whose lease lasts ``timeout`` (seconds or "30s")."""

    def __init__(
        self,
        name: str,
        timeout: float | str,
        blocking: bool = True,
        blocking_timeout: float | str | None = None,
        reentrant: bool = False,
        auto_renew: bool = False,
    ) -> None:
        self.name = name
        self.timeout = parse_duration(timeout)
        self.blocking = blocking
        self.blocking_timeout = parse_wait(blocking_timeout)
        self.reentrant = reentrant
        self.auto_renew = auto_renew
        self.owner = secrets.token_hex(16)
        self.token: int | None = None
        """The fencing token of the current (or last) acquisition."""
        self.lost = False
        """True once auto-renewal failed: the lease may have passed to someone else."""
        self.keys = keys_for("lock", name)
        self._depth = 0  # re-entries held, as last reported by Redis
        self._stop_renewing: threading.Event | None = None
        self._renewer: threading.Thread | None = None
        self._renew_task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} timeout={self.timeout}s token={self.token}>"

    def copy(self) -> Lock:
        """A new Lock of the same name and options, with its own owner token."""
        return Lock(self.name, self.timeout, self.blocking, self.blocking_timeout,
                    self.reentrant, self.auto_renew)

    # -- script plumbing, shared by the sync and async paths ---------------------------------

    def _member(self, owner: str) -> str:
        """This waiter's entry in the lock's queue (its owner token and the lease it asks for)."""
        return f"{owner}:{milliseconds(self.timeout)}"

    def _acquire_call(self, stay_ms: int = 0) -> tuple[list[str], list[str | int]]:
        return (
            [self.keys.base, self.keys.sub("fence"), self.keys.sub("queue")],
            [self.owner, milliseconds(self.timeout), "1" if self.reentrant else "0", self.name,
             stay_ms],
        )

    @staticmethod
    def _stay_ms(deadline: float | None) -> int:
        """How long a queued registration lasts: until the waiter's next retry, at the latest
        (it sleeps at most LONGEST_SLEEP) or its deadline, with a second's margin."""
        wait = LONGEST_SLEEP if deadline is None else min(deadline - time.monotonic(),
                                                          LONGEST_SLEEP)
        return milliseconds(max(wait, 0.0) + 1.0)

    def _on_message(self, data: str) -> bool | None:
        """A wake-up message: the lock handed to us (True), to another waiter (False), or free."""
        if not data.startswith("granted "):
            return None
        _word, heir, token = data.split(" ", 2)
        if heir != self.owner:
            return False
        self.token, self._depth, self.lost = int(token), 1, False
        return True

    def _withdraw_call(self) -> tuple[list[str], list[str]]:
        return [self.keys.base, self.keys.sub("queue")], [self.owner, self._member(self.owner)]

    def _took(self, reply: list[int]) -> float | None:
        """None when acquired (records token and depth), else seconds until the lease ends."""
        acquired, value, count = (int(x) for x in reply)
        if acquired:
            self.token, self._depth, self.lost = value, count, False
            return None
        return math.inf if value == -1 else max(value, 0) / 1000

    def _release_call(self, owner: str, mode: str) -> tuple[list[str], list[str]]:
        return (
            [self.keys.base, self.keys.sub("fence"), self.keys.sub("queue")],
            [owner, mode, self.keys.channel, self.name, self._member(owner)],
        )

    def _extend_args(self, additional_time: float | str, replace_ttl: bool) -> list[str | int]:
        return [self.owner, milliseconds(parse_duration(additional_time)),
                "replace" if replace_ttl else "add"]

    def _not_owned(self, action: str) -> LockNotOwned:
        return LockNotOwned(f"cannot {action} lock {self.name!r}: not held by this owner "
                            f"(it expired, was force-released, or is held by someone else)")

    # -- sync --------------------------------------------------------------------------------

    def _attempt(self, stay_ms: int = 0) -> float | None:
        keys, args = self._acquire_call(stay_ms)
        return self._took(get_script("django_redislua.lock_acquire")(keys=keys, args=args))

    def _wait(self, limit: float | None) -> bool:
        deadline = None if limit is None else time.monotonic() + limit
        if wait_until(self.keys.channel, lambda: self._attempt(self._stay_ms(deadline)), limit,
                      self._on_message):
            return True
        keys, args = self._withdraw_call()
        return self._took(get_script("django_redislua.lock_withdraw")(keys=keys, args=args)) is None

    @redis_failures_as_lock_errors
    def acquire(self, blocking: bool | None = None,
                blocking_timeout: float | str | None = None) -> bool:
        """Take the lock; True when held. Waits (woken on release) unless non-blocking."""
        blocking = self.blocking if blocking is None else blocking
        limit = self.blocking_timeout if blocking_timeout is None else parse_wait(blocking_timeout)
        if self._attempt() is not None and (not blocking or not self._wait(limit)):
            return False
        if self.auto_renew and self._depth == 1:
            self._start_renewer()
        return True

    @redis_failures_as_lock_errors
    def release(self) -> None:
        """Release one hold (the last re-entry frees it and wakes a waiter); owner-checked."""
        keys, args = self._release_call(self.owner, "one" if self.reentrant else "all")
        left = int(get_script("django_redislua.lock_release")(keys=keys, args=args))
        if left < 0:
            self._depth = 0
            self._halt_renewer()
            raise self._not_owned("release")
        self._depth = left
        if left == 0:
            self._halt_renewer()
            self.lost = False  # it was ours until now; a renewal racing the release is no loss

    @redis_failures_as_lock_errors
    def extend(self, additional_time: float | str, replace_ttl: bool = False) -> None:
        """Add ``additional_time`` to the lease (or make it the lease); owner-checked."""
        args = self._extend_args(additional_time, replace_ttl)
        if int(get_script("django_redislua.lock_extend")(keys=[self.keys.base], args=args)) < 0:
            raise self._not_owned("extend")

    @redis_failures_as_lock_errors
    def locked(self) -> bool:
        """Whether anyone holds the lock now."""
        from django_redislua.connection import get_client

        return bool(get_client().exists(self.keys.base))

    @redis_failures_as_lock_errors
    def owned(self) -> bool:
        """Whether this Lock object's owner holds the lock now."""
        from django_redislua.connection import get_client

        owner = get_client().hget(self.keys.base, "owner")
        return owner is not None and _text(owner) == self.owner

    def _start_renewer(self) -> None:
        stop = threading.Event()
        self._stop_renewing = stop
        self._renewer = threading.Thread(
            target=self._renew, args=(stop,), name=f"redislua-renew:{self.name}", daemon=True
        )
        self._renewer.start()

    def _renew(self, stop: threading.Event) -> None:
        while not stop.wait(self.timeout / 3):
            try:
                self.extend(self.timeout, replace_ttl=True)
            except (LockNotOwned, RedisError):
                if not stop.is_set():
                    self.lost = True
                return

    def _halt_renewer(self) -> None:
        stop, renewer = self._stop_renewing, self._renewer
        self._stop_renewing = self._renewer = None
        if stop is not None:
            stop.set()
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join()

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise LockNotAcquired(f"lock {self.name!r} not acquired within "
                                  f"{self.blocking_timeout}s")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.release()
        except LockNotOwned:
            if exc is None:
                raise  # the body ran without the lock's protection at its end: say so

    # -- asyncio -----------------------------------------------------------------------------

    async def _aattempt(self, stay_ms: int = 0) -> float | None:
        keys, args = self._acquire_call(stay_ms)
        return self._took(await get_script("django_redislua.lock_acquire").acall(keys=keys,
                                                                                  args=args))

    async def _await(self, limit: float | None) -> bool:
        deadline = None if limit is None else time.monotonic() + limit
        if await await_until(self.keys.channel,
                             lambda: self._aattempt(self._stay_ms(deadline)), limit,
                             self._on_message):
            return True
        keys, args = self._withdraw_call()
        script = get_script("django_redislua.lock_withdraw")
        return self._took(await script.acall(keys=keys, args=args)) is None

    @redis_failures_as_lock_errors
    async def aacquire(self, blocking: bool | None = None,
                       blocking_timeout: float | str | None = None) -> bool:
        """The asyncio twin of :meth:`acquire`. Cancelled mid-way, it leaves the lock free."""
        blocking = self.blocking if blocking is None else blocking
        limit = self.blocking_timeout if blocking_timeout is None else parse_wait(blocking_timeout)
        held_before = self._depth
        try:
            if await self._aattempt() is not None and (
                not blocking or not await self._await(limit)
            ):
                return False
        except asyncio.CancelledError:
            if held_before == 0:
                self._abandon()
            raise
        if self.auto_renew and self._depth == 1:
            self._renew_task = asyncio.get_running_loop().create_task(self._arenew())
        return True

    def _abandon(self) -> None:
        """After a cancelled acquire: the script may have run, so release whatever the old owner
        token holds, in the background, and take a fresh token so a retry cannot be hit by it."""
        keys, args = self._release_call(self.owner, "all")
        self.owner, self._depth = secrets.token_hex(16), 0
        script = get_script("django_redislua.lock_release")
        keep_running(asyncio.get_running_loop().create_task(script.acall(keys=keys, args=args)))

    @redis_failures_as_lock_errors
    async def arelease(self) -> None:
        """The asyncio twin of :meth:`release`."""
        keys, args = self._release_call(self.owner, "one" if self.reentrant else "all")
        left = int(await get_script("django_redislua.lock_release").acall(keys=keys, args=args))
        if left < 0:
            self._depth = 0
            await self._ahalt_renewer()
            raise self._not_owned("release")
        self._depth = left
        if left == 0:
            await self._ahalt_renewer()
            self.lost = False

    @redis_failures_as_lock_errors
    async def aextend(self, additional_time: float | str, replace_ttl: bool = False) -> None:
        """The asyncio twin of :meth:`extend`."""
        args = self._extend_args(additional_time, replace_ttl)
        script = get_script("django_redislua.lock_extend")
        if int(await script.acall(keys=[self.keys.base], args=args)) < 0:
            raise self._not_owned("extend")

    @redis_failures_as_lock_errors
    async def alocked(self) -> bool:
        from django_redislua.connection import get_async_client

        return bool(await get_async_client().exists(self.keys.base))

    @redis_failures_as_lock_errors
    async def aowned(self) -> bool:
        from django_redislua.connection import get_async_client

        owner = await get_async_client().hget(self.keys.base, "owner")
        return owner is not None and _text(owner) == self.owner

    async def _arenew(self) -> None:
        while True:
            await asyncio.sleep(self.timeout / 3)
            try:
                await self.aextend(self.timeout, replace_ttl=True)
            except (LockNotOwned, RedisError):
                self.lost = True
                return

    async def _ahalt_renewer(self) -> None:
        task, self._renew_task = self._renew_task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.wait([task])

    async def __aenter__(self) -> Lock:
        if not await self.aacquire():
            raise LockNotAcquired(f"lock {self.name!r} not acquired within "
                                  f"{self.blocking_timeout}s")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await release_shielded(self.arelease(), exc is not None)

    # -- decorator ---------------------------------------------------------------------------

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        """Decorate a function (sync or async): each call runs holding a fresh copy of the lock."""
        if iscoroutinefunction(func):
            async_func = cast(Callable[P, Awaitable[Any]], func)

            @functools.wraps(func)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                async with self.copy():
                    return await async_func(*args, **kwargs)

            return cast(Callable[P, R], run_async)

        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with self.copy():
                return func(*args, **kwargs)

        return run


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


