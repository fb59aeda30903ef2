"""Calendar quotas without Redis: the rates they take, the policy's checks, and what a decision
sends the script (``PolicyDefinition.calendar_bounds``) around DST changes, month ends and a
year's end.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings

from django_redislua.limiting.calendar import bounds, period_of, period_seconds
from django_redislua.limiting.definition import ZoneCallableError
from django_redislua.limiting.errors import PolicyError
from django_redislua.limiting.policy import Policy
from django_redislua.limiting.rates import RateError, parse_rate

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")
DAY = 86_400_000_000


def us(moment: datetime) -> int:
    return round(moment.timestamp() * 1_000_000)


def local(zone: ZoneInfo, *fields: int) -> int:
    return us(datetime(*fields, tzinfo=zone))  # type: ignore[misc]


@pytest.mark.parametrize(("text", "count", "calendar", "shown"), [
    ("10000/month", 10000, "month", "10000/month"),
    ("10/mo", 10, "month", "10/month"),
    ("1000/day", 1000, "day", "1000/d"),
    ("1000/1d", 1000, "day", "1000/d"),
    ("5/h", 5, "hour", "5/h"),
    ("3/week", 3, "week", "3/7d"),
    ("3/w", 3, "week", "3/7d"),
    ("100/2d", 100, None, "100/2d"),
    ("5/m", 5, None, "5/m"),
])
def test_rates_name_their_calendar_period(text: str, count: int, calendar: str | None,
                                          shown: str) -> None:
    rate = parse_rate(text)
    assert (rate.count, rate.calendar, str(rate)) == (count, calendar, shown)


def test_a_week_is_seven_days_for_the_rolling_algorithms() -> None:
    assert parse_rate("7/w").period_us == 7 * DAY


def test_months_have_no_multiple() -> None:
    with pytest.raises(RateError, match="months differ in length"):
        parse_rate("10/2month")


def test_a_rolling_algorithm_refuses_a_month() -> None:
    with pytest.raises(PolicyError, match="algorithm 'calendar'") as caught:
        Policy("monthly", rate="10/month", algorithm="fixed_window")
    assert caught.value.check_id == "redislua.E006"


@pytest.mark.parametrize("rate", ["10/10s", "10/2d", "5/m"])
def test_a_calendar_quota_counts_per_hour_day_week_or_month(rate: str) -> None:
    with pytest.raises(PolicyError, match="per hour, day, week or month") as caught:
        Policy("quota", rate=rate, algorithm="calendar")
    assert caught.value.check_id == "redislua.E006"


def test_a_calendar_quota_counts_below_a_billion() -> None:
    Policy("quota", rate="999999999/month", algorithm="calendar")
    with pytest.raises(PolicyError, match="counts up to 999,999,999"):
        Policy("quota", rate="1000000000/month", algorithm="calendar")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"algorithm": "fixed_window", "timezone": "UTC", "rate": "5/d"}, "for calendar policies"),
    ({"algorithm": "calendar", "timezone": "Mars/Olympus", "rate": "5/d"},
     "'Mars/Olympus' is not a timezone name"),
    ({"algorithm": "calendar", "timezone": 3, "rate": "5/d"}, "not int"),
    ({"algorithm": "calendar", "timezone": "myapp.nowhere.zone_of", "rate": "5/d"},
     "cannot be imported"),
])
def test_a_bad_timezone_is_e033(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError, match=message) as caught:
        Policy("quota", **kwargs)  # type: ignore[arg-type]
    assert caught.value.check_id == "redislua.E033"


@override_settings(TIME_ZONE="America/New_York")
def test_the_default_timezone_is_the_projects() -> None:
    assert Policy("quota", rate="5/d", algorithm="calendar").calendar_zone() == NEW_YORK
    assert Policy("quota", rate="5/d", algorithm="calendar",
                  timezone="Europe/Paris").calendar_zone() == PARIS


def test_a_timezone_callable_is_resolved_per_request_and_its_mistakes_fall_back() -> None:
    zones = {"alice": "Asia/Tokyo", "bob": "no/such_zone"}

    def zone_of_user(request: str) -> str | None:
        if request == "carol":
            raise LookupError("no profile")
        return zones.get(request)

    policy = Policy("quota", rate="5/d", algorithm="calendar", timezone=zone_of_user)
    with pytest.raises(PolicyError, match=r"resolve it with policy\.in_zone"):
        policy.calendar_zone()
    assert policy.zoned_for("alice").calendar_zone() == ZoneInfo("Asia/Tokyo")
    assert policy.zoned_for("alice") is policy.zoned_for("alice")  # derived once
    assert policy.zoned_for("dave").zone is None  # None: the project's TIME_ZONE
    for who, what in (("bob", "returned 'no/such_zone'"), ("carol", "raised LookupError")):
        with pytest.raises(ZoneCallableError, match=what) as caught:
            policy.zoned_for(who)
        assert caught.value.fallback.zone is None and caught.value.check_id == "redislua.E033"
        assert caught.value.fallback._zone_callable is None
    zoned = policy.zoned_for("alice")
    assert zoned.redis_key("alice") == policy.redis_key("alice")  # same keys


def test_bounds_are_the_periods_around_now() -> None:
    now = local(PARIS, 2026, 11, 28, 14, 30)
    b1, b2, b0, b3 = (int(b) * 1_000_000 for b in bounds("month", PARIS, now).split(","))
    assert (b0, b1, b2, b3) == (local(PARIS, 2026, 10, 1), local(PARIS, 2026, 11, 1),
                                local(PARIS, 2026, 12, 1), local(PARIS, 2027, 1, 1))
    # October has 31 days and a DST change: 31 days and an hour, in microseconds.
    assert b1 - b0 == 31 * DAY + 3_600_000_000
    assert period_seconds(bounds("month", PARIS, now)) * 1_000_000 == 30 * DAY


@pytest.mark.parametrize(("zone", "day", "hours"), [
    (PARIS, (2026, 3, 29), 23), (PARIS, (2026, 10, 25), 25),
    (NEW_YORK, (2026, 3, 8), 23), (NEW_YORK, (2026, 11, 1), 25),
])
def test_a_day_on_a_dst_change_is_23_or_25_hours(zone: ZoneInfo, day: tuple[int, int, int],
                                                 hours: int) -> None:
    noon = local(zone, *day, 12)
    assert period_seconds(bounds("day", zone, noon)) * 1_000_000 == hours * 3_600_000_000
    b1, b2, _b0, _b3 = (int(b) * 1_000_000 for b in bounds("day", zone, noon).split(","))
    assert (b1, b2) == (local(zone, *day), local(zone, *day) + hours * 3_600_000_000)


def test_bounds_at_each_instant_of_a_boundary_are_the_periods_holding_it() -> None:
    """Every microsecond around a month's end and a year's end, in both zones: B1 <= now < B2,
    and B2 is where the next period starts (what the policy keeps never answers for a period it
    left)."""
    for zone in (PARIS, NEW_YORK):
        policy = Policy("quota", rate="5/month", algorithm="calendar", timezone=zone)
        for fields in ((2026, 2, 1), (2026, 3, 1), (2027, 1, 1), (2028, 3, 1)):
            edge = local(zone, *fields)
            for now in (edge - 1, edge, edge + 1, edge - 1, edge):
                text = policy.calendar_bounds(now)
                assert len(text) == 43  # ten digits each: read at fixed places
                b1, b2, b0, b3 = (int(b) * 1_000_000 for b in text.split(","))
                moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=now)
                _label, start, end = period_of(moment, "month", zone)
                assert (b1, b2) == (us(start), us(end)), (zone, fields, now)
                assert b0 < b1 <= now < b2 < b3


def test_a_policy_at_another_rate_or_zone_sends_its_own_periods() -> None:
    """What a policy keeps is never what a copy at another rate (a rate callable's, a plan's)
    or in another zone (a timezone callable's) sends: each counts its own periods."""
    now = local(PARIS, 2026, 11, 28, 14, 30)
    daily = Policy("quota", rate="100/day", algorithm="calendar", timezone=PARIS)
    assert daily.calendar_bounds(now) == bounds("day", PARIS, now)
    assert daily.with_rate("5/month").calendar_bounds(now) == bounds("month", PARIS, now)
    assert daily.on_plan("pro", "1/h").calendar_bounds(now) == bounds("hour", PARIS, now)
    assert daily.in_zone(NEW_YORK).calendar_bounds(now) == bounds("day", NEW_YORK, now)
    assert daily.calendar_bounds(now) == bounds("day", PARIS, now)


def test_periods_kept_in_the_projects_timezone_follow_it() -> None:
    now = local(PARIS, 2026, 11, 28, 3)  # Nov 27 in New York
    with override_settings(TIME_ZONE="Europe/Paris"):
        daily = Policy("quota", rate="100/day", algorithm="calendar")
        assert daily.calendar_bounds(now) == bounds("day", PARIS, now)
        with override_settings(TIME_ZONE="America/New_York"):
            assert daily.calendar_bounds(now) == bounds("day", NEW_YORK, now)
        assert daily.calendar_bounds(now) == bounds("day", PARIS, now)
