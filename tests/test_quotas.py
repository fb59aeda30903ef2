"""API quotas as a team selling an API deploys them (docs/quotas.md): plans in settings, a
burst limit plus a monthly calendar quota on a JSON API (a view and DRF), the headers and
problem body a paying customer reads, and the usage endpoint, on real Redis.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.checks import Error
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislua.checks import check_settings
from django_redislua.decorators import ratelimit
from django_redislua.drf import PolicyThrottle
from django_redislua.limiting import clock, get_policy
from django_redislua.limiting.inspect import scan_keys
from django_redislua.usage import ausage, usage
from tests.settings import REDISLUA

pytestmark = pytest.mark.urls("tests.test_quotas")
HERE = "tests.test_quotas"
PARIS = ZoneInfo("Europe/Paris")


def customer_plan(request: HttpRequest) -> str | None:
    """The plan of the API key the request carries (a billing lookup in a real project)."""
    plan = request.headers.get("X-Plan")
    if plan == "boom":
        raise LookupError("billing is down")
    return plan


def customer_zone(request: HttpRequest) -> str | None:
    return request.headers.get("X-Timezone")


POLICIES = {
    "api-burst": {"rate": "5/m", "algorithm": "sliding_log", "key": "header:x-api-key"},
    "api-monthly": {"rate": "3/month", "algorithm": "calendar", "key": "header:x-api-key",
                    "timezone": "Europe/Paris"},
    "api-daily": {"rate": "100/day", "algorithm": "calendar", "key": "header:x-api-key",
                  "timezone": f"{HERE}.customer_zone"},
}
PLANS = {
    "free": {"api-monthly": "3/month"},
    "pro": {"api-burst": "50/m", "api-monthly": "6/month"},
    "internal": {"api-monthly": None, "api-burst": None},
}
QUOTAS = {**REDISLUA, "POLICIES": {**REDISLUA["POLICIES"], **POLICIES}, "PLANS": PLANS,
          "PLAN": f"{HERE}.customer_plan", "DENIED_BODY": "problem"}


@ratelimit("api-burst")
@ratelimit("api-monthly")
def items(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"items": []})


class Items(APIView):
    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    throttle_classes = [PolicyThrottle]
    throttle_policy = ["api-burst", "api-monthly"]

    def get(self, request: Request) -> Response:
        return Response({"items": []})


def usage_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"usage": [u.as_dict() for u in usage(request)]})


async def ausage_view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"usage": [u.as_dict() for u in await ausage(request)]})


urlpatterns = [
    path("api/items/", items),
    path("drf/items/", Items.as_view()),
    path("api/usage/", usage_view),
    path("api/ausage/", ausage_view),
]


@pytest.fixture(autouse=True)
def quotas() -> Iterator[None]:
    with override_settings(REDISLUA=QUOTAS):
        yield


def get(client: Client, url: str, key: str = "k1", plan: str | None = None,
        zone: str | None = None) -> Any:
    headers = {"X-Api-Key": key}
    if plan is not None:
        headers["X-Plan"] = plan
    if zone is not None:
        headers["X-Timezone"] = zone
    return client.get(url, headers=headers)


@pytest.mark.parametrize("url", ["/api/items/", "/drf/items/"])
def test_each_plan_gets_its_monthly_quota_and_a_plan_that_names_none_its_own(
        client: Client, url: str) -> None:
    assert [get(client, url, "free-key", "free").status_code for _ in range(4)] == [
        200, 200, 200, 429]
    assert [get(client, url, "pro-key", "pro").status_code for _ in range(7)] == [
        200] * 6 + [429]
    # No plan (None) and a plan that does not name the policy: its own rate, 3 a month.
    assert [get(client, url, "anon").status_code for _ in range(4)] == [200, 200, 200, 429]
    # A plan that makes it unlimited.
    assert all(get(client, url, "ops", "internal").status_code == 200 for _ in range(10))


def test_a_denied_quota_says_when_it_resets_in_its_headers_and_problem_body(
        client: Client) -> None:
    for _ in range(3):
        allowed = get(client, "/api/items/", "k", "free")
    now = datetime.now(PARIS)
    first = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=PARIS)
    to_reset = (first - now).total_seconds()
    month_days = (first - datetime(now.year, now.month, 1, tzinfo=PARIS)).total_seconds()
    policy = allowed["RateLimit-Policy"]
    # As docs/quotas.md shows it: the decorators' order, the month's length as its window.
    assert policy == f'"api-burst";q=5;w=60, "api-monthly";q=3;w={round(month_days)}'
    assert allowed["RateLimit"].startswith('"api-burst";r=2;t=60, "api-monthly";r=0;t=')
    t = int(allowed["RateLimit"].split('"api-monthly";r=0;t=')[1].split(",")[0])
    assert abs(t - to_reset) <= 2  # the seconds to the 1st, midnight in Paris
    denied = get(client, "/api/items/", "k", "free")
    assert denied.status_code == 429 and abs(int(denied["Retry-After"]) - to_reset) <= 2
    body = json.loads(denied.content)
    assert body["violated-policies"] == ["api-monthly"]
    assert body["quota-resets"] == {"api-monthly": first.isoformat()}
    assert f"the api-monthly quota resets at {first.isoformat()}" in body["detail"]


def test_the_burst_and_the_quota_are_all_or_nothing(client: Client) -> None:
    """A request the burst refuses spends nothing of the month, and the reverse."""
    with override_settings(REDISLUA={**QUOTAS, "POLICIES": {
            **QUOTAS["POLICIES"], "api-burst": {**POLICIES["api-burst"], "rate": "2/m"}}}):
        statuses = [get(client, "/api/items/", "k", "free").status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        month = {u.policy: u for u in usage(request_with("k", "free"))}["api-monthly"]
        assert month.used == 2  # the third spent nothing


def request_with(key: str, plan: str | None = None, zone: str | None = None) -> HttpRequest:
    from django.test import RequestFactory

    headers = {"X-Api-Key": key, **({"X-Plan": plan} if plan else {}),
               **({"X-Timezone": zone} if zone else {})}
    request = RequestFactory().get("/api/usage/", headers=headers)
    request.user = AnonymousUser()
    return request


@pytest.mark.parametrize("url", ["/api/usage/", "/api/ausage/"])
def test_the_usage_endpoint_reads_every_policy_without_consuming(
        client: Client, url: str) -> None:
    for _ in range(2):
        get(client, "/api/items/", "k", "pro", "Asia/Tokyo")
    first = json.loads(get(client, url, "k", "pro", "Asia/Tokyo").content)["usage"]
    again = json.loads(get(client, url, "k", "pro", "Asia/Tokyo").content)["usage"]
    # Reading consumes nothing (a rolling window's reset is read on this process's clock).
    for row in first + again:
        if row["period"] is None and row["reset_at"] is not None:
            row["reset_at"] = datetime.fromisoformat(row["reset_at"]).timestamp()
    assert [{**a, "reset_at": None} for a in first] == [{**b, "reset_at": None} for b in again]
    for a, b in zip(first, again, strict=True):
        assert a["reset_at"] == b["reset_at"] or abs(a["reset_at"] - b["reset_at"]) < 1
    rows = {row["policy"]: row for row in first}
    monthly, burst, daily = rows["api-monthly"], rows["api-burst"], rows["api-daily"]
    assert (monthly["limit"], monthly["used"], monthly["remaining"]) == (6, 2, 4)
    assert monthly["plan"] == "pro" and monthly["period"] == "month"
    assert monthly["timezone"] == "Europe/Paris" and monthly["reset_at"].endswith(
        ("+01:00", "+02:00"))
    assert datetime.fromisoformat(monthly["reset_at"]).astimezone(PARIS).day == 1
    assert (burst["limit"], burst["used"], burst["plan"]) == (50, 2, "pro")
    # Not on the view: unused, in the customer's own timezone, reset at its midnight.
    assert (daily["used"], daily["timezone"], daily["reset_at"]) == (0, "Asia/Tokyo", None)


def test_a_timezone_callable_puts_each_customer_in_their_own_day(client: Client) -> None:
    """One daily allowance, each customer's day ending at their own midnight."""
    daily = {**POLICIES["api-daily"], "rate": "1/day"}
    resets = {}
    with override_settings(REDISLUA={**QUOTAS, "POLICIES": {**QUOTAS["POLICIES"],
                                                            "api-daily": daily}}):
        for zone in ("Asia/Tokyo", "America/Los_Angeles"):
            request = request_with(f"k-{zone}", zone=zone)
            assert [u.policy for u in usage(request, ["api-daily"])] == ["api-daily"]
            policy = get_policy("api-daily").zoned_for(request)
            assert policy.hit(f"k-{zone}").allowed and not policy.hit(f"k-{zone}").allowed
            row = usage(request_with(f"k-{zone}", zone=zone), ["api-daily"])[0]
            assert (row.used, row.timezone) == (1, zone)
            assert row.reset_at is not None
            local_reset = row.reset_at.astimezone(ZoneInfo(zone))
            assert (local_reset.hour, local_reset.minute, local_reset.second) == (0, 0, 0)
            resets[zone] = row.reset_at
    assert resets["Asia/Tokyo"] != resets["America/Los_Angeles"]  # two midnights


