"""Calendar periods: an hour, day, week or month of a timezone, DST and month lengths right.

No I/O, no Django: :func:`period_of` is the arithmetic ``once_per`` and the ``calendar``
algorithm share; :func:`bounds` is what a calendar policy's script call sends, the boundaries
of the periods around this process's clock, among which the script picks the one holding the
Redis server's ``TIME`` (so hosts whose clocks disagree by less than a period still decide on
the server's clock, at a period's boundary too).
"""

from __future__ import annotations

import time as _time
from datetime import UTC, date, datetime, time, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django_redislua.limiting import clock

__all__ = ["PERIODS", "bounds", "bounds_of", "now_us", "period_of", "period_seconds", "zone_of"]

PERIODS = ("hour", "day", "week", "month")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


def _midnight(day: date, zone: tzinfo) -> datetime:
    """The first instant of ``day`` in ``zone``, in UTC."""
    return datetime.combine(day, time(0), tzinfo=zone).astimezone(UTC)


def period_of(moment: datetime, period: str, zone: tzinfo) -> tuple[str, datetime, datetime]:
    """The ``period`` ("hour", "day", "week": ISO, from Monday; "month") of ``zone`` holding
    the aware ``moment``: its label, its first instant and its end (both UTC).

    Labels are the period in local time: ``2026-11-28T14+0100`` (the UTC offset tells apart
    the two hours a DST change repeats), ``2026-11-28``, ``2026-W48``, ``2026-11``. A day is
    the local day, 23 or 25 hours long on a DST change; an hour a change of offset falls
    inside is cut there, in two periods.
    """
    if moment.tzinfo is None:
        raise ValueError("period_of needs an aware datetime")
    local = moment.astimezone(zone)
    if period == "hour":
        return _hour(moment.astimezone(UTC), local, zone)
    today = local.date()
    if period == "day":
        return today.isoformat(), _midnight(today, zone), _midnight(
            today + timedelta(days=1), zone)
    if period == "week":
        monday = today - timedelta(days=today.weekday())
        year, week, _ = monday.isocalendar()
        return f"{year}-W{week:02d}", _midnight(monday, zone), _midnight(
            monday + timedelta(days=7), zone)
    if period == "month":
        first = today.replace(day=1)
        following = (first + timedelta(days=32)).replace(day=1)
        return f"{first:%Y-%m}", _midnight(first, zone), _midnight(following, zone)
    raise ValueError(f"period must be one of {', '.join(PERIODS)}, not {period!r}")


def _hour(moment: datetime, local: datetime, zone: tzinfo) -> tuple[str, datetime, datetime]:
    """The local clock hour holding ``moment`` (UTC). Where a change of UTC offset falls inside
    a clock hour (Lord Howe's 30-minute DST, Chatham's :45 change), the hour is cut there: the
    part before and the part after are periods of their own, labelled by their own offset."""
    start = moment - timedelta(minutes=local.minute, seconds=local.second,
                               microseconds=local.microsecond)
    start = _offset_change(start, moment, zone) or start
    opened = start.astimezone(zone)
    end = start + timedelta(minutes=60 - opened.minute) - timedelta(
        seconds=opened.second, microseconds=opened.microsecond)
    end = _offset_change(start, end - timedelta(microseconds=1), zone) or end
    return opened.strftime("%Y-%m-%dT%H%z"), start, end


def _offset_change(after: datetime, until: datetime, zone: tzinfo) -> datetime | None:
    """The last instant in (after, until] where ``zone``'s UTC offset changes, or None. Zones
    change at whole seconds and at most once an hour: a binary search over the seconds."""
    offset = until.astimezone(zone).utcoffset()
    if after.astimezone(zone).utcoffset() == offset:
        return None
    low, high = after, until  # the offset at low differs from the one at high
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).utcoffset() == offset:
            high = middle
        else:
            low = middle
    change = high.replace(microsecond=0)
    return change if change.astimezone(zone).utcoffset() == offset else change + timedelta(
        seconds=1)


def zone_of(tz: object) -> tzinfo:
    """A zone name, a ZoneInfo or a ``datetime.timezone`` as a tzinfo; ValueError otherwise
    (pytz's zones carry their oldest offset until ``localize()``: midnights would be wrong)."""
    if isinstance(tz, str):
        try:
            return ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"{tz[:60]!r} is not a timezone name (such as 'Europe/Paris'): "
                             f"{type(exc).__name__}") from None
    if isinstance(tz, ZoneInfo | timezone):
        return tz
    raise ValueError(f"a timezone is a name such as 'Europe/Paris', a ZoneInfo or a "
                     f"datetime.timezone, not {type(tz).__name__}")


def _us(moment: datetime) -> int:
    return (moment - _EPOCH) // _US


def bounds_of(period: str, zone: tzinfo, now_us: int) -> tuple[int, int, str]:
    """The start and end (us) of the period holding ``now_us``, and :func:`bounds`."""
    moment = _EPOCH + timedelta(microseconds=now_us)
    _label, start, end = period_of(moment, period, zone)
    before = period_of(start - _US, period, zone)[1]
    after = period_of(end, period, zone)[2]
    # Whole seconds: a zone's offsets are, so every boundary is.
    text = ",".join(str(_us(moment) // 1_000_000) for moment in (start, end, before, after))
    return _us(start), _us(end), text


def bounds(period: str, zone: tzinfo, now_us: int) -> str:
    """What a calendar decision sends the script (lib/calendar.lua's ``extra``): the
    boundaries, in whole seconds since the epoch, of the period holding ``now_us`` and of the
    one before and after it, ``"B1,B2,B0,B3"`` (B1 <= now_us < B2 start and end the period
    holding ``now_us``, B0 starts the one before, B3 ends the one after). The script decides in
    the one holding the server's clock. Not cached: a policy keeps what its decisions send
    (``PolicyDefinition.calendar_bounds``)."""
    return bounds_of(period, zone, now_us)[2]


def period_seconds(bounds_text: str) -> int:
    """The length in seconds of the period :func:`bounds` holds (a month of 28 to 31 days, a
    day of 23 to 25 hours)."""
    start, end, _before, _after = bounds_text.split(",")
    return int(end) - int(start)


def now_us() -> int:
    """This process's estimate of the decisions' clock: its own, as far ahead as the pytest
    plugin moved the decisions' clock (:mod:`clock`)."""
    return _time.time_ns() // 1000 + clock.shift_us
