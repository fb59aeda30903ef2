"""Calendar periods (django_redislua.limiting.calendar.period_of, of ``once_per`` and the
``calendar`` algorithm): no Redis, no clock.

Days, weeks and months in a timezone across DST changes both ways (Europe/Paris, America/
New_York), month ends and leap years, ISO weeks across a year's end; and a sweep of a whole
year, every 37 minutes (every hour is met), checked against what a period is: it holds the
instant, it ends where the next begins, and its label changes exactly when it does.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

import pytest

from django_redislua.limiting.calendar import PERIODS, period_of

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")


def at(zone: ZoneInfo, *fields: int, fold: int = 0) -> datetime:
    return datetime(*fields, tzinfo=zone, fold=fold).astimezone(UTC)  # type: ignore[misc]


def hours(delta: timedelta) -> float:
    return delta.total_seconds() / 3600


def test_a_day_is_the_local_day_23_or_25_hours_on_a_dst_change() -> None:
    label, start, end = period_of(at(PARIS, 2026, 3, 29, 12), "day", PARIS)
    assert (label, hours(end - start)) == ("2026-03-29", 23)
    assert start == datetime(2026, 3, 28, 23, tzinfo=UTC)
    label, start, end = period_of(at(PARIS, 2026, 10, 25, 12), "day", PARIS)
    assert (label, hours(end - start)) == ("2026-10-25", 25)
    label, start, end = period_of(at(NEW_YORK, 2026, 3, 8, 23, 59), "day", NEW_YORK)
    assert (label, hours(end - start)) == ("2026-03-08", 23)
    label, start, end = period_of(at(NEW_YORK, 2026, 11, 1, 0, 30), "day", NEW_YORK)
    assert (label, hours(end - start), start) == (
        "2026-11-01", 25, datetime(2026, 11, 1, 4, tzinfo=UTC))


def test_the_hour_a_dst_change_repeats_is_two_hours() -> None:
    first = period_of(at(NEW_YORK, 2026, 11, 1, 1, 30, fold=0), "hour", NEW_YORK)
    second = period_of(at(NEW_YORK, 2026, 11, 1, 1, 30, fold=1), "hour", NEW_YORK)
    assert first[0] == "2026-11-01T01-0400" and second[0] == "2026-11-01T01-0500"
    assert first[2] == second[1]  # one ends where the other begins
    # Spring forward: 01:xx is followed by 03:xx, an hour later.
    label, _start, end = period_of(at(PARIS, 2026, 3, 29, 1, 59), "hour", PARIS)
    assert label == "2026-03-29T01+0100"
    assert period_of(end, "hour", PARIS)[0] == "2026-03-29T03+0200"


def test_months_end_on_the_first_of_the_next_leap_years_included() -> None:
    label, start, end = period_of(at(PARIS, 2026, 1, 31, 23, 59), "month", PARIS)
    assert (label, end) == ("2026-01", at(PARIS, 2026, 2, 1))
    label, start, end = period_of(at(PARIS, 2028, 2, 29, 12), "month", PARIS)
    assert (label, (end - start).days) == ("2028-02", 29)
    label, start, end = period_of(at(NEW_YORK, 2026, 12, 31, 23, 59), "month", NEW_YORK)
    assert (label, end) == ("2026-12", at(NEW_YORK, 2027, 1, 1))
    # The same instant is still January in New York, already February in Paris.
    moment = datetime(2026, 2, 1, 3, tzinfo=UTC)
    assert period_of(moment, "month", NEW_YORK)[0] == "2026-01"
    assert period_of(moment, "month", PARIS)[0] == "2026-02"


def test_iso_weeks_begin_on_monday_and_cross_the_years_end() -> None:
    label, start, end = period_of(at(PARIS, 2026, 11, 29, 23), "week", PARIS)  # a Sunday
    assert (label, start, end) == ("2026-W48", at(PARIS, 2026, 11, 23), at(PARIS, 2026, 11, 30))
    assert period_of(at(PARIS, 2027, 1, 1, 12), "week", PARIS)[0] == "2026-W53"
    assert period_of(at(PARIS, 2027, 1, 4), "week", PARIS)[0] == "2027-W01"


# Whole-hour DST both ways, a :30 offset, none; and the two whose DST moves the clock by 30
# minutes (Lord Howe) or changes at :45 (Chatham): an hour cut in two by the change.
ZONES = [PARIS, NEW_YORK, ZoneInfo("Asia/Kolkata"), UTC, ZoneInfo("Australia/Lord_Howe"),
         ZoneInfo("Pacific/Chatham")]


@pytest.mark.parametrize("zone", ZONES, ids=str)
@pytest.mark.parametrize("period", PERIODS)
def test_a_year_of_instants_each_in_one_period_that_ends_where_the_next_begins(
        period: str, zone: ZoneInfo) -> None:
    moment = datetime(2025, 12, 31, tzinfo=UTC)
    previous: tuple[str, datetime, datetime] | None = None
    labels: set[str] = set()
    while moment < datetime(2027, 1, 2, tzinfo=UTC):
        label, start, end = period_of(moment, period, zone)
        assert start <= moment < end
        if previous is not None and previous[0] != label:
            # The periods between (a short one the step jumped over) chain end to start.
            between = previous
            while between[2] < start:
                following = period_of(between[2], period, zone)
                assert following[1] == between[2], (between, following)
                assert following[0] not in labels, f"{following[0]} came back"
                labels.add(following[0])
                between = following
            assert between[2] == start, (previous, label, start)
            assert label not in labels, f"{label} came back"
        elif previous is not None:
            assert previous[1:] == (start, end)
        labels.add(label)
        previous = (label, start, end)
        moment += timedelta(minutes=37)
    expected = {"hour": 8760, "day": 365, "week": 52, "month": 12}[period]
    assert len(labels) >= expected


def test_lord_howes_half_hour_dst_cuts_its_hour_in_two() -> None:
    lord_howe = ZoneInfo("Australia/Lord_Howe")
    # 2026-10-04 02:00 standard time (+10:30) is 02:30 summer time (+11:00).
    before = period_of(at(lord_howe, 2026, 10, 4, 1, 45), "hour", lord_howe)
    after = period_of(at(lord_howe, 2026, 10, 4, 2, 40), "hour", lord_howe)
    assert before[0] == "2026-10-04T01+1030" and after[0] == "2026-10-04T02+1100"
    assert before[2] == after[1] == datetime(2026, 10, 3, 15, 30, tzinfo=UTC)
    assert after[2] - after[1] == timedelta(minutes=30)  # 02:30 to 03:00 on the clock


def test_a_timezone_that_is_not_a_zoneinfo_is_refused() -> None:
    from django_redislua.jobs.periods import once_per

    class Pytz(tzinfo):  # what pytz gives: a tzinfo of its own, wrong until localize()
        def utcoffset(self, dt: datetime | None) -> timedelta:
            return timedelta(minutes=9)

    with pytest.raises(TypeError, match=r"a zone name, a ZoneInfo or a datetime\.timezone"):
        once_per("day", tz=Pytz())


def test_the_default_timezone_is_the_projects_as_a_quotas() -> None:
    from django.test import override_settings

    from django_redislua.jobs.periods import _zone
    from django_redislua.limiting.definition import default_zone

    with override_settings(TIME_ZONE="Asia/Tokyo"):
        assert _zone(None) == ZoneInfo("Asia/Tokyo") == default_zone()
    assert _zone("Europe/Paris") == PARIS


def test_a_naive_moment_or_an_unknown_period_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        period_of(datetime(2026, 1, 1), "day", PARIS)
    with pytest.raises(ValueError, match="hour, day, week, month"):
        period_of(datetime(2026, 1, 1, tzinfo=UTC), "fortnight", PARIS)