def test_a_plan_callables_mistakes_decide_at_the_policies_own_rates(
        client: Client, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, "django_redislua"):
        statuses = [get(client, "/api/items/", "k", "boom").status_code for _ in range(4)]
        assert statuses == [200, 200, 200, 429]  # the own 3/month: never unlimited
        assert [get(client, "/api/items/", "k2", "gold").status_code for _ in range(4)] == [
            200, 200, 200, 429]
    logged = [r.getMessage() for r in caplog.records]
    assert any("REDISLUA['PLAN'] raised LookupError: billing is down" in m for m in logged)
    assert any("returned 'gold', which is no plan" in m and "redislua.E034" in m
               for m in logged)


def test_a_timezone_callables_mistake_decides_in_the_projects_time_zone(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, "django_redislua"):
        rows = {u.policy: u for u in usage(request_with("k", zone="Mars/Olympus"))}
    assert rows["api-daily"].timezone == settings.TIME_ZONE == "America/Chicago"
    assert any("timezone callable" in r.getMessage() and "'Mars/Olympus'" in r.getMessage()
               for r in caplog.records)


def test_the_admin_shows_each_identitys_plan_and_quota_use(client: Client) -> None:
    for _ in range(2):
        get(client, "/api/items/", "acme", "pro")
    get(client, "/api/items/", "zed", "free")
    states = {(s.policy_name, s.identity): s for s in scan_keys(policy="api-monthly").keys}
    acme, zed = states[("api-monthly", "acme")], states[("api-monthly", "zed")]
    assert (acme.kept_rate, acme.limit, acme.remaining) == ("6/month (pro)", 6, 4)
    assert (zed.kept_rate, zed.limit, zed.remaining) == ("3/month (free)", 3, 2)
    assert 0 < acme.reset_after <= 31 * 86400
    # Its state read as fields, the period's start an instant the admin shows as one.
    fields = dict(acme.fields)
    assert fields["count"] == "2"
    start = datetime.fromtimestamp(int(fields["period start"]) / 1e6, PARIS)
    assert (start.day, start.hour, start.minute) == (1, 0, 0)


