"""``singleton``, ``run_once`` and ``single_flight``: the three classic coordination jobs.

- ``singleton``: a job runs on one instance at a time (a Lock with auto-renewal); others skip.
- ``run_once``: an idempotent handler; the first run's result is stored and returned to every
  later call with the same key. A failure stores nothing, so a later call runs again.
- ``single_flight``: on a cache miss one caller builds the value, the others wait for it (or are
  served the stale copy); ``build`` never runs twice at once for one key.

Each holds a lease while the user's code runs and renews it (``lease.Renewer``), so a timeout
only bounds how long a crashed process keeps the others out. A lease lost anyway (the process
paused, Redis unreachable for longer than the lease) is never dropped silently: ``singleton``
and ``run_once`` raise :class:`LeaseLost` after the body, ``single_flight`` does not store the
value it built over a newer one; each logs it.

Results and values are pickled, as Django's cache does: only store what your own code built.
"""

from __future__ import annotations

import functools
import logging
import math
import pickle
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast

from asgiref.sync import iscoroutinefunction

from django_redislua import metrics
from django_redislua.connection import CLIENT_ERRORS
from django_redislua.limiting.rates import parse_duration
from django_redislua.locks.keys import Keys, keys_for
from django_redislua.locks.lease import Lease, milliseconds, start_renewing, stop_renewing
from django_redislua.locks.lock import LeaseLost, Lock, LockError, parse_wait
from django_redislua.locks.waiting import deadline_after, until
from django_redislua.protocol import Call, Execute, Invoke, Protocol, performed, retried, undone
from django_redislua.scripts import get_script
from django_redislua.transport import arun, run

logger = logging.getLogger("django_redislua.locks")

P = ParamSpec("P")
R = TypeVar("R")

_RUN = 0
_IN_PROGRESS = 1
_DONE = 2


class RunInProgress(LockError):
    """``run_once``: the same key is running elsewhere and this call would not (or could no
    longer) wait for its result."""


# -- singleton --------------------------------------------------------------------------------

def _lease_lost(what: str, exc: LeaseLost, result: Any) -> LeaseLost:
    exc.result = result
    logger.error("%s: the lease ran out or was taken while the body ran; another instance may "
                 "have run it at the same time", what)
    return exc


def singleton(name: str, timeout: float | str, wait: bool = False,
              blocking_timeout: float | str | None = None
              ) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
    """Run the decorated job on one instance at a time: others return None (or, with
    ``wait=True``, wait their turn). The lock renews itself while the job runs, so ``timeout``
    only bounds how long a crashed instance keeps others out. If the lease was lost anyway
    (this process paused, Redis unreachable past the lease), :class:`LeaseLost` is raised
    after the job, carrying its result."""

    def decorate(func: Callable[P, R]) -> Callable[P, R | None]:
        what = f"singleton {name!r}"

        def running(body: Invoke) -> Protocol[Any]:
            held = Lock(name, timeout, blocking=wait, blocking_timeout=blocking_timeout,
                        auto_renew=True)
            if not (yield from held._acquiring(None, None)):
                logger.info("%s skipped: %s", what, (yield from _holder(held)))
                return None
            try:
                result = yield body
            except BaseException:
                yield from held._leaving(True)
                raise
            try:
                yield from held._leaving(False)
            except LeaseLost as exc:
                raise _lease_lost(what, exc, result) from None
            return result

        if iscoroutinefunction(func):
            async_func = cast(Callable[P, Awaitable[Any]], func)

            @functools.wraps(func)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                return await arun(running(Invoke(functools.partial(async_func, *args, **kwargs))))

            return cast(Callable[P, R | None], run_async)

        @functools.wraps(func)
        def run_sync(*args: P.args, **kwargs: P.kwargs) -> R | None:
            return cast(R | None, run(running(Invoke(functools.partial(func, *args, **kwargs)))))

        return run_sync

    return decorate


