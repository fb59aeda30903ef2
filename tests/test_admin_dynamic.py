"""Per-plan rates in the admin (issue 35): a policy whose rate is a callable is decided at the
rate the callable gives each request, which the admin cannot know; the decision scripts keep
that rate beside the identity's state, and the keys tab peeks with it.

Before: every such key read "not in use", remaining "-", full again "-". Requests go through
real views with the test client, the admin page is read as logged-in staff, and what it shows
is held against what the decision said (the IETF ``RateLimit`` header). On one server and on
the 6-node cluster.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.management import call_command
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from django_redislua import get_policy, overrides
from django_redislua.decorators import ratelimit
from django_redislua.limiting import evaluate
from django_redislua.limiting.inspect import parse_key
from django_redislua.scripts import get_script
from django_redislua.testing import CommandRecorder
from tests.settings import REDISLUA

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.test_admin_dynamic"),
              pytest.mark.topologies]
HERE = "tests.test_admin_dynamic"
KEYS_URL = "/admin/django_redislua/redislua/"
PLANS = {"pro": "100/d", "free": "10/d"}  # slow: no bucket refills one unit in a test
LIMITS = {"pro": 100, "free": 10}
ALGORITHMS = ["fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket",
              "gcra"]


def plan_rate(request: HttpRequest) -> str | None:
    """The rate of the request's plan (a header here; an attribute of the user in an app)."""
    plan = request.headers.get("X-Plan", "free")
    return None if plan == "staff" else PLANS[plan]


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [
    path("admin/", admin.site.urls),
    path("planned/", ratelimit("plan")(ok)),
    path("stacked/", ratelimit("plan")(ratelimit("flat")(ok))),
    path("inline/", ratelimit(rate=plan_rate, key="header:x-user", group="inline-plan",
                              algorithm="gcra")(ok)),
]


def policies(algorithm: str = "gcra") -> dict[str, Any]:
    return {
        **REDISLUA["POLICIES"],
        "plan": {"algorithm": algorithm, "rate": f"{HERE}.plan_rate", "key": "header:x-user"},
        "flat": {"algorithm": "fixed_window", "rate": "50/h", "key": "header:x-user"},
    }


@pytest.fixture
def configured() -> Callable[..., override_settings]:
    def configure(algorithm: str = "gcra", **options: Any) -> override_settings:
        return override_settings(
            REDISLUA={**REDISLUA, "POLICIES": policies(algorithm), **options})
    return configure


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("staff", password="pw"))
    return client


def requests(url: str, user: str, plan: str, n: int) -> list[dict[str, tuple[int, int, int]]]:
    """``n`` requests of ``user`` at ``plan``: each one's RateLimit and RateLimit-Policy, as
    {policy: (q, r, t)}."""
    client = Client()
    seen = []
    for _ in range(n):
        response = client.get(url, headers={"X-User": user, "X-Plan": plan})
        assert response.status_code == 200
        seen.append(headers(response))
    return seen


def headers(response: HttpResponse) -> dict[str, tuple[int, int, int]]:
    quota = dict(re.findall(r'"([^"]+)";q=(\d+)', response.get("RateLimit-Policy", "")))
    found = {}
    for name, r, t in re.findall(r'"([^"]+)";r=(\d+);t=(\d+)', response.get("RateLimit", "")):
        found[name] = (int(quota[name]), int(r), int(t))
    return found


def rows(client: Client, **query: str) -> dict[tuple[str, str], Any]:
    response = client.get(KEYS_URL, query)
    assert response.status_code == 200
    return {(row["state"].policy_name, row["state"].identity): row
            for row in response.context["rows"]}


