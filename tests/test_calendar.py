"""Calendar quotas (``algorithm="calendar"``) on real Redis, single server and cluster.

The model test injects time across day, week, month and year boundaries and DST changes both
ways (Europe/Paris, America/New_York), month ends (Jan 31 -> Feb 28, Feb 29 of a leap year) and
per-identity timezones, and checks every Decision field against a Python model built on
``period_of`` alone (not on what the script is sent), and the state's expiry against the
period's end. Then: racing requests against a monthly quota stacked with a burst limit in the
same call, the state's size against a fixed window's, a refund, live overrides, a server clock
a period away, and the pytest plugin's clock crossing a month.
"""

from __future__ import annotations

import math
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_redislua import overrides
from django_redislua.limiting import clock, denials, engine
from django_redislua.limiting.calendar import period_of
from django_redislua.limiting.policy import Policy
from django_redislua.limiting.refund import give_back, refunds_of
from tests.allocator import exact_sizes
from tests.transactional import TransactionalClient

pytestmark = pytest.mark.topologies

US = 1_000_000
PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")
ZONES = {
    "paris": PARIS, "new_york": NEW_YORK, "tokyo": ZoneInfo("Asia/Tokyo"),
    "lord_howe": ZoneInfo("Australia/Lord_Howe"), "utc": ZoneInfo("UTC"),
}
HOUR = 3600 * US


def at(zone: ZoneInfo, *fields: int) -> int:
    return round(datetime(*fields, tzinfo=zone).timestamp() * US)  # type: ignore[misc]


# Instants a calendar quota must get right: DST changes both ways in both zones, month ends
# (a leap year's too), a year's end.
EDGES = [
    at(PARIS, 2026, 3, 29, 3), at(PARIS, 2026, 10, 25, 2), at(NEW_YORK, 2026, 3, 8, 3),
    at(NEW_YORK, 2026, 11, 1, 1), at(PARIS, 2026, 2, 1), at(NEW_YORK, 2026, 3, 1),
    at(PARIS, 2028, 3, 1), at(PARIS, 2028, 2, 29), at(NEW_YORK, 2027, 1, 1),
    at(PARIS, 2027, 1, 1), at(ZONES["tokyo"], 2026, 12, 28),  # a Monday: a week's start
]
NOMINAL = {"hour": HOUR, "day": 24 * HOUR, "week": 7 * 24 * HOUR, "month": 31 * 24 * HOUR}
MODEL_SETTINGS = hypothesis_settings(
    max_examples=int(os.environ.get("REDISLUA_PROPERTY_EXAMPLES", "40")),
    deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow],
)
# A gating companion that always allows: with it a hit goes through ratelimit.lua (several
# policies in one call) instead of the calendar's own script.
COMPANION = Policy("companion", rate="1000000/s")


def period(t: int, unit: str, zone: ZoneInfo) -> tuple[int, int]:
    _label, start, end = period_of(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
        microseconds=t), unit, zone)
    return round(start.timestamp() * US), round(end.timestamp() * US)


class Model:
    """What a calendar quota decides, from the calendar alone: per identity, the period its
    count belongs to and the count."""

    def __init__(self, limit: int, unit: str) -> None:
        self.limit, self.unit = limit, unit
        self.state: dict[str, tuple[int, int]] = {}

    def decide(self, identity: str, zone: ZoneInfo, t: int, cost: int, consume: bool
               ) -> tuple[bool, int, int, int, tuple[int, int]]:
        start, end = period(t, self.unit, zone)
        stored = self.state.get(identity)
        count = stored[1] if stored is not None and stored[0] == start else 0
        left = end - t
        allowed = count + cost <= self.limit
        if allowed and consume:
            count += cost
            self.state[identity] = (start, count)
        return (allowed, max(0, self.limit - count), left if count else 0,
                0 if allowed else left, (start, end))


