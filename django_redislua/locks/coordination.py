"""``singleton``, ``run_once`` and ``single_flight``: the three classic coordination jobs.

- ``singleton``: a job runs on one instance at a time (a Lock with auto-renewal); others skip.
- ``run_once``: an idempotent handler; the first run's result is stored and returned to every
  later call with the same key. A failure stores nothing, so a later call runs again.
- ``single_flight``: on a cache miss one caller builds the value, the others wait for it (or are
  served the stale copy); ``build`` never runs twice at once for one key.

Results and values are pickled, as Django's cache does: only store what your own code built.
"""

from __future__ import annotations

import asyncio
import functools
import math
import pickle
import secrets
import sys
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar, cast

from asgiref.sync import iscoroutinefunction

from django_redislua.limiting.rates import parse_duration
from django_redislua.locks.keys import Keys, keys_for
from django_redislua.locks.lock import Lock, LockError, keep_running, milliseconds, parse_wait
from django_redislua.locks.waiting import await_until, wait_until
from django_redislua.scripts import get_script

P = ParamSpec("P")
R = TypeVar("R")

_RUN = 0
_IN_PROGRESS = 1
_DONE = 2


class RunInProgress(LockError):
    """``run_once``: the same key is running elsewhere and this call would not (or could no
    longer) wait for its result."""


# -- singleton --------------------------------------------------------------------------------

def singleton(name: str, timeout: float | str, wait: bool = False,
              blocking_timeout: float | str | None = None
              ) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
    """Run the decorated job on one instance at a time: others return None (or, with
    ``wait=True``, wait their turn). The lock renews itself while the job runs, so ``timeout``
    only bounds how long a crashed instance keeps others out."""

    def decorate(func: Callable[P, R]) -> Callable[P, R | None]:
        def lock() -> Lock:
            return Lock(name, timeout, blocking=wait, blocking_timeout=blocking_timeout,
                        auto_renew=True)

        if iscoroutinefunction(func):
            async_func = cast(Callable[P, Awaitable[Any]], func)

            @functools.wraps(func)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                held = lock()
                if not await held.aacquire():
                    return None
                try:
                    result = await async_func(*args, **kwargs)
                except BaseException:
                    await held.__aexit__(*sys.exc_info())
                    raise
                await held.__aexit__(None, None, None)
                return result

            return cast(Callable[P, R | None], run_async)

        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> R | None:
            held = lock()
            if not held.acquire():
                return None
            try:
                result = func(*args, **kwargs)
            except BaseException:
                held.__exit__(*sys.exc_info())
                raise
            held.__exit__(None, None, None)
            return result

        return run

    return decorate


# -- run_once ---------------------------------------------------------------------------------

class _Once:
    """One call of a run_once handler: its key, its run token, what Redis said."""

    def __init__(self, keys: Keys, lease_ms: int) -> None:
        self.keys = keys
        self.token = secrets.token_hex(16)
        self.lease_ms = lease_ms
        self.must_run = False
        self.result: Any = None
        self.done = False

    def args(self) -> list[str | int]:
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

    def finish_args(self, outcome: str, result: Any, ttl_ms: int) -> list[str | int | bytes]:
        blob = pickle.dumps(result) if outcome == "done" else b""
        return [self.token, outcome, blob, ttl_ms, self.keys.channel]


def run_once(key: str | Callable[..., str], ttl: float | str = "1d",
             timeout: float | str = "10m", wait: bool = True,
             wait_timeout: float | str | None = None
             ) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Make a handler idempotent per key: the first successful run's result is kept for ``ttl``
    and returned by every later call with the same key, without running the handler again.

    ``key`` is a string or a callable given the handler's arguments. ``timeout`` bounds a run
    (a crashed run frees the key after it). A duplicate arriving mid-run waits for the result
    (up to ``wait_timeout``), or with ``wait=False`` raises :class:`RunInProgress` at once.
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

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        if iscoroutinefunction(func):
            async_func = cast(Callable[P, Awaitable[Any]], func)

            @functools.wraps(func)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                once = once_for(*args, **kwargs)

                async def attempt() -> float | None:
                    return once.read(await begin.acall(keys=[once.keys.base], args=once.args()))

                if await attempt() is not None and (
                    not wait or not await await_until(once.keys.channel, attempt, limit)
                ):
                    raise in_progress(once)
                if once.done:
                    return once.result
                try:
                    result = await async_func(*args, **kwargs)
                except BaseException:
                    # Also on cancellation: give the key back, in the background if need be.
                    keep_running(asyncio.get_running_loop().create_task(finish.acall(
                        keys=[once.keys.base], args=once.finish_args("failed", None, ttl_ms))))
                    raise
                await finish.acall(keys=[once.keys.base],
                                   args=once.finish_args("done", result, ttl_ms))
                return result

            return cast(Callable[P, R], run_async)

        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            once = once_for(*args, **kwargs)

            def attempt() -> float | None:
                return once.read(begin(keys=[once.keys.base], args=once.args()))

            if attempt() is not None and (
                not wait or not wait_until(once.keys.channel, attempt, limit)
            ):
                raise in_progress(once)
            if once.done:
                return cast(R, once.result)
            try:
                result = func(*args, **kwargs)
            except BaseException:
                finish(keys=[once.keys.base], args=once.finish_args("failed", None, ttl_ms))
                raise
            finish(keys=[once.keys.base], args=once.finish_args("done", result, ttl_ms))
            return result

        return run

    return decorate