# -- the keys tab ----------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_identity_shows_the_limit_remaining_and_reset_it_was_decided_with(
    configured: Any, staff: Client, algorithm: str
) -> None:
    with configured(algorithm):
        alice = requests("/planned/", "alice", "pro", 3)[-1]["plan"]
        bob = requests("/planned/", "bob", "free", 2)[-1]["plan"]
        assert alice[:2] == (100, 97) and bob[:2] == (10, 8)
        found = rows(staff)
        page = staff.get(KEYS_URL).content.decode()
    assert set(found) == {("plan", "alice"), ("plan", "bob")}  # no kept rate listed as a key
    for user, (limit, remaining, reset), rate in (("alice", alice, "100/d"),
                                                 ("bob", bob, "10/d")):
        row = found["plan", user]
        state = row["state"]
        assert (state.limit, state.remaining) == (limit, remaining), user
        assert state.kept_rate == rate and state.per_request
        # The header's t is the reset rounded up to whole seconds, when it was decided.
        assert state.reset_after is not None and reset - 30 < state.reset_after <= reset
        assert row["reset"].startswith("in ")
        assert f"at {rate}, per request" in page
    assert "not in use" not in page and "rate not kept" not in page


def test_before_the_kept_rate_every_such_key_read_not_in_use(
    configured: Any, staff: Client, r: Any
) -> None:
    """A key whose kept rate is gone (written by the previous release, or the record expired)
    still shows its TTL and state, and says why its quota cannot be read: never an error."""
    with configured():
        requests("/planned/", "alice", "pro", 1)
        rate_key = get_policy("plan").rate_key("alice")
        assert r.get(rate_key) is not None
        r.delete(rate_key)
        row = rows(staff)["plan", "alice"]
        page = staff.get(KEYS_URL).content.decode()
    state = row["state"]
    assert state.per_request and state.kept_rate is None
    assert state.remaining is None and state.limit is None and state.reset_after is None
    assert state.ttl is not None and state.fields
    assert "rate not kept" in page and "not in use" not in page


@pytest.mark.parametrize("bad", [b"", b"gc|100", b"fw|100|3600000000||100/h", b"gc|x|1|1|1/s",
                                 b"gc|0|36000000|1|100/h", b"gc|1|1|1|" + b"9" * 300])
def test_a_malformed_kept_rate_is_not_trusted(
    configured: Any, staff: Client, r: Any, bad: bytes
) -> None:
    with configured():
        requests("/planned/", "alice", "pro", 1)
        rate_key = get_policy("plan").rate_key("alice")
        r.set(rate_key, bad)
        state = rows(staff)["plan", "alice"]["state"]
    assert state.remaining is None and state.kept_rate is None


def test_kept_rates_never_take_a_place_on_a_page(configured: Any) -> None:
    """A page stops at its size in state keys: the kept rates its SCAN meets (they match its
    glob, "...:??:{*}") are neither listed nor counted."""
    from django_redislua.limiting import inspect

    with configured():
        pro = get_policy("plan").with_rate("100/h")
        for n in range(20):
            pro.hit(f"user{n}")
        seen: list[str] = []
        page = inspect.scan_keys(page_size=5)
        while True:
            seen += [state.key for state in page.keys]
            if not page.cursor:
                break
            assert len(page.keys) >= 5 or page.scan_calls == inspect.MAX_SCAN_CALLS, page
            page = inspect.scan_keys(page.cursor, page_size=5)
    assert sorted(seen) == sorted(pro.redis_key(f"user{n}") for n in range(20))


def test_a_stacked_view_keeps_the_callables_rate_in_the_same_call(
    configured: Any, staff: Client, r: Any, recorder: CommandRecorder
) -> None:
    """Several policies on a view are one script call: the kept rate goes in it, for the
    policy with a rate callable only."""
    with configured():
        requests("/stacked/", "warm", "pro", 1)  # the script loaded, the connection made
        with recorder:
            seen = requests("/stacked/", "carol", "pro", 1)[0]
        assert recorder.commands_without_handshake == ["EVALSHA"]
        assert seen["plan"][:2] == (100, 99) and seen["flat"][:2] == (50, 49)
        assert r.get(get_policy("plan").rate_key("carol")).endswith(b"|100/d")
        assert r.get(get_policy("flat").rate_key("carol")) is None
        found = rows(staff)
    assert {("plan", "carol"), ("flat", "carol")} <= set(found)
    plan, flat = found["plan", "carol"]["state"], found["flat", "carol"]["state"]
    assert (plan.limit, plan.remaining, plan.kept_rate) == (100, 99, "100/d")
    assert (flat.limit, flat.remaining, flat.kept_rate) == (50, 49, None)


