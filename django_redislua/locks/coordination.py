"""``singleton``, and what every coordination helper shares (``run_once`` is in
:mod:`~django_redislua.locks.once`, ``single_flight`` in :mod:`~django_redislua.locks.flight`).

- ``singleton``: a job runs on one instance at a time (a Lock with auto-renewal); others skip.

Each helper holds a lease while the user's code runs and renews it (``lease.Renewer``), so a
timeout only bounds how long a crashed process keeps the others out. A lease lost anyway (the
process paused, Redis unreachable for longer than the lease) is never dropped silently:
``singleton`` and ``run_once`` raise :class:`LeaseLost` after the body, ``single_flight`` does not
store the value it built over a newer one; each logs it. What the caller's own code raises
passes through unchanged (:func:`own_errors`); Redis failing is ``LockUnavailable``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast

from asgiref.sync import iscoroutinefunction

from django_redislua.atransport import arun
from django_redislua.connection import CLIENT_ERRORS
from django_redislua.locks.errors import LeaseLost, lock_errors
from django_redislua.locks.lock import Lock
from django_redislua.protocol import Execute, Invoke, Protocol
from django_redislua.replies import text
from django_redislua.transport import run

logger = logging.getLogger("django_redislua.locks")

P = ParamSpec("P")
R = TypeVar("R")


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
                logger.info("%s skipped: %s", what, (yield from holder_of(held)))
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


def holder_of(lock: Lock) -> Protocol[str]:
    """Who holds ``lock``, for a log line: its fencing token and how long its lease has left
    (a Redis failure only makes the line shorter)."""
    line, _left = yield from holding(lock)
    return line


def holding(lock: Lock) -> Protocol[tuple[str, float | None]]:
    """Who holds ``lock`` (:func:`holder_of`'s line) and the seconds its lease has left (0 when
    it has just ended; None when Redis could not say)."""
    try:
        token, = yield Execute(("HMGET", lock.keys.base, "token"))
        left_ms = int((yield Execute(("PTTL", lock.keys.base))))
    except CLIENT_ERRORS:
        return "another instance holds it", None
    if token is None:
        return "another instance held it (its lease has just ended)", 0.0
    left = max(left_ms, 0) / 1000
    return f"another instance holds it (fencing token {text(token)}, lease ends in {left:.1f}s)", \
        left
