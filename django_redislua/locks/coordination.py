"""``singleton``, ``run_once`` and ``single_flight``: the three classic coordination jobs.

- ``singleton``: a job runs on one instance at a time (a Lock with auto-renewal); others skip.
- ``run_once``: an idempotent handler; the first run's result is stored and returned to every
  later call with the same key. A failure stores nothing, so a later call runs again; a run
  whose process died frees the key when its lease ends. ``handler.outcome(...)`` tells whether
  this call ran it, or who did and when, or who runs it now (:class:`RunOutcome`).
- ``single_flight``: on a cache miss one caller builds the value, the others wait for it (or are
  served the stale copy); ``build`` never runs twice at once for one key, and the callers
  waiting on a build that raises share its failure (:class:`BuildFailed`) instead of each
  building in turn. ``forget_flight`` invalidates an entry.

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
import os
import pickle
import secrets
import socket
import time
import typing
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Literal, ParamSpec, TypeVar, cast, overload

from asgiref.sync import iscoroutinefunction

from django_redislua import metrics
from django_redislua.connection import CLIENT_ERRORS
from django_redislua.limiting.rates import parse_duration
from django_redislua.locks.keys import Keys, keys_for
from django_redislua.locks.lease import Lease, milliseconds, start_renewing, stop_renewing
from django_redislua.locks.lock import LeaseLost, Lock, LockError, lock_errors, parse_wait
from django_redislua.locks.waiting import deadline_after, until
from django_redislua.protocol import Call, Execute, Invoke, Protocol, performed, retried, undone
from django_redislua.replies import text
from django_redislua.scripts import get_script
from django_redislua.transport import arun, run

logger = logging.getLogger("django_redislua.locks")

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class _Raised(Exception):
    """Carries an exception the caller's own code (a job, a handler, a build) raised past
    :func:`lock_errors`, which turns only this module's own Redis failures into
    LockUnavailable: a build that itself fails to reach Redis raises its own error."""

    def __init__(self, exc: Exception) -> None:
        super().__init__(exc)
        self.exc = exc


def _own(body: Invoke) -> Protocol[Any]:
    """``yield body``, an Exception it raises carried in :class:`_Raised` (a cancellation, a
    BaseException, passes as it is)."""
    try:
        return (yield body)
    except Exception as exc:
        raise _Raised(exc) from None


def own_errors(protocol: Protocol[R]) -> Protocol[R]:
    """``protocol`` with Redis failing raised as LockUnavailable, and the caller's own
    exceptions (:class:`_Raised`) raised as they are. Every entry point runs through it."""
    own: Exception | None = None
    try:
        return (yield from lock_errors(protocol))
    except _Raised as carried:
        own = carried.exc
    raise own  # outside the except: not chained to the carrier


def unwrapped(exc: BaseException) -> BaseException:
    """The caller's own exception a :class:`_Raised` carries, else ``exc``."""
    return exc.exc if isinstance(exc, _Raised) else exc

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
                result = yield from _own(body)
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
                return await arun(own_errors(running(Invoke(functools.partial(async_func, *args,
                                                                                **kwargs)))))

            return cast(Callable[P, R | None], run_async)

        @functools.wraps(func)
        def run_sync(*args: P.args, **kwargs: P.kwargs) -> R | None:
            return cast(R | None, run(own_errors(running(Invoke(functools.partial(func, *args,
                                                                             **kwargs))))))

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
    return (f"another instance holds it (fencing token {text(token)}, lease ends in "
            f"{max(left_ms, 0) / 1000:.1f}s)")


# -- run_once ---------------------------------------------------------------------------------

# Who runs a job, as a run_once record keeps it: "<host>:<pid>", the host name cut short so a
# record stays small whatever the host is called.
_HOST_CHARS = 100


def _runner() -> str:
    """This process, as a run_once record names its runner (read per call: a fork changes it)."""
    return f"{socket.gethostname()[:_HOST_CHARS]}:{os.getpid()}"


def _text(value: bytes | str | None) -> str:
    """A reply's text ("" for none)."""
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _server_time(ms: Any) -> datetime | None:
    """A time a script read from the server's clock (ms), or None when the record had none
    (an empty field: a record written before this field existed)."""
    if ms in (None, False, b"", ""):
        return None
    return datetime.fromtimestamp(int(ms) / 1000, UTC)