def test_the_pytest_plugins_clock_starts_next_month(client: Client) -> None:
    statuses = [get(client, "/api/items/", "k", "free").status_code for _ in range(4)]
    assert statuses[-1] == 429
    try:
        clock.advance(int(get(client, "/api/items/", "k", "free")["Retry-After"]))
        assert get(client, "/api/items/", "k", "free").status_code == 200
    finally:
        clock.reset()


@pytest.mark.parametrize(("plans", "plan", "message"), [
    ({"free": {"nope": "1/month"}}, "x.y", "policy 'nope' is not in REDISLUA['POLICIES']"),
    ({"free": {"api-burst": "1/month"}}, "x.y", "months differ in length"),
    ({"free": {"api-monthly": "10/10s"}}, "x.y", "per hour, day, week or month"),
    ({"free": {"api-monthly": 10}}, "x.y", "a rate is a string"),
    ({"free plan!": {}}, "x.y", "plan name 'free plan!' must be"),
    ({"free": ["api-monthly"]}, "x.y", "plan 'free' must be a dict"),
    ({"free": {"api-monthly": "1/month"}}, None, "REDISLUA['PLANS'] is set but not"),
    ({}, f"{HERE}.customer_plan", "REDISLUA['PLAN'] is set but not"),
    ({"free": {}}, "tests.nowhere.plan_of", "cannot be imported"),
])
def test_plan_mistakes_are_e034(plans: Any, plan: Any, message: str) -> None:
    config = {**QUOTAS, "PLANS": plans, "PLAN": plan}
    with override_settings(REDISLUA=config):
        errors = [e for e in check_settings() if isinstance(e, Error)]
    assert any(e.id == "redislua.E034" and message in e.msg for e in errors), errors


