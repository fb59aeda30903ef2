"""Rates (``"5/m"``, ``"100/10s"``, ``"1000/day"``, ``"10000/month"``) and durations (``30``,
``"500ms"``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

UNIT_SECONDS = {
    "ms": 0.001,
    "s": 1, "sec": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}
# The calendar period a rate's unit names, when it names one (no multiplier: "1000/day", not
# "1000/2d"): what the ``calendar`` algorithm counts in (limiting/calendar.py). A month has no
# fixed length: it is a rate unit for calendar policies only, its period_us the longest (31 d).
CALENDAR_UNITS = {
    "h": "hour", "hour": "hour", "hours": "hour",
    "d": "day", "day": "day", "days": "day",
    "w": "week", "week": "week", "weeks": "week",
    "mo": "month", "month": "month", "months": "month",
}
MONTH_US = 31 * 86400 * 1_000_000
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([a-z]+)\s*$", re.IGNORECASE)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
# Rates are given per unit; DRF's throttle strings only read the unit's first letter, so
# "5/minute" and "5/m" mean the same. "ms" is a duration unit, not a rate unit.
RATE_UNITS = {k: v for k, v in UNIT_SECONDS.items() if k != "ms"}
RATE_UNITS.update({"mo": 31 * 86400, "month": 31 * 86400, "months": 31 * 86400})


class RateError(ValueError):
    pass


@dataclass(frozen=True)
class Rate:
    """``count`` requests per ``period_us`` microseconds; ``calendar``: the calendar period
    its unit names ("hour", "day", "week", "month"), or None ("100/10s", "5/m")."""

    count: int
    period_us: int
    calendar: str | None = None

    @property
    def period(self) -> float:
        return self.period_us / 1_000_000

    def __str__(self) -> str:
        if self.calendar == "month":
            return f"{self.count}/month"
        return f"{self.count}/{format_duration(self.period)}"


def parse_rate(value: str) -> Rate:
    """Parse ``"N/unit"`` or ``"N/Munit"`` (unit: s, m, h, d, w, month or sec/min/hour/day/
    week...)."""
    if not isinstance(value, str):
        raise RateError(f"a rate must be a string like '10/m', not {value!r}")
    match = _RATE.match(value)
    if not match:
        raise RateError(
            f"{value!r} is not a rate: write 'N/unit' or 'N/Munit', e.g. '5/m', '100/10s'"
        )
    count_text, multiplier_text, unit = match.groups()
    unit = unit.lower()
    if unit not in RATE_UNITS:
        raise RateError(f"{value!r}: unknown time unit {unit!r} (use s, m, h, d, w or month)")
    multiplier = float(multiplier_text) if multiplier_text else 1.0
    count = int(count_text)
    period_us = round(multiplier * RATE_UNITS[unit] * 1_000_000)
    # A count of 0 is valid: it denies every request, as in django-ratelimit and DRF.
    if period_us <= 0:
        raise RateError(f"{value!r}: the period must be longer than zero")
    calendar = CALENDAR_UNITS.get(unit) if multiplier_text in ("", "1") else None
    if calendar is None and unit in ("mo", "month", "months"):
        raise RateError(f"{value!r}: months differ in length; write N/month for a calendar month")
    return Rate(count, period_us, calendar)


def parse_duration(value: object) -> float:
    """Seconds from a number or a string: ``"500ms"``, ``"30s"``, ``"10m"``, ``"1h"``, ``"1d"``."""
    if isinstance(value, bool):
        raise RateError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise RateError(
                f"{value!r} is not a duration: write seconds or e.g. '500ms', '10m', '1h'"
            )
        number, unit = match.groups()
        unit = unit.lower() or "s"
        if unit not in UNIT_SECONDS:
            raise RateError(f"{value!r}: unknown time unit {unit!r} (use ms, s, m, h, d or w)")
        seconds = float(number) * UNIT_SECONDS[unit]
    else:
        raise RateError(f"{value!r} is not a duration")
    if seconds <= 0:
        raise RateError(f"{value!r}: a duration must be longer than zero")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}" if seconds != size else unit
    return f"{round(seconds * 1000)}ms"