@dataclass(frozen=True)
class RunOutcome(Generic[R_co]):
    """What one call of a ``run_once`` handler did (``handler.outcome(...)``).

    - ``status="ran"``: this call ran the handler; ``result`` is what it returned.
    - ``status="done"``: an earlier call ran it; ``result`` is its stored result, ``ran_by``
      and ``finished_at`` who ran it and when.
    - ``status="running"``: another call runs it now and this one did not (``wait=False``) or
      no longer (``wait_timeout``) wait; ``ran_by`` and ``started_at`` say who runs it and since
      when, ``lease_ends_at`` when its running lease ends unless renewed (a run whose process
      died frees the key then). ``result`` is None.

    Times are the Redis server's clock, in UTC. ``ran_by`` is ``"<host>:<pid>"``; it and the
    times are None for a record written by a version that did not keep them (a rolling
    deploy's older servers).
    """

    status: Literal["ran", "done", "running"]
    result: R_co | None = None
    ran_by: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lease_ends_at: datetime | None = None


class OnceHandler(typing.Protocol[P, R_co]):
    """A sync ``run_once`` handler: called, it returns the result (its own or the stored one);
    ``outcome(...)``, with the same arguments, also says who ran it (:class:`RunOutcome`)."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def outcome(self, *args: P.args, **kwargs: P.kwargs) -> RunOutcome[R_co]: ...


class AsyncOnceHandler(typing.Protocol[P, R_co]):
    """An async ``run_once`` handler: both the call and ``outcome(...)`` are awaited."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R_co]: ...

    def outcome(self, *args: P.args, **kwargs: P.kwargs
                ) -> Coroutine[Any, Any, RunOutcome[R_co]]: ...


class OnceDecorator(typing.Protocol):
    """What ``run_once(...)`` returns: a decorator of sync and async handlers."""

    @overload
    def __call__(  # type: ignore[overload-overlap]
            self, func: Callable[P, Coroutine[Any, Any, R]]) -> AsyncOnceHandler[P, R]: ...

    @overload
    def __call__(self, func: Callable[P, R]) -> OnceHandler[P, R]: ...


class _Once:
    """One call of a run_once handler: its key, its run token, what Redis said."""

    def __init__(self, keys: Keys, lease_ms: int) -> None:
        self.keys = keys
        self.token = secrets.token_hex(16)
        self.runner = _runner()
        self.lease_ms = lease_ms
        self.sent_at = 0.0
        self.must_run = False
        self.started_ms: Any = None  # this call's run began (server clock), once it must run
        self.lost_counted = False
        # What the last reply said: the stored outcome (done), or the run in progress.
        self.found: RunOutcome[Any] | None = None

    def lost(self) -> None:
        """The renewer gave up: the lease ran out unrenewed, or another run took it."""
        self.lost_counted = True
        metrics.lock_lost()
        logger.error("run_once %s: the running lease was lost while the handler ran",
                     self.keys.base)

    def args(self) -> list[str | int]:
        self.sent_at = time.monotonic()
        return [self.token, self.lease_ms, self.runner]

    def read(self, reply: list[Any]) -> float | None:
        state = int(reply[0])
        if state == _DONE:
            self.found = RunOutcome(
                "done", pickle.loads(reply[1]),  # our own record, written below
                ran_by=_text(reply[2]) or None, finished_at=_server_time(reply[3]),
                started_at=_server_time(reply[4]))
            return None
        if state == _RUN:
            self.must_run = True
            self.started_ms = reply[2]
            return None
        pttl, now = int(reply[1]), reply[4]
        self.found = RunOutcome(
            "running", ran_by=_text(reply[2]) or None, started_at=_server_time(reply[3]),
            lease_ends_at=None if pttl < 0 else _server_time(int(now) + pttl))
        return math.inf if pttl == -1 else max(pttl, 0) / 1000

    def lease(self) -> Lease:
        return Lease(self.keys.base, self.token, self.lease_ms / 1000, self.sent_at)

    def finish_args(self, outcome: str, result: Any, ttl_ms: int) -> list[str | int | bytes]:
        blob = pickle.dumps(result) if outcome == "done" else b""
        return [self.token, outcome, blob, ttl_ms, self.keys.channel, self.runner,
                self.started_ms or ""]

    def finished(self, reply: Any, outcome: str, result: Any) -> RunOutcome[Any]:
        """Read once_finish's reply: raise LeaseLost when another run took the key over."""
        what = f"run_once {self.keys.base}"
        code = int(reply[0])
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
        return RunOutcome("ran", result, ran_by=self.runner,
                          started_at=_server_time(self.started_ms),
                          finished_at=_server_time(reply[1]))