def _holder(lock: Lock) -> Protocol[str]:
    """Who holds ``lock``, for a log line: its fencing token and how long its lease has left
    (one round trip; a Redis failure only makes the line shorter)."""
    try:
        token, = yield Execute(("HMGET", lock.keys.base, "token"))
        left_ms = int((yield Execute(("PTTL", lock.keys.base))))
    except CLIENT_ERRORS:
        return "another instance holds it"
    if token is None:
        return "another instance held it (its lease has just ended)"
    token = token.decode() if isinstance(token, bytes) else token
    return (f"another instance holds it (fencing token {token}, lease ends in "
            f"{max(left_ms, 0) / 1000:.1f}s)")


# -- run_once ---------------------------------------------------------------------------------

class _Once:
    """One call of a run_once handler: its key, its run token, what Redis said."""

    def __init__(self, keys: Keys, lease_ms: int) -> None:
        self.keys = keys
        self.token = secrets.token_hex(16)
        self.lease_ms = lease_ms
        self.sent_at = 0.0
        self.must_run = False
        self.result: Any = None
        self.done = False
        self.lost_counted = False

    def lost(self) -> None:
        """The renewer gave up: the lease ran out unrenewed, or another run took it."""
        self.lost_counted = True
        metrics.lock_lost()
        logger.error("run_once %s: the running lease was lost while the handler ran",
                     self.keys.base)

    def args(self) -> list[str | int]:
        self.sent_at = time.monotonic()
        return [self.token, self.lease_ms]

    def read(self, reply: list[Any]) -> float | None:
        state, value = int(reply[0]), reply[1]
        if state == _DONE:
            self.result, self.done = pickle.loads(value), True  # our own record, written below
            return None
        if state == _RUN:
            self.must_run = True
            return None
        pttl = int(value)
        return math.inf if pttl == -1 else max(pttl, 0) / 1000

    def lease(self) -> Lease:
        return Lease(self.keys.base, self.token, self.lease_ms / 1000, self.sent_at)

    def finish_args(self, outcome: str, result: Any, ttl_ms: int) -> list[str | int | bytes]:
        blob = pickle.dumps(result) if outcome == "done" else b""
        return [self.token, outcome, blob, ttl_ms, self.keys.channel]

    def finished(self, reply: Any, outcome: str, result: Any) -> None:
        """Read once_finish's reply: raise LeaseLost when another run took the key over."""
        what = f"run_once {self.keys.base}"
        code = int(reply)
        # 0: another run took the key over; 2: the lease ran out, nobody took it. Both lost it.
        if code in (0, 2) and not self.lost_counted:  # and the renewer had not said so
            self.lost_counted = True
            metrics.lock_lost()
        if code == 2:
            logger.warning("%s: the run outlived its lease, but no other run started; its "
                           "outcome was recorded", what)
        if code == 0 and outcome == "done":
            raise _lease_lost(what, LeaseLost(
                f"{what}: the run outlived its lease and another run took the key over; the "
                f"handler may have run twice (the other run's record was kept)"), result)
        if code == 0:
            logger.error("%s: the failed run had lost its lease to another run", what)


