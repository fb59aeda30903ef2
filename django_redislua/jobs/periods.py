"""``once_per``: a job that runs once per calendar hour, day, week or month in a timezone,
however many hosts (cron on each, Celery beat, a deploy hook) call it.

The period is read from the Redis server's clock (``TIME``, moved by the pytest plugin's
``redislua.advance``), so hosts whose clocks disagree still agree on which day it is. Each
period is one ``run_once`` key (``period:<job>:<label>``): the first call in the period runs
the job, every later one is told who ran it and when; a run that raised stores nothing and a
run whose process died frees the period when its lease (``timeout``) ends, so the next call
runs it. The record expires when its period ends.

:func:`period_of` (limiting/calendar.py, shared with the ``calendar`` algorithm) is pure: the
calendar arithmetic, DST included, is tested with no Redis.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timezone, tzinfo
from typing import Any, ParamSpec, TypeVar
from zoneinfo import ZoneInfo

from django_redislua.limiting import clock
from django_redislua.limiting.calendar import PERIODS, period_of
from django_redislua.limiting.definition import default_zone
from django_redislua.limiting.rates import parse_duration
from django_redislua.locks.once import RunOutcome, run_once
from django_redislua.protocol import Execute, Protocol
from django_redislua.transport import run

__all__ = ["PERIODS", "once_per", "period_of"]

P = ParamSpec("P")
R = TypeVar("R")

def _zone(tz: str | tzinfo | None) -> tzinfo:
    if tz is None:
        return default_zone()  # the project's, as a calendar quota's
    if isinstance(tz, str):
        return ZoneInfo(tz)
    if not isinstance(tz, ZoneInfo | timezone):
        # pytz's zones carry their oldest offset until localize(): midnights would be wrong.
        raise TypeError(f"tz must be a zone name, a ZoneInfo or a datetime.timezone, not "
                        f"{type(tz).__name__}")
    return tz


def _time() -> Protocol[list[Any]]:
    reply: list[Any] = yield Execute(("TIME",))
    return reply


def redis_now() -> datetime:
    """The Redis server's clock (plus the pytest plugin's ``advance``), aware, in UTC."""
    seconds, micros = run(_time())
    us = int(seconds) * 1_000_000 + int(micros) + clock.shift_us
    return datetime.fromtimestamp(us / 1_000_000, UTC)


def once_per(period: str, *, name: str | None = None, tz: str | tzinfo | None = None,
             timeout: float | str = "10m", wait: bool = False,
             wait_timeout: float | str | None = None
             ) -> Callable[[Callable[P, R]], Callable[P, RunOutcome[R]]]:
    """Run the decorated job at most once per calendar ``period`` ("hour", "day", "week",
    "month") of ``tz`` (a name or a tzinfo; default ``settings.TIME_ZONE``).

    Every call returns a :class:`~django_redislua.locks.RunOutcome`: ``status="ran"`` when
    this call ran the job (``result`` is what it returned), ``"done"`` when another call of
    this period did (``ran_by``, ``finished_at``, its ``result``), ``"running"`` when one runs
    it now (with ``wait=True`` this call waits for its outcome instead, up to
    ``wait_timeout``). A run that raises lets the next call of the period run it (the
    exception is raised to this caller); a run whose process died frees the period
    ``timeout`` after its last lease renewal. ``name`` (default: the function's dotted path)
    identifies the job across hosts: give it when two deploys could name it differently.
    """
    if period not in PERIODS:
        raise ValueError(f"period must be one of {', '.join(PERIODS)}, not {period!r}")
    zone = _zone(tz)
    parse_duration(timeout)  # a bad timeout fails at import, not at the first run

    def decorate(func: Callable[P, R]) -> Callable[P, RunOutcome[R]]:
        job = name or f"{func.__module__}.{func.__qualname__}"

        @functools.wraps(func)
        def call(*args: P.args, **kwargs: P.kwargs) -> RunOutcome[R]:
            now = redis_now()
            label, _start, end = period_of(now, period, zone)
            # Kept until the period ends: no later call computes this label again.
            keep = max((end - now).total_seconds(), 0.001)
            handler: Any = run_once(f"period:{job}:{label}", ttl=keep, timeout=timeout,
                                    wait=wait, wait_timeout=wait_timeout)(func)
            outcome: RunOutcome[R] = handler.outcome(*args, **kwargs)
            return outcome

        return call

    return decorate