def run_once(key: str | Callable[..., str], ttl: float | str = "1d",
             timeout: float | str = "10m", wait: bool = True,
             wait_timeout: float | str | None = None) -> OnceDecorator:
    """Make a handler idempotent per key: the first successful run's result is kept for ``ttl``
    and returned by every later call with the same key, without running the handler again.

    ``key`` is a string or a callable given the handler's arguments. ``timeout`` is the running
    lease, renewed every third of it while the handler runs: it bounds how long a run whose
    process died keeps the key (then the next call, or a duplicate waiting, runs it). A
    duplicate arriving mid-run waits for the result (up to ``wait_timeout``), or with
    ``wait=False`` raises :class:`RunInProgress` at once. A run that lost its lease to another
    run raises :class:`LeaseLost` (with its result) instead of returning.

    The decorated handler also has ``outcome(*args, **kwargs)`` (awaited for an async
    handler): the same call, returning a :class:`RunOutcome` that says whether this call ran
    the handler, or who did and when; a run in progress elsewhere is ``status="running"``
    instead of :class:`RunInProgress`.
    """
    ttl_ms = milliseconds(parse_duration(ttl))
    lease_ms = milliseconds(parse_duration(timeout))
    limit = parse_wait(wait_timeout)
    begin = get_script("django_redislua.once_begin")
    finish = get_script("django_redislua.once_finish")

    def once_for(*args: Any, **kwargs: Any) -> _Once:
        return _Once(keys_for("once", key(*args, **kwargs) if callable(key) else key), lease_ms)

    def running(once: _Once, body: Invoke) -> Protocol[RunOutcome[Any]]:
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
        if not ready or not once.must_run:
            assert once.found is not None  # read by the last attempt
            return once.found
        renewer = yield from start_renewing(once.lease(), lease_ms / 1000, once.lost,
                                            once.keys.base)
        try:
            result = yield from _own(body)
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
        return once.finished(reply, "done", result)

    def calling(once: _Once, body: Invoke) -> Protocol[Any]:
        """The plain call: the result, or RunInProgress for a run in progress elsewhere."""
        outcome = yield from running(once, body)
        if outcome.status == "running":
            raise RunInProgress(f"run_once {once.keys.base}: another call is running it")
        return outcome.result

    def giving_up(once: _Once) -> Protocol[None]:
        """The run given back by its token (a second time changes nothing)."""
        yield from retried(lambda: performed(Call(finish, finish.command(
            [once.keys.base], once.finish_args("failed", None, ttl_ms)))),
            time.monotonic() + lease_ms / 1000)

    def decorate(func: Callable[P, Any]) -> Any:
        if iscoroutinefunction(func):
            async_func = cast(Callable[P, Awaitable[Any]], func)

            def async_body(*args: Any, **kwargs: Any) -> Invoke:
                return Invoke(functools.partial(async_func, *args, **kwargs))

            @functools.wraps(func)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                return await arun(own_errors(calling(once_for(*args, **kwargs),
                                                     async_body(*args, **kwargs))))

            async def outcome_async(*args: P.args, **kwargs: P.kwargs) -> RunOutcome[Any]:
                return await arun(own_errors(running(once_for(*args, **kwargs),
                                                     async_body(*args, **kwargs))))

            run_async.outcome = outcome_async  # type: ignore[attr-defined]
            return run_async

        @functools.wraps(func)
        def run_sync(*args: P.args, **kwargs: P.kwargs) -> Any:
            body = Invoke(functools.partial(func, *args, **kwargs))
            return run(own_errors(calling(once_for(*args, **kwargs), body)))

        def outcome_sync(*args: P.args, **kwargs: P.kwargs) -> RunOutcome[Any]:
            body = Invoke(functools.partial(func, *args, **kwargs))
            return run(own_errors(running(once_for(*args, **kwargs), body)))

        run_sync.outcome = outcome_sync  # type: ignore[attr-defined]
        return run_sync

    return cast(OnceDecorator, decorate)


# -- single_flight ----------------------------------------------------------------------------

# flight_begin's replies
_FRESH = 1
_STALE = 2
_BUILDING = 3
_FAILED = 4

# flight_finish's replies (1: done as asked)
_LOST = 0
_NEWER = 2  # a newer version was stored while this one built
_FORGOTTEN = 3  # forget_flight ran while this one built

# What a failed build's waiters are told of its exception (its class and text), at most.
_ERROR_CHARS = 200
_MESSAGE_CHARS = 1000


