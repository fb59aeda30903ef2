"""``single_flight``: on a cache miss one caller builds the value, the others wait for it (or
are served the stale copy); ``build`` never runs twice at once for one key, and the callers
waiting on a build that raises share its failure (:class:`BuildFailed`) instead of each building
in turn. ``forget_flight`` invalidates an entry. :class:`~django_redislua.recipes.VersionedCache`
builds on it.

Values are pickled, as Django's cache does: only store what your own code built.
"""

from __future__ import annotations

import logging
import pickle
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from django_redislua import metrics
from django_redislua.atransport import arun
from django_redislua.limiting.rates import parse_duration
from django_redislua.locks.coordination import _own, own_errors, unwrapped
from django_redislua.locks.errors import lock_errors
from django_redislua.locks.keys import Keys, keys_for
from django_redislua.locks.lease import Lease, milliseconds, start_renewing, stop_renewing
from django_redislua.locks.waiting import seconds_left, until
from django_redislua.protocol import Call, Invoke, Protocol, retried, undone
from django_redislua.replies import text
from django_redislua.scripts import get_script
from django_redislua.transport import run

logger = logging.getLogger("django_redislua.locks")

R = TypeVar("R")


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
            self.failure = BuildFailed(self.name, text(reply[1] or ""), text(reply[2] or ""))
            return None
        if state == _BUILDING:
            self.waiting_since = self.waiting_since or text(reply[2] or "")
            pttl = int(reply[1])
            return seconds_left(pttl)
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
