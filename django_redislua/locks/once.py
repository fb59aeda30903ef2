"""``run_once``: an idempotent handler; the first run's result is stored and returned to every
later call with the same key. A failure stores nothing, so a later call runs again; a run whose
process died frees the key when its lease ends. ``handler.outcome(...)`` tells whether this call
ran it, or who did and when, or who runs it now (:class:`RunOutcome`).

Results are pickled, as Django's cache does: only store what your own code built.
"""

from __future__ import annotations

import functools
import logging
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
from django_redislua.atransport import arun
from django_redislua.limiting.rates import parse_duration
from django_redislua.locks.coordination import _lease_lost, _own, own_errors
from django_redislua.locks.errors import LeaseLost, LockError, parse_wait
from django_redislua.locks.keys import Keys, keys_for
from django_redislua.locks.lease import Lease, milliseconds, start_renewing, stop_renewing
from django_redislua.locks.waiting import deadline_after, seconds_left, until
from django_redislua.protocol import Call, Invoke, Protocol, performed, retried, undone
from django_redislua.replies import text
from django_redislua.scripts import get_script
from django_redislua.transport import run

logger = logging.getLogger("django_redislua.locks")

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


# -- run_once ---------------------------------------------------------------------------------

_RUN = 0
_IN_PROGRESS = 1
_DONE = 2


class RunInProgress(LockError):
    """``run_once``: the same key is running elsewhere and this call would not (or could no
    longer) wait for its result."""


# Who runs a job, as a run_once record keeps it: "<host>:<pid>", the host name cut short so a
# record stays small whatever the host is called.
_HOST_CHARS = 100


def _runner() -> str:
    """This process, as a run_once record names its runner (read per call: a fork changes it)."""
    return f"{socket.gethostname()[:_HOST_CHARS]}:{os.getpid()}"


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
                ran_by=text(reply[2] or "") or None, finished_at=_server_time(reply[3]),
                started_at=_server_time(reply[4]))
            return None
        if state == _RUN:
            self.must_run = True
            self.started_ms = reply[2]
            return None
        pttl, now = int(reply[1]), reply[4]
        self.found = RunOutcome(
            "running", ran_by=text(reply[2] or "") or None, started_at=_server_time(reply[3]),
            lease_ends_at=None if pttl < 0 else _server_time(int(now) + pttl))
        return seconds_left(pttl)

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

        deadline = yield from deadline_after(limit)
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