class BuildFailed(Exception):
    """``single_flight`` (and ``VersionedCache.get_or_build``): the build this caller waited
    for raised. The callers waiting on a build share its outcome, value or failure, instead of
    each building in turn; the builder itself gets its own exception. ``error`` names the
    builder's exception class (``module.QualName``), ``message`` is its text (at most 1000
    characters), ``cache_key`` the entry's key."""

    def __init__(self, cache_key: str, error: str, message: str) -> None:
        super().__init__(f"the build of {cache_key!r} this call waited for raised {error}: "
                         f"{message}")
        self.cache_key, self.error, self.message = cache_key, error, message

    def __reduce__(self) -> tuple[Any, ...]:
        return BuildFailed, (self.cache_key, self.error, self.message)


def _described(exc: BaseException) -> tuple[str, str]:
    """An exception as a failed build's waiters are told it: its class and its text, bounded."""
    kind = type(exc)
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not hide the build's own failure
        message = "<unprintable>"
    return (f"{kind.__module__}.{kind.__qualname__}"[:_ERROR_CHARS],
            message[:_MESSAGE_CHARS])


class Flight:
    """One caller of a single flight on ``keys`` (the cached value is ``keys.base``). With
    ``versioned``, the value is a VersionedCache entry: it is stored under the version the
    builder saw when it began, and not over a newer one stored meanwhile. ``name`` is the
    cache key as its caller gave it (for :class:`BuildFailed`)."""

    def __init__(self, keys: Keys, lock_timeout: float | str, versioned: bool = False,
                 name: str | None = None) -> None:
        self.keys = keys
        self.name = keys.base if name is None else name
        self.versioned = versioned
        self.version: int | None = None
        self.token = secrets.token_hex(16)
        self.lease_seconds = parse_duration(lock_timeout)
        self.lease_ms = milliseconds(self.lease_seconds)
        self.sent_at = 0.0
        self.must_build = False
        self.value: Any = None
        self.failure: BuildFailed | None = None
        # When this caller began waiting for a build (server clock, microseconds, as text):
        # a build failing after it is this caller's outcome too.
        self.waiting_since = ""
        self.lost_counted = False

    def lease_keys(self) -> list[str]:
        """The cached value, the build lease, the last failed build."""
        return flight_keys(self.keys)

    def begin_call(self) -> tuple[list[str], list[str | int]]:
        self.sent_at = time.monotonic()
        return self.lease_keys(), [self.token, self.lease_ms, self.waiting_since]

    def read(self, reply: list[Any]) -> float | None:
        state = int(reply[0])
        if state == _FAILED:
            self.failure = BuildFailed(self.name, _text(reply[1]), _text(reply[2]))
            return None
        if state == _BUILDING:
            self.waiting_since = self.waiting_since or _text(reply[2])
            pttl = int(reply[1])
            return math.inf if pttl == -1 else max(pttl, 0) / 1000
        if reply[2] not in (b"", ""):
            self.version = int(reply[2])
        if state in (_FRESH, _STALE):
            self.value = pickle.loads(reply[1])  # our own record, written below
            return None
        self.must_build = True
        return None

    def lease(self) -> Lease:
        return Lease(self.keys.sub("building"), self.token, self.lease_seconds, self.sent_at)

    def lost(self) -> None:
        self.lost_counted = True
        metrics.lock_lost()
        logger.error("single_flight %s: the build lease was lost while building; another "
                     "caller may build at the same time", self.keys.base)

    def finish_call(self, outcome: str, value: Any, ttl: float | str, stale_ttl: float | str
                    ) -> tuple[list[str], list[str | int | bytes]]:
        """flight_finish's keys and arguments: ``outcome`` "store" (``value`` is the value),
        "failed" (``value`` is the exception) or "released"."""
        blob, message = b"", ""
        if outcome == "store":
            blob = pickle.dumps(value)
        elif outcome == "failed":
            error, message = _described(value)
            blob = error.encode()
        stale_ms = 0 if stale_ttl in (0, 0.0) else milliseconds(parse_duration(stale_ttl))
        ttl_ms = milliseconds(parse_duration(ttl))
        guard = str(self.version or 0) if self.versioned else ""
        return self.lease_keys(), [self.token, outcome, blob, ttl_ms, stale_ms,
                                   self.keys.channel, guard, message, self.lease_ms]

    def finished(self, reply: Any, outcome: str) -> None:
        code = int(reply)
        if code == _NEWER:
            logger.info("single_flight %s: a newer version was stored while this build ran; "
                        "the built value was not stored", self.keys.base)
        elif code == _FORGOTTEN and outcome == "store":
            logger.info("single_flight %s: the entry was forgotten while this build ran; the "
                        "built value was not stored", self.keys.base)
        elif code == _LOST:
            if not self.lost_counted:  # lost, and the renewer had not said so
                self.lost_counted = True
                metrics.lock_lost()
            logger.warning("single_flight %s: the build outlived its lease and another caller "
                           "took it over; this build's %s was not stored", self.keys.base,
                           "value" if outcome == "store" else "failure")