def run_once(key: str | Callable[..., str], ttl: float | str = "1d",
             timeout: float | str = "10m", wait: bool = True,
             wait_timeout: float | str | None = None
             ) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a handler idempotent per key: the first successful run's result is kept for ``ttl``
    and returned by every later call with the same key, without running the handler again.

    ``key`` is a string or a callable given the handler's arguments. ``timeout`` is the running
    lease, renewed while the handler runs: it bounds how long a crashed run keeps the key. A
    duplicate arriving mid-run waits for the result (up to ``wait_timeout``), or with
    ``wait=False`` raises :class:`RunInProgress` at once. A run that lost its lease to another
    run raises :class:`LeaseLost` (with its result) instead of returning.
    """
    ttl_ms = milliseconds(parse_duration(ttl))
    lease_ms = milliseconds(parse_duration(timeout))
    limit = parse_wait(wait_timeout)
    begin = get_script("django_redislua.once_begin")
    finish = get_script("django_redislua.once_finish")

    def once_for(*args: Any, **kwargs: Any) -> _Once:
        return _Once(keys_for("once", key(*args, **kwargs) if callable(key) else key), lease_ms)

    def in_progress(once: _Once) -> RunInProgress:
        return RunInProgress(f"run_once {once.keys.base}: another call is running it")

    def running(once: _Once, body: Invoke) -> Protocol[Any]:
        def attempt() -> Protocol[float | None]:
            reply = yield Call(begin, begin.command([once.keys.base], once.args()))
            return once.read(reply)

        deadline = deadline_after(limit)
        try:
            ready = (yield from attempt()) is None or (wait and (
                yield from until(once.keys.channel, attempt, deadline)))
        except BaseException as exc:
            # The run may have become ours by a call whose reply never came: give it back.
            yield from undone(exc, giving_up(once), f"redislua-once:{once.keys.base}")
            raise
        if not ready:
            raise in_progress(once)
        if once.done:
            return once.result
        renewer = yield from start_renewing(once.lease(), lease_ms / 1000, once.lost,
                                            once.keys.base)
        try:
            result = yield body
        except BaseException:
            # Also on cancellation: give the key back, so a later call runs it again.
            yield from stop_renewing(renewer)
            reply = yield Call(finish, finish.command([once.keys.base],
                                                      once.finish_args("failed", None, ttl_ms)))
            once.finished(reply, "failed", None)
            raise
        yield from stop_renewing(renewer)
        reply = yield Call(finish, finish.command([once.keys.base],
                                                  once.finish_args("done", result, ttl_ms)))
        once.finished(reply, "done", result)
        return result

    def giving_up(once: _Once) -> Protocol[None]:
        """The run given back by its token (a second time changes nothing)."""
        yield from retried(lambda: performed(Call(finish, finish.command(
            [once.keys.base], once.finish_args("failed", None, ttl_ms)))),
            time.monotonic() + lease_ms / 1000)

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        if iscoroutinefunction(func):
            async_func = cast(Callable[P, Awaitable[Any]], func)

            @functools.wraps(func)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                body = Invoke(functools.partial(async_func, *args, **kwargs))
                return await arun(running(once_for(*args, **kwargs), body))

            return cast(Callable[P, R], run_async)

        @functools.wraps(func)
        def run_sync(*args: P.args, **kwargs: P.kwargs) -> R:
            body = Invoke(functools.partial(func, *args, **kwargs))
            return cast(R, run(running(once_for(*args, **kwargs), body)))

        return run_sync

    return decorate


# -- single_flight ----------------------------------------------------------------------------

_FRESH = 1
_STALE = 2
_BUILDING = 3


_NEWER = 2  # flight_finish: a newer version was stored while this one built


class Flight:
    """One caller of a single flight on ``keys`` (the cached value is ``keys.base``). With
    ``versioned``, the value is a VersionedCache entry: it is stored under the version the
    builder saw when it began, and not over a newer one stored meanwhile."""

    def __init__(self, keys: Keys, lock_timeout: float | str, versioned: bool = False) -> None:
        self.keys = keys
        self.versioned = versioned
        self.version: int | None = None
        self.token = secrets.token_hex(16)
        self.lease_seconds = parse_duration(lock_timeout)
        self.lease_ms = milliseconds(self.lease_seconds)
        self.sent_at = 0.0
        self.must_build = False
        self.value: Any = None
        self.lost_counted = False

    def begin_call(self) -> tuple[list[str], list[str | int]]:
        self.sent_at = time.monotonic()
        return [self.keys.base, self.keys.sub("building")], [self.token, self.lease_ms]

    def read(self, reply: list[Any]) -> float | None:
        state, value = int(reply[0]), reply[1]
        if len(reply) > 2 and reply[2] not in (b"", ""):
            self.version = int(reply[2])
        if state in (_FRESH, _STALE):
            self.value = pickle.loads(value)  # our own record, written below
            return None
        if state == _BUILDING:
            pttl = int(value)
            return math.inf if pttl == -1 else max(pttl, 0) / 1000
        self.must_build = True
        return None

    def lease(self) -> Lease:
        return Lease(self.keys.sub("building"), self.token, self.lease_seconds, self.sent_at)

    def lost(self) -> None:
        self.lost_counted = True
        metrics.lock_lost()
        logger.error("single_flight %s: the build lease was lost while building; another "
                     "caller may build at the same time", self.keys.base)

    def finish_call(self, outcome: str, value: Any, ttl: float | str,
                    stale_ttl: float | str) -> tuple[list[str], list[str | int | bytes]]:
        blob = pickle.dumps(value) if outcome == "store" else b""
        stale_ms = 0 if stale_ttl in (0, 0.0) else milliseconds(parse_duration(stale_ttl))
        ttl_ms = milliseconds(parse_duration(ttl))
        guard = str(self.version or 0) if self.versioned else ""
        return [self.keys.base, self.keys.sub("building")], [
            self.token, outcome, blob, ttl_ms, stale_ms, self.keys.channel, guard]

    def finished(self, reply: Any, outcome: str) -> None:
        if int(reply) == _NEWER:
            logger.info("single_flight %s: a newer version was stored while this build ran; "
                        "the built value was not stored", self.keys.base)
        elif int(reply) == 0:
            if not self.lost_counted:  # lost, and the renewer had not said so
                self.lost_counted = True
                metrics.lock_lost()
            logger.warning("single_flight %s: the build outlived its lease and another caller "
                           "took it over; this build's %s was not stored", self.keys.base,
                           "value" if outcome == "store" else "failure")


def single_flight(cache_key: str, build: Callable[[], R], ttl: float | str = 300,
                  lock_timeout: float | str = 10, stale_ttl: float | str = 0) -> R:
    """The value cached under ``cache_key``; on a miss exactly one caller runs ``build`` and the
    others wait for its value. ``lock_timeout`` is the build lease, renewed while ``build`` runs:
    it bounds how long a crashed builder keeps the others waiting. With ``stale_ttl``, the old
    value is kept that much longer and served while a rebuild runs. A builder that lost its
    lease returns its value without storing it over a newer one (and logs it)."""
    return fly(Flight(keys_for("flight", cache_key), lock_timeout), build, ttl, stale_ttl)


def asingle_flight(cache_key: str, build: Callable[[], Awaitable[R]],
                   ttl: float | str = 300, lock_timeout: float | str = 10,
                   stale_ttl: float | str = 0) -> Awaitable[R]:
    """The asyncio twin of :func:`single_flight`, for an async ``build``."""
    return afly(Flight(keys_for("flight", cache_key), lock_timeout), build, ttl, stale_ttl)


def fly(flight: Flight, build: Callable[[], R], ttl: float | str,
        stale_ttl: float | str) -> R:
    """Run one single flight (see :func:`single_flight`)."""
    return cast(R, run(flying(flight, Invoke(build), ttl, stale_ttl)))


def afly(flight: Flight, build: Callable[[], Awaitable[R]], ttl: float | str,
         stale_ttl: float | str) -> Awaitable[R]:
    """The asyncio twin of :func:`fly`."""
    return arun(flying(flight, Invoke(build), ttl, stale_ttl))


def flying(flight: Flight, build: Invoke, ttl: float | str, stale_ttl: float | str
           ) -> Protocol[Any]:
    """One single flight: read the value, or wait for its build, or build it."""
    begin = get_script("django_redislua.flight_begin")
    finish = get_script("django_redislua.flight_finish")

    def attempt() -> Protocol[float | None]:
        keys, args = flight.begin_call()
        return flight.read((yield Call(begin, begin.command(keys, args))))

    def ending(outcome: str, value: Any) -> Protocol[Any]:
        keys, args = flight.finish_call(outcome, value, ttl, stale_ttl)
        return (yield Call(finish, finish.command(keys, args)))

    try:
        if (yield from attempt()) is not None:
            yield from until(flight.keys.channel, attempt, None)
    except BaseException as exc:
        # The build lease may be ours by a call whose reply never came: give it back.
        giving_up = retried(lambda: ending("failed", None),
                            time.monotonic() + flight.lease_seconds)
        yield from undone(exc, giving_up, f"redislua-flight:{flight.keys.base}")
        raise
    if not flight.must_build:
        return flight.value
    renewer = yield from start_renewing(flight.lease(), flight.lease_seconds, flight.lost,
                                        flight.keys.base)
    try:
        value = yield build
    except BaseException:
        yield from stop_renewing(renewer)
        flight.finished((yield from ending("failed", None)), "failed")
        raise
    yield from stop_renewing(renewer)
    flight.finished((yield from ending("store", value)), "store")
    return value