@pytest.mark.parametrize(("options", "message"), [
    ({"algorithm": "calendar", "timezone": "Europe/Pariss"},
     "'Europe/Pariss' is not a timezone name"),
    ({"algorithm": "calendar", "timezone": 3}, "not int"),
    ({"algorithm": "gcra", "timezone": "Europe/Paris"}, "is for calendar policies"),
    ({"algorithm": "calendar", "timezone": "tests.nowhere.zone_of"}, "cannot be imported"),
])
def test_a_timezone_mistake_in_settings_stops_manage_py_check(options: dict[str, Any],
                                                              message: str) -> None:
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    config = {**QUOTAS, "POLICIES": {**QUOTAS["POLICIES"],
                                     "bad-quota": {"rate": "5/day", **options}}}
    with override_settings(REDISLUA=config), pytest.raises(SystemCheckError) as failure:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    assert "redislua.E033" in str(failure.value) and message in str(failure.value)
    assert "bad-quota" in str(failure.value)


def test_the_quota_settings_pass_the_checks() -> None:
    assert [e for e in check_settings() if isinstance(e, Error)] == []


def test_the_admins_policies_table_shows_the_rate_of_each_plan() -> None:
    from django_redislua.admin import _rate_shown

    assert _rate_shown(get_policy("api-monthly")) == (
        "free 3/month, pro 6/month, internal unlimited; else 3/month")
    assert _rate_shown(get_policy("api-daily")) == "100/day"


def test_a_shadow_quota_is_decided_and_counted_but_never_refuses(client: Client) -> None:
    from prometheus_client import REGISTRY

    labels = {"policy": "api-monthly", "algorithm": "calendar", "result": "shadow_denied"}
    before = REGISTRY.get_sample_value("redislua_decisions_total", labels) or 0.0
    shadow = {**POLICIES["api-monthly"], "mode": "shadow"}
    with override_settings(REDISLUA={**QUOTAS, "METRICS": ["prometheus"], "POLICIES": {
            **QUOTAS["POLICIES"], "api-monthly": shadow}}):
        statuses = [get(client, "/api/items/", "k", "free").status_code for _ in range(5)]
    assert statuses == [200] * 5  # the burst (5 a minute) allows five; the quota only counts
    after = REGISTRY.get_sample_value("redislua_decisions_total", labels)
    assert after == before + 2  # the 4th and 5th would have been refused