def flight_keys(keys: Keys) -> list[str]:
    """The keys of a single flight entry: its value, its build lease, its last failed build."""
    return [keys.base, keys.sub("building"), keys.sub("failed")]


def single_flight(cache_key: str, build: Callable[[], R], ttl: float | str = 300,
                  lock_timeout: float | str = 10, stale_ttl: float | str = 0) -> R:
    """The value cached under ``cache_key``; on a miss exactly one caller runs ``build`` and the
    others wait for its value. If ``build`` raises, its caller gets that exception and the
    callers waiting on it get :class:`BuildFailed` (nothing is cached: the next caller builds
    again). ``lock_timeout`` is the build lease, renewed while ``build`` runs: it bounds how
    long a crashed builder keeps the others waiting. With ``stale_ttl``, the old value is kept
    that much longer and served while a rebuild runs. A builder that lost its lease returns
    its value without storing it over a newer one (and logs it). :func:`forget_flight`
    invalidates the entry."""
    return fly(Flight(keys_for("flight", cache_key), lock_timeout, name=cache_key), build, ttl,
               stale_ttl)


def asingle_flight(cache_key: str, build: Callable[[], Awaitable[R]],
                   ttl: float | str = 300, lock_timeout: float | str = 10,
                   stale_ttl: float | str = 0) -> Awaitable[R]:
    """The asyncio twin of :func:`single_flight`, for an async ``build``."""
    return afly(Flight(keys_for("flight", cache_key), lock_timeout, name=cache_key), build,
                ttl, stale_ttl)


def forget_flight(cache_key: str) -> bool:
    """Invalidate the value :func:`single_flight` cached under ``cache_key`` (fresh or stale):
    the next call builds it again. A build running now keeps running (no second build starts
    beside it) and its caller gets its value, but it is not stored: it may have read the data
    before the change that made you invalidate. True when a value was cached."""
    return run(lock_errors(forgetting(keys_for("flight", cache_key))))


async def aforget_flight(cache_key: str) -> bool:
    """The asyncio twin of :func:`forget_flight`."""
    return await arun(lock_errors(forgetting(keys_for("flight", cache_key))))


def forgetting(keys: Keys) -> Protocol[bool]:
    """Forget a single flight entry (see :func:`forget_flight`): one script call."""
    script = get_script("django_redislua.flight_forget")
    return bool((yield Call(script, script.command(flight_keys(keys), []))))


def fly(flight: Flight, build: Callable[[], R], ttl: float | str,
        stale_ttl: float | str) -> R:
    """Run one single flight (see :func:`single_flight`)."""
    return cast(R, run(own_errors(flying(flight, Invoke(build), ttl, stale_ttl))))


def afly(flight: Flight, build: Callable[[], Awaitable[R]], ttl: float | str,
         stale_ttl: float | str) -> Awaitable[R]:
    """The asyncio twin of :func:`fly`."""
    return arun(own_errors(flying(flight, Invoke(build), ttl, stale_ttl)))


def flying(flight: Flight, build: Invoke, ttl: float | str, stale_ttl: float | str
           ) -> Protocol[Any]:
    """One single flight: read the value, or wait for its build (sharing its failure), or
    build it."""
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
        giving_up = retried(lambda: ending("released", None),
                            time.monotonic() + flight.lease_seconds)
        yield from undone(exc, giving_up, f"redislua-flight:{flight.keys.base}")
        raise
    if flight.failure is not None:
        raise flight.failure
    if not flight.must_build:
        return flight.value
    renewer = yield from start_renewing(flight.lease(), flight.lease_seconds, flight.lost,
                                        flight.keys.base)
    try:
        value = yield from _own(build)
    except BaseException as exc:
        yield from stop_renewing(renewer)
        # A cancelled build (not an error of the build) is not shared: a waiter builds instead.
        own = unwrapped(exc)
        outcome = "failed" if isinstance(own, Exception) else "released"
        flight.finished((yield from ending(outcome, own)), outcome)
        raise
    yield from stop_renewing(renewer)
    flight.finished((yield from ending("store", value)), "store")
    return value