def test_an_inline_policy_with_a_rate_callable_is_in_use(
    configured: Any, staff: Client, r: Any
) -> None:
    """Discovery lists an inline @ratelimit with a rate callable too: the admin peeks at its
    keys, its policies table names the callable, redislua_reset resets it."""
    from django_redislua.discovery import policies_in_use

    with configured():
        requests("/inline/", "dave", "free", 4)
        in_use = policies_in_use()
        assert in_use["inline-plan"].policy.is_dynamic
        assert in_use["inline-plan"].source == "view inline/"
        response = staff.get(KEYS_URL)
        state = rows(staff)["inline-plan", "dave"]["state"]
        assert (state.limit, state.remaining, state.kept_rate) == (10, 6, "10/d")
        assert f"{HERE}.plan_rate(request)" in response.content.decode()
        call_command("redislua_reset", "inline-plan", "dave", stdout=io.StringIO())
        assert not r.exists("rl:inline-plan:gc:{dave}")


# -- what the scripts keep -------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_kept_rate_lives_as_long_as_the_state(configured: Any, r: Any,
                                                  algorithm: str) -> None:
    with configured(algorithm):
        requests("/planned/", "erin", "free", 3)
        state_key = get_policy("plan").redis_key("erin")
        rate_key = get_policy("plan").rate_key("erin")
        assert parse_key(state_key) is not None and parse_key(rate_key) is None
        state_ends = r.execute_command("PEXPIRETIME", state_key)
        kept_ends = r.execute_command("PEXPIRETIME", rate_key)
        policy = get_policy("plan").with_rate("10/d")
        assert r.get(rate_key) == (f"{policy.code}|{policy.limit}|{policy.param}|"
                                   f"{policy.extra}|10/d").encode()
    assert state_ends > 0 and state_ends <= kept_ends <= state_ends + 5


def test_a_denial_a_peek_an_unlimited_request_and_an_allow_keep_nothing(
    configured: Any, r: Any
) -> None:
    with configured():
        policy = get_policy("plan")
        resolved = policy.with_rate("2/h")
        assert resolved.keeps_rate and not policy.keeps_rate
        rate_key = policy.rate_key("frank")
        resolved.peek("frank")
        assert not r.exists(rate_key)
        assert resolved.hit("frank").allowed and resolved.hit("frank").allowed
        r.delete(rate_key)
        assert not resolved.hit("frank").allowed  # denied: the state did not change
        assert not evaluate([(resolved, "frank", 1)], peek=True)[0].allowed
        assert not r.exists(rate_key)
        requests("/planned/", "grace", "staff", 2)  # unlimited: never decided
        assert not r.exists(policy.rate_key("grace"))
        requests("/planned/", "oscar", "free", 1)
        assert r.get(policy.rate_key("oscar")).endswith(b"|10/d")
        overrides.allow("plan", "oscar", ttl="1h")  # admitted, nothing consumed: not decided
        requests("/planned/", "oscar", "pro", 1)  # at 100/d
        evaluate([(policy.with_rate("100/d"), "oscar", 1), (get_policy("flat"), "oscar", 1)])
        assert r.get(policy.rate_key("oscar")).endswith(b"|10/d")
        overrides.allow("plan", "peggy", ttl="1h")
        requests("/planned/", "peggy", "pro", 1)
        assert not r.exists(policy.rate_key("peggy")) and not r.exists(policy.redis_key("peggy"))