def steps(unit: str) -> st.SearchStrategy[int]:
    nominal = NOMINAL[unit]
    return st.one_of(
        st.just(0), st.integers(1, 2_000), st.integers(0, 20 * 60 * US),
        st.integers(0, nominal), st.integers(nominal // 2, 2 * nominal))


class Scenario(NamedTuple):
    """A quota's limit, each identity's zone, the instant the run starts, and its hits:
    (step in us, identity, cost, peek)."""

    limit: int
    zones: dict[str, str]
    start: int
    hits: list[tuple[int, str, int, bool]]


@st.composite
def scenarios(draw: st.DrawFn, unit: str) -> Scenario:
    # Drawn whole, with strategies built once per run (a data.draw per value built and
    # validated a strategy each time).
    limit = draw(st.integers(1, 4), label="limit")
    zones = {who: draw(st.sampled_from(sorted(ZONES)), label=who) for who in ("alice", "bob")}
    start = draw(st.sampled_from(EDGES)) - draw(st.integers(0, 3 * HOUR))
    hit = st.tuples(steps(unit), st.sampled_from(["alice", "alice", "bob"]),
                    st.integers(1, limit), st.booleans())
    count = draw(st.integers(1, 25))  # as many as drawn (a list's own sizes run short)
    return Scenario(limit, zones, start, draw(st.lists(hit, min_size=count, max_size=count)))


@pytest.mark.parametrize("path", ["one", "plan"])
@pytest.mark.parametrize("unit", ["hour", "day", "week", "month"])
def test_calendar_quotas_match_the_calendar(unit: str, path: str, r: Any) -> None:
    tally = {"denied": 0, "new period": 0}

    @MODEL_SETTINGS
    @given(scenario=scenarios(unit))
    def run(scenario: Scenario) -> None:
        r.flushall()
        denials.forget()
        limit, zones = scenario.limit, scenario.zones
        policy = Policy("quota", rate=f"{limit}/{unit}", algorithm="calendar")
        zoned = {who: policy.in_zone(ZONES[name]) for who, name in zones.items()}
        model, tx = Model(limit, unit), TransactionalClient(r)
        now = scenario.start
        expires: dict[str, int] = {}
        for step, who, cost, peek in scenario.hits:
            now += step
            mine = zoned[who]
            if path == "plan" and not peek:
                decision, other = engine.evaluate(
                    [(mine, who, cost), (COMPANION, who, 1)], now_us=now, client=tx)
                assert other.allowed
            else:
                decision = engine.decide(mine, who, cost, peek=peek, now_us=now, client=tx)
            before = model.state.get(who)
            allowed, remaining, reset, retry, (start, end) = model.decide(
                who, ZONES[zones[who]], now, cost, not peek)
            got = (decision.allowed, decision.remaining, round(decision.reset_after * US),
                   round(decision.retry_after * US))
            assert got == (allowed, remaining, reset, retry), (who, zones[who], now, cost)
            tally["denied"] += not allowed
            key = policy.redis_key(who)
            if allowed and not peek and not decision.local:
                if before is None or before[0] != start:  # the write that opens the period
                    tally["new period"] += 1
                    # It expires when the period ends, to the millisecond. (PTTL is read in
                    # the same transaction, but a loaded machine can stall the server between
                    # commands: the upper bound is the exact one.)
                    ttl_ms = math.ceil((end - now) / 1000)
                    assert ttl_ms - 250 <= tx.pttls[key] <= ttl_ms
                    expires[key] = now + ttl_ms * 1000
                else:
                    assert tx.pttls[key] == -1  # added in place: the expiry set stays
                assert end <= expires[key] < end + 1000

    run()
    # Not vacuous: quotas were used up, and periods ended under them.
    assert tally["denied"] >= 10 and tally["new period"] >= 20, tally


def test_64_racing_requests_take_exactly_the_monthly_quota_and_the_burst_it_allows() -> None:
    burst = Policy("burst", rate="20/m", algorithm="sliding_log")  # exact: each hit a log entry
    monthly = Policy("monthly", rate="10/month", algorithm="calendar", timezone="Europe/Paris")
    barrier = threading.Barrier(64)
    results: list[tuple[bool, bool]] = []

    def request() -> None:
        barrier.wait()
        gate, quota = engine.evaluate([(burst, "acme", 1), (monthly, "acme", 1)])
        results.append((gate.allowed, quota.allowed))

    threads = [threading.Thread(target=request) for _ in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    admitted = [both for both in results if all(both)]
    assert len(results) == 64 and len(admitted) == 10
    # All-or-nothing: the monthly quota is spent, and the burst lost only what was admitted.
    assert engine.decide(monthly, "acme", 1, peek=True).remaining == 0
    assert engine.decide(burst, "acme", 1, peek=True).remaining == 20 - 10


def test_the_state_is_no_larger_than_a_fixed_windows(r: Any) -> None:
    """Each written alone: interleaved, a script's SET can sit in the allocation of an argument
    the other script passed in the same place (Redis's own, docs/ratelimit.md)."""
    def state_bytes(policy: Policy) -> tuple[int, bytes, bool]:
        r.flushall()
        for _ in range(999):
            assert policy.hit("customer-42").allowed
        key = policy.redis_key("customer-42")
        node = r.get_redis_connection(r.get_node_from_key(key)) if hasattr(
            r, "get_node_from_key") else r
        return node.memory_usage(key), node.get(key), exact_sizes(node)

    quota, state, exact = state_bytes(Policy("q", rate="10000/month", algorithm="calendar"))
    window, _, _ = state_bytes(Policy("w", rate="1000/h", algorithm="fixed_window"))
    if exact:
        assert quota <= window, (quota, window)
    assert len(state) == 19 and state.endswith(b"000000999")  # an integer: no allocation


def test_a_failed_calls_refund_gives_back_its_unit_of_the_period() -> None:
    quota = Policy("q", rate="3/day", algorithm="calendar", count_failures=True)
    decision = quota.hit("u")
    assert decision.consumed == 1 and quota.peek("u").remaining == 2
    assert give_back(refunds_of([decision])) == [True]
    assert quota.peek("u").remaining == 3


def test_overrides_block_allow_and_change_the_quota_in_its_own_periods() -> None:
    quota = Policy("q", rate="2/month", algorithm="calendar", timezone="America/New_York")
    with pytest.raises(ValueError, match="counts per month: give its override a rate per "
                                         "month too"):
        overrides.set_rate(quota, "u", "50/day", ttl="1h")
    assert quota.hit("u").allowed and quota.hit("u").allowed and not quota.hit("u").allowed
    overrides.set_rate(quota, "u", "5/month", ttl="1h")
    raised = quota.hit("u")
    assert raised.allowed and raised.limit == 5 and raised.remaining == 2
    overrides.block(quota, "u", ttl="1h")
    assert not quota.hit("u").allowed


def test_a_server_clock_a_period_away_is_an_error_not_a_wrong_period(
        monkeypatch: pytest.MonkeyPatch) -> None:
    quota = Policy("q", rate="5/h", algorithm="calendar")
    # This process's clock two days behind the server's: the hours it sends miss the server's.
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() - 48 * HOUR * 1000)
    with pytest.raises(redis.ResponseError, match="more than a calendar period away"):
        quota.hit("u")
    monkeypatch.undo()
    assert quota.hit("u").allowed


def test_the_plugins_clock_crosses_into_the_next_month() -> None:
    quota = Policy("q", rate="1/month", algorithm="calendar", timezone="UTC")
    assert quota.hit("u").allowed
    denied = quota.hit("u")
    assert not denied.allowed and 0 < denied.retry_after <= 31 * 86400
    try:
        clock.advance(denied.retry_after)
        assert quota.hit("u").allowed  # the 1st: reset
    finally:
        clock.reset()


def test_the_algorithm_pages_month_in_paris() -> None:
    """docs/algorithms.md's table, instant by instant."""
    quota = Policy("q", rate="3/month", algorithm="calendar", timezone="Europe/Paris")
    for hour in (9, 10, 11):
        assert engine.decide(quota, "u", 1, now_us=at(PARIS, 2026, 11, 29, hour)).allowed
    refused = engine.decide(quota, "u", 1, now_us=at(PARIS, 2026, 11, 30, 23, 59, 59))
    assert not refused.allowed and refused.retry_after == 1.0
    assert engine.decide(quota, "u", 1, now_us=at(PARIS, 2026, 12, 1)).allowed


def test_a_clock_gone_back_into_the_last_period_keeps_counting_the_new_one() -> None:
    """A failover to a replica whose clock is behind: the hour already opened goes on counting
    (never a fresh hour), and its reset is still that hour's end."""
    quota = Policy("q", rate="3/h", algorithm="calendar", timezone="UTC")
    opened = at(ZoneInfo("UTC"), 2026, 12, 1, 10, 10)  # 10:10, in the 10:00 hour
    assert engine.decide(quota, "u", 2, now_us=opened).remaining == 1
    behind = opened - 20 * 60 * US  # 09:50 on the other server: the 09:00 hour
    decision = engine.decide(quota, "u", 1, now_us=behind)
    assert decision.allowed and decision.remaining == 0  # the 10:00 hour's count goes on
    assert not engine.decide(quota, "u", 1, now_us=behind).allowed
    # Its reset is the 10:00 hour's end, read from the key's expiry (set at 10:10: 50 minutes).
    assert 50 * 60 - 5 <= decision.reset_after <= 50 * 60
    assert engine.decide(quota, "u", 1, now_us=opened + 50 * 60 * US).allowed  # 11:00
