"""``Lock``: a fenced, owner-checked, optionally reentrant and self-renewing distributed lock.

Each operation is one script on the lock's hash {owner, wait, count, token, name}. The owner
token is 128 random bits held by the Lock object, so any thread or coroutine holding the object
may release it, and nobody else can. Fencing tokens come from ``max(last token + 1, server clock
in microseconds)``: strictly increasing for a name even after Redis lost its data.

Waiting is first come, first served. Every acquire call is a *wait* with its own id; a waiter
subscribes to the lock's channel (see ``waiting``), then queues itself by arrival. A full release
offers the lock to the first live waiter as a *claim*: the lock hash names that wait and expires
after the claim window (``LOCK_CLAIM_WINDOW``, 1 s), and ``granted <wait> <token> <window ms>``
is published. The heir confirms with one more call (its lease starts then); a heir that died, is
stopped or left never confirms, and when the window runs out the other waiters, woken by their
timers, retry and the first one back takes the lock. A grant belongs to one wait, never to the
Lock object, so no other acquire can use it. Every way out of a wait (timeout, exception,
cancellation, KeyboardInterrupt) withdraws it.

The protocol of one wait (what each call sends and each reply or message means) is written once,
in ``_Wait``; ``acquire`` and ``aacquire`` only drive it, so sync and asyncio cannot drift.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, cast

from asgiref.sync import iscoroutinefunction

from django_redislua import metrics
from django_redislua.conf import settings
from django_redislua.limiting.rates import parse_duration
from django_redislua.locks.keys import keys_for
from django_redislua.locks.lease import AsyncRenewer, Lease, Renewer, milliseconds
from django_redislua.locks.waiting import LONGEST_SLEEP, await_until, wait_until
from django_redislua.scripts import get_script

logger = logging.getLogger("django_redislua.locks")

P = ParamSpec("P")
R = TypeVar("R")

# Tasks that must finish even though the coroutine that started them was cancelled (a release
# after cancellation). Kept here so the event loop does not garbage-collect them mid-flight.
_background: set[asyncio.Task[Any]] = set()


def keep_running(task: asyncio.Task[Any]) -> None:
    """Hold ``task`` until it ends, and consume its outcome (nobody awaits it any more).

    A task started while its loop shuts down (a wait cancelled by ``asyncio.run``'s clean-up)
    may never run: once that loop is closed it is dropped here, not held for the process's
    life (with its loop, its lock and its coroutine)."""
    for held in list(_background):  # a snapshot: other threads' loops add and discard too
        if held.get_loop().is_closed():
            _background.discard(held)
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


class LeaseLost(LockNotOwned):
    """The lease ran out, or was taken, while the code it protected ran: another holder may have
    run at the same time. Raised on leaving ``with``, by ``release``/``extend``, by
    ``singleton`` and by ``run_once``; ``result`` is what the protected code returned, if it
    finished."""

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


class LockUnavailable(LockError):
    """Redis failed while locking (down, timed out, refused the credentials, no cluster node):
    never a bare redis-py error. The lock's state is unknown; the lease ends by itself."""


async def async_client_ready() -> None:
    """The running loop's client, discovered (see ``connection.discovered``): every asyncio
    entry point of the locks starts with it, pub/sub waits included."""
    from django_redislua.connection import discovered, get_async_client

    await discovered(get_async_client())


def redis_failures_as_lock_errors(method: Callable[P, R]) -> Callable[P, R]:
    """Turn every client failure family (``connection.CLIENT_ERRORS``) of ``method`` (sync or
    ``async def``) into :class:`LockUnavailable`. An ``async def`` method first makes the
    loop's client ready (:func:`async_client_ready`)."""
    from django_redislua.connection import CLIENT_ERRORS

    if iscoroutinefunction(method):
        @functools.wraps(method)
        async def async_translated(*args: P.args, **kwargs: P.kwargs) -> Any:
            try:
                await async_client_ready()
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


def metered_acquire(method: Callable[P, R]) -> Callable[P, R]:
    """Count an acquire (sync or ``async def``) by outcome, and time it: acquired, timeout
    (not acquired: the wait ran out, or a non-blocking try found it held) or unavailable
    (:class:`LockUnavailable`). See :mod:`django_redislua.metrics`."""
    def outcome(held: object, started: float) -> None:
        result = metrics.ACQUIRED if held else metrics.TIMEOUT
        metrics.lock_acquired(result, time.monotonic() - started)

    if iscoroutinefunction(method):
        @functools.wraps(method)
        async def async_metered(*args: P.args, **kwargs: P.kwargs) -> Any:
            started = time.monotonic()
            try:
                held = await method(*args, **kwargs)
            except LockUnavailable:
                metrics.lock_acquired(metrics.UNAVAILABLE, None)
                raise
            outcome(held, started)
            return held

        return cast(Callable[P, R], async_metered)

    @functools.wraps(method)
    def metered(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.monotonic()
        try:
            held = method(*args, **kwargs)
        except LockUnavailable:
            metrics.lock_acquired(metrics.UNAVAILABLE, None)
            raise
        outcome(held, started)
        return held

    return metered


def parse_wait(value: float | str | None) -> float | None:
    """A blocking timeout: None (wait as long as it takes), 0 or more seconds, or "500ms"..."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0.0
    return parse_duration(value)


Reply = list[Any]


class _Wait:
    """One acquire call of one Lock: its id, its deadline, and the protocol of its script calls
    and wake-up messages, without I/O (the sync and asyncio drivers below share it)."""

    def __init__(self, lock: Lock, limit: float | None) -> None:
        self.lock = lock
        self.id = secrets.token_hex(8)
        self.deadline = None if limit is None else time.monotonic() + limit
        self.sent_at = 0.0
        self.inflight: asyncio.Future[Any] | None = None  # asyncio: the script call under way
        self.acked = 0  # replicas that confirmed the last call (with Lock(replicas=N))
        self.unreplicated = False  # acquired, but fewer replicas confirmed than asked for

    def _stay_ms(self) -> int:
        """How long a queued registration lasts: until the waiter's next retry at the latest
        (it sleeps at most LONGEST_SLEEP, or until its deadline), with a second's margin."""
        left = LONGEST_SLEEP if self.deadline is None else min(
            self.deadline - time.monotonic(), LONGEST_SLEEP)
        return milliseconds(max(left, 0.0) + 1.0)

    def attempt(self, queued: bool) -> tuple[list[str], list[str | int]]:
        """Try to take (or confirm) the lock; ``queued``: subscribed, so stay queued if held."""
        lock = self.lock
        self.sent_at = time.monotonic()
        return lock._keys4, [lock.owner, self.id, lock._lease_ms, "1" if lock.reentrant else "0",
                             lock.name, self._stay_ms() if queued else 0, lock.keys.channel,
                             lock._window_ms()]

    def took(self, reply: Reply) -> float | None:
        """None when acquired (the Lock records it), else seconds until the lock may change
        hands on its own (a lease or a claim running out; math.inf: only a message will tell)."""
        acquired, value, count = (int(x) for x in reply)
        if acquired:
            self.lock._held(value, count, self.sent_at)
            self.unreplicated = count == 1 and self.acked < self.lock.replicas
            return None
        return math.inf if value == -1 else max(value, 0) / 1000

    def on_message(self, data: str) -> bool | float | None:
        """None: try now (the lock was freed, or handed to this wait: confirm it). Seconds: it
        was handed to another wait; sleep at most until that claim would run out unconfirmed."""
        word, *rest = data.split(" ")
        if word == "granted" and len(rest) == 3 and rest[0] != self.id:
            return int(rest[2]) / 1000
        return None

    def withdraw(self, mode: str) -> tuple[list[str], list[str | int]]:
        """Leave the queue; a hand-off made to this wait meanwhile is taken or given on."""
        lock = self.lock
        self.sent_at = time.monotonic()
        return lock._keys4, [lock.owner, self.id, lock._lease_ms, mode, lock.keys.channel,
                             lock.name, lock._window_ms()]


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
        on_lost: Callable[[Lock], object] | None = None,
        replicas: int = 0,
        replica_timeout: float | str = 0.1,
    ) -> None:
        self.name = name
        self.timeout = parse_duration(timeout)
        self.blocking = blocking
        self.blocking_timeout = parse_wait(blocking_timeout)
        self.reentrant = reentrant
        self.auto_renew = auto_renew
        self.on_lost = on_lost
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"Lock replicas must be an integer >= 0, not {replicas!r}")
        self.replicas = replicas
        self.replica_timeout = parse_duration(replica_timeout)
        self.owner = secrets.token_hex(16)
        self.token: int | None = None
        """The fencing token of the current (or last) acquisition."""
        self.keys = keys_for("lock", name)
        self._keys4 = [self.keys.base, self.keys.sub("fence"), self.keys.sub("queue"),
                       self.keys.sub("stale")]
        self._lease_ms = milliseconds(self.timeout)
        self._lease = Lease(self.keys.base, self.owner, 0.0, 0.0)
        self._depth = 0  # re-entries held, as last reported by Redis
        self._lost = False
        self._renewer: Renewer | AsyncRenewer | None = None

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} timeout={self.timeout}s token={self.token}>"

    def copy(self) -> Lock:
        """A new Lock of the same name and options, with its own owner token."""
        return Lock(self.name, self.timeout, self.blocking, self.blocking_timeout,
                    self.reentrant, self.auto_renew, self.on_lost, self.replicas,
                    self.replica_timeout)

    @property
    def lost(self) -> bool:
        """True when this object believes it holds the lock but its lease has (or may have) run
        out: renewal failed until the lease's end, Redis said it is someone else's, or the lease
        passed on this process's clock (a pause, no renewal). False again after a release or a
        new acquisition."""
        return self._lost or (self._depth > 0 and self._lease.expired)

    # -- state shared by both drivers ----------------------------------------------------------

    @staticmethod
    def _window_ms() -> int:
        return milliseconds(settings.LOCK_CLAIM_WINDOW)

    def _held(self, token: int, depth: int, sent_at: float) -> None:
        self.token, self._depth, self._lost = token, depth, False
        self._lease.deadline = sent_at + self.timeout

    def _release_call(self, mode: str, token: int | None = None
                      ) -> tuple[list[str], list[str | int]]:
        return self._keys4, [self.owner, mode, self.keys.channel, self.name, self._window_ms(),
                             "" if token is None else token]

    def _released(self, left: int, unconfirmed: bool = False) -> None:
        """Record a release's reply; raises when the lock was not ours any more, unless the
        release undid an ``unconfirmed`` acquisition (see :meth:`_give_back_unconfirmed`)."""
        if left >= 0:
            self._depth = left
            return
        believed_held, self._depth = self._depth > 0, 0
        if not unconfirmed:
            raise self._not_owned("release", believed_held)

    def _not_owned(self, action: str, believed_held: bool) -> LockNotOwned:
        if believed_held:
            if not self._lost:  # the renewer had not found it lost: count it here
                metrics.lock_lost()
            self._lost = True
            return LeaseLost(f"cannot {action} lock {self.name!r}: its lease ran out or it was "
                             f"taken while this owner held it (token {self.token})")
        return LockNotOwned(f"cannot {action} lock {self.name!r}: not held by this owner "
                            f"(it expired, was force-released, or is held by someone else)")

    def _renewal_lost(self) -> None:
        """Called by the renewer when the lease ran out unrenewed or was taken."""
        if not self._lost:
            metrics.lock_lost()
        self._lost = True
        logger.error("lock %r (token %s): lease lost while held; another holder may run now",
                     self.name, self.token)
        if self.on_lost is not None:
            self.on_lost(self)

    # -- sync ----------------------------------------------------------------------------------

    def _call(self, wait: _Wait, name: str, keys: list[str], args: list[str | int]) -> Reply:
        """One script call of ``wait``; with ``replicas``, followed by WAIT on its connection."""
        script = get_script(name)
        if not self.replicas:
            reply: Reply = script(keys=keys, args=args)
            return reply
        reply, wait.acked = script.call_replicated(keys, args, self.replicas, self._replica_ms())
        return reply

    def _replica_ms(self) -> int:
        """WAIT's timeout: ``replica_timeout``, kept below the socket timeout (WAIT blocks the
        connection, and a read that times out would lose the script's reply)."""
        socket_timeout = settings.SOCKET_TIMEOUT
        seconds = self.replica_timeout if socket_timeout is None else min(
            self.replica_timeout, socket_timeout * 0.8)
        return milliseconds(seconds)

    def _unreplicated(self) -> LockUnavailable:
        return LockUnavailable(
            f"lock {self.name!r} was acquired, but fewer than {self.replicas} replica(s) "
            f"confirmed it within {self.replica_timeout}s; it was released again")

    def _withdraw(self, wait: _Wait, mode: str) -> bool:
        keys, args = wait.withdraw(mode)
        return wait.took(self._call(wait, "django_redislua.lock_withdraw", keys, args)) is None

    def _withdraw_quietly(self, wait: _Wait, failure: BaseException) -> None:
        """After an interrupted acquire: give back whatever this wait may hold (best effort;
        if Redis is unreachable the claim or lease runs out by itself). After a Redis failure
        the withdrawal runs on a daemon thread: the caller's wait must not overrun its timeout
        by a second socket timeout."""
        from django_redislua.connection import CLIENT_ERRORS

        def withdraw() -> None:
            with contextlib.suppress(*CLIENT_ERRORS):
                self._withdraw(wait, "give")

        if isinstance(failure, CLIENT_ERRORS):
            threading.Thread(target=withdraw, name=f"redislua-withdraw:{self.name}",
                             daemon=True).start()
        else:
            withdraw()

    def _release_failed(self) -> None:
        """A release whose outcome is unknown (Redis failed): if it was the last hold, stop
        renewing, so the lease ends by itself instead of living as long as the process."""
        if not self.reentrant or self._depth <= 1:
            self._depth = 0

    @metered_acquire
    @redis_failures_as_lock_errors
    def acquire(self, blocking: bool | None = None,
                blocking_timeout: float | str | None = None) -> bool:
        """Take the lock; True when held. Waits (woken on release) unless non-blocking."""
        blocking = self.blocking if blocking is None else blocking
        limit = self.blocking_timeout if blocking_timeout is None else parse_wait(blocking_timeout)
        wait = _Wait(self, limit)

        def attempt(queued: bool) -> float | None:
            keys, args = wait.attempt(queued)
            return wait.took(self._call(wait, "django_redislua.lock_acquire", keys, args))

        try:
            if attempt(False) is not None and not (
                blocking and (wait_until(self.keys.channel, lambda: attempt(True), limit,
                                         wait.on_message)
                              or self._withdraw(wait, "take"))
            ):
                return False
        except BaseException as exc:
            self._withdraw_quietly(wait, exc)
            raise
        if wait.unreplicated:
            self._give_back_unconfirmed()
            raise self._unreplicated()
        if self.auto_renew and self._depth == 1 and self._renewer is None:
            self._renewer = Renewer(self._lease, self.timeout, self._renewal_lost, self.name)
        return True

    def _stop_renewing(self) -> None:
        renewer, self._renewer = self._renewer, None
        if isinstance(renewer, Renewer):
            renewer.stop()

    def _give_back_unconfirmed(self) -> None:
        """Undo an acquisition fewer than ``replicas`` replicas confirmed. Finding the lock no
        longer ours (its lease ran out during WAIT, or after a failover the undo reached
        another primary) is what the undo wanted: the caller never had the lock, so nothing
        was lost (no LeaseLost, no lost-lease count)."""
        self._release(unconfirmed=True)

    @redis_failures_as_lock_errors
    def release(self) -> None:
        """Release one hold (the last re-entry frees it and offers it to the next waiter);
        owner-checked: LockNotOwned (LeaseLost if this object held it) when not ours."""
        self._release()

    def _release(self, unconfirmed: bool = False) -> None:
        from django_redislua.connection import CLIENT_ERRORS

        keys, args = self._release_call("one" if self.reentrant else "all")
        try:
            self._released(int(get_script("django_redislua.lock_release")(keys=keys, args=args)),
                           unconfirmed)
        except CLIENT_ERRORS:
            self._release_failed()
            raise
        finally:
            if self._depth == 0:
                self._stop_renewing()

    @redis_failures_as_lock_errors
    def extend(self, additional_time: float | str, replace_ttl: bool = False) -> None:
        """Add ``additional_time`` to the lease (or make it the lease); owner-checked."""
        if not self._lease.extend(parse_duration(additional_time), replace=replace_ttl):
            raise self._not_owned("extend", self._depth > 0)

    @redis_failures_as_lock_errors
    def locked(self) -> bool:
        """Whether anyone holds the lock now (an unconfirmed hand-off counts)."""
        from django_redislua.connection import get_client

        return bool(get_client().exists(self.keys.base))

    @redis_failures_as_lock_errors
    def owned(self) -> bool:
        """Whether this Lock object's owner holds the lock now."""
        from django_redislua.connection import get_client

        owner, claim = get_client().hmget(self.keys.base, ["owner", "claim"])
        return owner is not None and claim is None and _text(owner) == self.owner

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

    # -- asyncio -------------------------------------------------------------------------------

    async def _acall(self, wait: _Wait, name: str, keys: list[str],
                     args: list[str | int]) -> Reply:
        """One script call of ``wait``, shielded: a cancellation leaves it running, so the
        clean-up (``_aundo``) can read what it did."""
        script = get_script(name)

        async def call() -> Reply:
            if not self.replicas:
                reply: Reply = await script.acall(keys=keys, args=args)
                return reply
            reply, wait.acked = await script.acall_replicated(keys, args, self.replicas,
                                                              self._replica_ms())
            return reply

        wait.inflight = asyncio.ensure_future(call())
        reply: Reply = await asyncio.shield(wait.inflight)
        return reply

    async def _aundo(self, wait: _Wait) -> None:
        """Clean up after an interrupted ``aacquire``: let its last call finish, give back a
        re-entry it made (by token, so a later acquisition is never hit), then withdraw the
        wait, which frees a lock or claim the wait itself took."""
        reply: Reply | None = None
        if wait.inflight is not None:
            try:
                reply = await wait.inflight
            except Exception:
                reply = None
        if reply is not None and int(reply[0]) == 1 and int(reply[2]) > 1:
            keys, args = self._release_call("one", int(reply[1]))
            await get_script("django_redislua.lock_release").acall(keys=keys, args=args)
        keys, args = wait.withdraw("give")
        await get_script("django_redislua.lock_withdraw").acall(keys=keys, args=args)

    @metered_acquire
    @redis_failures_as_lock_errors
    async def aacquire(self, blocking: bool | None = None,
                       blocking_timeout: float | str | None = None) -> bool:
        """The asyncio twin of :meth:`acquire`. Cancelled at any point, it leaves nothing held
        and nobody queued (the clean-up finishes in the background)."""
        blocking = self.blocking if blocking is None else blocking
        limit = self.blocking_timeout if blocking_timeout is None else parse_wait(blocking_timeout)
        wait = _Wait(self, limit)

        async def attempt(queued: bool) -> float | None:
            keys, args = wait.attempt(queued)
            return wait.took(await self._acall(wait, "django_redislua.lock_acquire", keys, args))

        async def withdraw() -> bool:
            keys, args = wait.withdraw("take")
            reply = await self._acall(wait, "django_redislua.lock_withdraw", keys, args)
            return wait.took(reply) is None

        try:
            if await attempt(False) is not None and not (
                blocking and (await await_until(self.keys.channel, lambda: attempt(True), limit,
                                                wait.on_message)
                              or await withdraw())
            ):
                return False
        except BaseException:
            keep_running(asyncio.get_running_loop().create_task(self._aundo(wait)))
            raise
        if wait.unreplicated:
            await self._agive_back_unconfirmed()
            raise self._unreplicated()
        if self.auto_renew and self._depth == 1 and self._renewer is None:
            self._renewer = AsyncRenewer(self._lease, self.timeout, self._renewal_lost)
        return True

    async def _astop_renewing(self) -> None:
        renewer, self._renewer = self._renewer, None
        if isinstance(renewer, AsyncRenewer):
            await renewer.stop()
        elif isinstance(renewer, Renewer):
            renewer.stop()

    async def _agive_back_unconfirmed(self) -> None:
        """The asyncio twin of :meth:`_give_back_unconfirmed`."""
        await self._arelease(unconfirmed=True)

    @redis_failures_as_lock_errors
    async def arelease(self) -> None:
        """The asyncio twin of :meth:`release`."""
        await self._arelease()

    async def _arelease(self, unconfirmed: bool = False) -> None:
        from django_redislua.connection import CLIENT_ERRORS

        keys, args = self._release_call("one" if self.reentrant else "all")
        try:
            self._released(int(await get_script("django_redislua.lock_release").acall(
                keys=keys, args=args)), unconfirmed)
        except CLIENT_ERRORS:
            self._release_failed()
            raise
        finally:
            if self._depth == 0:
                await self._astop_renewing()

    @redis_failures_as_lock_errors
    async def aextend(self, additional_time: float | str, replace_ttl: bool = False) -> None:
        """The asyncio twin of :meth:`extend`."""
        if not await self._lease.aextend(parse_duration(additional_time), replace=replace_ttl):
            raise self._not_owned("extend", self._depth > 0)

    @redis_failures_as_lock_errors
    async def alocked(self) -> bool:
        from django_redislua.connection import get_async_client

        return bool(await get_async_client().exists(self.keys.base))

    @redis_failures_as_lock_errors
    async def aowned(self) -> bool:
        from django_redislua.connection import get_async_client

        owner, claim = await get_async_client().hmget(self.keys.base, ["owner", "claim"])
        return owner is not None and claim is None and _text(owner) == self.owner

    async def __aenter__(self) -> Lock:
        if not await self.aacquire():
            raise LockNotAcquired(f"lock {self.name!r} not acquired within "
                                  f"{self.blocking_timeout}s")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await release_shielded(self.arelease(), exc is not None)

    # -- decorator -----------------------------------------------------------------------------

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