def test_a_live_override_rate_decides_and_the_callables_rate_is_kept(
    configured: Any, staff: Client, r: Any
) -> None:
    with configured():
        overrides.set_rate("plan", "heidi", "1000/d", ttl="1h", reason="trial")
        seen = requests("/planned/", "heidi", "free", 2)[-1]["plan"]
        assert seen[:2] == (1000, 998)  # the override's rate decided
        assert r.get(get_policy("plan").rate_key("heidi")).endswith(b"|10/d")
        row = rows(staff)["plan", "heidi"]
    state = row["state"]
    # What the next request meets: the override's rate, marked on the row; the record names
    # the callable's.
    assert (state.limit, state.remaining, state.kept_rate) == (1000, 998, "10/d")
    assert row["override"] is not None and row["override"].rate == "1000/d"


@pytest.mark.parametrize("functions", [False, True], ids=["evalsha", "functions"])
def test_single_and_multi_policy_calls_keep_it_as_functions_too(
    configured: Any, r: Any, functions: bool
) -> None:
    with configured(USE_FUNCTIONS=functions):
        pro = get_policy("plan").with_rate("100/h")
        pro.hit("ivan")
        evaluate([(pro, "judy", 1), (get_policy("flat"), "judy", 1)])
        evaluate([(pro, "ken", 1), (get_policy("flat"), "ken", 1)], soft={0})
        for user in ("ivan", "judy", "ken"):
            assert r.get(pro.rate_key(user)) == pro.rate_record.encode(), user
        assert pro.rate_record.endswith("|100/h")


# -- fixed rates: nothing changes ------------------------------------------------------------
def _sent(recorder: CommandRecorder) -> list[list[str]]:
    return [str(e["command"]).split(" ") for e in recorder.entries
            if e.get("client_type") != "lua"]


def test_a_fixed_rate_hit_sends_the_command_it_sent_before(
    configured: Any, recorder: CommandRecorder
) -> None:
    """A fixed-rate policy pays nothing for kept rates: its single and multi-policy commands
    are the previous release's, argument for argument, and its script writes no more."""
    with configured():
        flat, api = get_policy("flat"), get_policy("api")
        flat.hit("mallory")
        evaluate([(flat, "warm", 1), (api, "warm", 1)])  # every script loaded
        with recorder:
            flat.hit("mallory")
            evaluate([(flat, "mallory", 1), (api, "mallory", 1)])
    single, multi = _sent(recorder)
    one, many = get_script("django_redislua.ratelimit_fw"), get_script("django_redislua.ratelimit")
    assert single == ["EVALSHA", one.sha, "2", "rl:flat:fw:{mallory}", "rl:ov:{mallory}", "hit",
                      "", "fw", "50", "3600000000", "1", "", "1", "flat"]
    assert multi == ["EVALSHA", many.sha, "4", "rl:flat:fw:{mallory}", "rl:api:gc:{mallory}",
                     "rl:ov:{mallory}", "rl:ov:{mallory}", "hit", "",
                     "fw", "50", "3600000000", "1", "", "1", "flat",
                     "gc", "20", str(api.param), "1", api.extra, "1", "api"]
    assert "PTTL" not in recorder.script_commands
    assert not [e for e in recorder.entries if ":rt:" in str(e["command"])]


def test_a_rate_callables_hit_is_one_call_with_one_key_more(
    configured: Any, recorder: CommandRecorder
) -> None:
    with configured():
        pro = get_policy("plan").with_rate("100/h")
        pro.hit("warm")
        with recorder:
            pro.hit("niaj")
    [sent] = _sent(recorder)
    assert sent[2:6] == ["3", "rl:plan:gc:{niaj}", "rl:ov:{niaj}", "rl:plan:rt:{niaj}"]
    assert sent[-1] == pro.rate_record
    assert recorder.script_commands[-2:] == ["PTTL", "SET"]