# -- single_flight ----------------------------------------------------------------------------

_FRESH = 1
_STALE = 2
_BUILDING = 3


class _Flight:
    def __init__(self, cache_key: str, lock_timeout: float | str) -> None:
        self.keys = keys_for("flight", cache_key)
        self.token = secrets.token_hex(16)
        self.lease_ms = milliseconds(parse_duration(lock_timeout))
        self.must_build = False
        self.value: Any = None

    def begin_call(self) -> tuple[list[str], list[str | int]]:
        return [self.keys.base, self.keys.sub("building")], [self.token, self.lease_ms]

    def read(self, reply: list[Any]) -> float | None:
        state, value = int(reply[0]), reply[1]
        if state in (_FRESH, _STALE):
            self.value = pickle.loads(value)  # our own record, written below
            return None
        if state == _BUILDING:
            pttl = int(value)
            return math.inf if pttl == -1 else max(pttl, 0) / 1000
        self.must_build = True
        return None

    def finish_call(self, outcome: str, value: Any, ttl: float | str,
                    stale_ttl: float | str) -> tuple[list[str], list[str | int | bytes]]:
        blob = pickle.dumps(value) if outcome == "store" else b""
        stale_ms = 0 if stale_ttl in (0, 0.0) else milliseconds(parse_duration(stale_ttl))
        ttl_ms = milliseconds(parse_duration(ttl))
        return [self.keys.base, self.keys.sub("building")], [
            self.token, outcome, blob, ttl_ms, stale_ms, self.keys.channel]


def single_flight(cache_key: str, build: Callable[[], R], ttl: float | str = 300,
                  lock_timeout: float | str = 10, stale_ttl: float | str = 0) -> R:
    """The value cached under ``cache_key``; on a miss exactly one caller runs ``build`` and the
    others wait for its value (up to ``lock_timeout``, then one of them builds). With
    ``stale_ttl``, the old value is kept that much longer and served while a rebuild runs."""
    flight = _Flight(cache_key, lock_timeout)
    begin = get_script("django_redislua.flight_begin")
    keys, args = flight.begin_call()

    def attempt() -> float | None:
        return flight.read(begin(keys=keys, args=args))

    if attempt() is not None:
        wait_until(flight.keys.channel, attempt, None)
    if not flight.must_build:
        return cast(R, flight.value)
    finish = get_script("django_redislua.flight_finish")
    try:
        value = build()
    except BaseException:
        done_keys, done_args = flight.finish_call("failed", None, ttl, stale_ttl)
        finish(keys=done_keys, args=done_args)
        raise
    done_keys, done_args = flight.finish_call("store", value, ttl, stale_ttl)
    finish(keys=done_keys, args=done_args)
    return value


async def asingle_flight(cache_key: str, build: Callable[[], Awaitable[R]],
                         ttl: float | str = 300, lock_timeout: float | str = 10,
                         stale_ttl: float | str = 0) -> R:
    """The asyncio twin of :func:`single_flight`, for an async ``build``."""
    flight = _Flight(cache_key, lock_timeout)
    begin = get_script("django_redislua.flight_begin")
    keys, args = flight.begin_call()

    async def attempt() -> float | None:
        return flight.read(await begin.acall(keys=keys, args=args))

    if await attempt() is not None:
        await await_until(flight.keys.channel, attempt, None)
    if not flight.must_build:
        return cast(R, flight.value)
    finish = get_script("django_redislua.flight_finish")
    try:
        value = await build()
    except BaseException:
        done_keys, done_args = flight.finish_call("failed", None, ttl, stale_ttl)
        keep_running(asyncio.get_running_loop().create_task(
            finish.acall(keys=done_keys, args=done_args)))
        raise
    done_keys, done_args = flight.finish_call("store", value, ttl, stale_ttl)
    await finish.acall(keys=done_keys, args=done_args)
    return value
