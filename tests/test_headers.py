"""rate_limit_headers against draft-ietf-httpapi-ratelimit-headers-11 and the legacy form."""

from __future__ import annotations

import math
import re

import pytest

from django_redislua.headers import rate_limit_headers, retry_after_seconds
from django_redislua.limiting import Decision, Policy, evaluate

WINDOW = Policy("login", rate="5/m", algorithm="sliding_log")
BUCKET = Policy("api", rate="100/m", algorithm="gcra", burst=20)
SLOTS = Policy("export", algorithm="concurrency", limit=2, timeout="10m")
# An sf-string item with integer or sf-string parameters (RFC 9651 List of Items).
SF_STRING = r'"(?:[^"\\]|\\.)*"'
SF_ITEM = re.compile(rf"{SF_STRING}(?:;[a-z]+=(?:\d+|{SF_STRING}))+")


def decision(policy: Policy, allowed: bool, remaining: int, reset: float, retry: float) -> Decision:
    return Decision(allowed, policy.limit, remaining, reset, retry, policy, "k")


@pytest.mark.unit
def test_ietf_lists_every_policy() -> None:
    headers = rate_limit_headers(
        [decision(WINDOW, True, 3, 41.2, 0.0), decision(BUCKET, True, 19, 2.9, 0.0),
         decision(SLOTS, True, 1, 0.0, 0.0)], mode="ietf",
    )
    assert headers == {
        "RateLimit-Policy":
            '"login";q=5;w=60, "api";q=20;w=12, "export";q=2;qu="concurrent-requests"',
        "RateLimit": '"login";r=3;t=42, "api";r=19;t=3, "export";r=1',
    }
    for field in headers.values():
        assert all(SF_ITEM.fullmatch(item) for item in field.split(", "))


@pytest.mark.unit
def test_retry_after_is_whole_seconds_rounded_up() -> None:
    assert retry_after_seconds([decision(WINDOW, False, 0, 10, 0.2)]) == 1
    assert retry_after_seconds([decision(WINDOW, False, 0, 10, 4.0)]) == 4
    assert retry_after_seconds([decision(WINDOW, False, 0, 10, 4.001)]) == 5
    assert retry_after_seconds([decision(WINDOW, True, 2, 10, 0.0)]) == 0
    # Several denials: the longest wait, as none may succeed sooner.
    both = [decision(WINDOW, False, 0, 10, 3.5), decision(BUCKET, False, 0, 3, 0.1)]
    assert retry_after_seconds(both) == 4


@pytest.mark.unit
@pytest.mark.parametrize("mode", ["ietf", "legacy", "both", None])
def test_denied_always_has_retry_after(mode: str | None) -> None:
    headers = rate_limit_headers([decision(WINDOW, False, 0, 30, 12.5)], mode=mode)
    assert headers["Retry-After"] == "13"


@pytest.mark.unit
def test_legacy_describes_the_tightest_policy() -> None:
    headers = rate_limit_headers(
        [decision(WINDOW, True, 3, 41.2, 0.0), decision(BUCKET, True, 1, 5.5, 0.0)], mode="legacy"
    )
    assert headers == {
        "X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "6",
    }


@pytest.mark.unit
def test_denied_legacy_prefers_the_denying_policy() -> None:
    headers = rate_limit_headers(
        [decision(WINDOW, False, 0, 41.2, 30.0), decision(BUCKET, True, 0, 5.5, 0.0)], mode="legacy"
    )
    assert headers["X-RateLimit-Limit"] == "5"


@pytest.mark.unit
def test_names_are_escaped_sf_strings() -> None:
    odd = Policy('we"ird\\näme', rate="1/s", algorithm="fixed_window")
    field = rate_limit_headers([decision(odd, True, 0, 1, 0)], mode="ietf")["RateLimit-Policy"]
    assert field == '"we\\"ird\\\\nme";q=1;w=1'


@pytest.mark.unit
def test_no_decisions_no_headers() -> None:
    assert rate_limit_headers([], mode="both") == {}


# -- draft -11: the quota unit, and what w and t mean ----------------------------------------------
@pytest.mark.unit
def test_a_concurrency_quota_counts_concurrent_requests_and_has_no_window() -> None:
    """Draft -11 3.1.2: ``qu="concurrent-requests"``; no ``w`` and no ``t`` (a count of requests
    in flight has no time window: a release frees a slot at any moment, long before its lease's
    expiry, which is all ``t`` could say)."""
    for allowed, remaining, retry in ((True, 1, 0.0), (False, 0, 599.5)):
        headers = rate_limit_headers([decision(SLOTS, allowed, remaining, 600.0, retry)],
                                     mode="ietf")
        assert headers["RateLimit-Policy"] == '"export";q=2;qu="concurrent-requests"'
        assert headers["RateLimit"] == f'"export";r={remaining}'


@pytest.mark.unit
def test_requests_are_the_default_unit_and_never_written() -> None:
    field = rate_limit_headers([decision(WINDOW, True, 3, 41.2, 0.0),
                                decision(BUCKET, True, 19, 2.9, 0.0)], mode="ietf")
    assert "qu=" not in field["RateLimit-Policy"]


@pytest.mark.unit
def test_a_denied_policy_effective_window_ends_with_its_retry_after() -> None:
    """Draft -11 section 6: Retry-After "SHOULD NOT reference a point in time earlier than the end
    of the effective window". A denied policy's state is full again only later (here 58.2 s), but
    a request fits after 10.1 s: t says 11, as Retry-After does, not 59."""
    headers = rate_limit_headers([decision(WINDOW, False, 0, 58.2, 10.1)], mode="ietf")
    assert headers["RateLimit"] == '"login";r=0;t=11'
    assert headers["Retry-After"] == "11"
    # Several denials: each t is its own wait, none after the (longest) Retry-After.
    both = rate_limit_headers([decision(WINDOW, False, 0, 58.2, 10.1),
                               decision(BUCKET, False, 0, 11.4, 0.6),
                               decision(SLOTS, True, 1, 0.0, 0.0)], mode="ietf")
    assert both["RateLimit"] == '"login";r=0;t=11, "api";r=0;t=1, "export";r=1'
    assert both["Retry-After"] == "11"


@pytest.mark.unit
def test_a_denial_no_wait_lifts_keeps_the_reset_and_sends_no_retry_after() -> None:
    zero = Policy("closed", rate="0/m", algorithm="fixed_window")
    headers = rate_limit_headers([decision(zero, False, 0, 0.0, math.inf)], mode="ietf")
    assert headers == {"RateLimit-Policy": '"closed";q=0;w=60', "RateLimit": '"closed";r=0;t=0'}


# Whole seconds from an instant aligned to every window below (sliding_window aligns its windows
# to multiples of the period in server time).
T0 = 28_333_334 * 60 * 1_000_000


@pytest.mark.parametrize(("policy", "window", "steps"), [
    # (seconds after T0 of each hit, allowed, r, t); the last hit is denied, and its t is then
    # its Retry-After.
    pytest.param(Policy("fw", rate="5/m", algorithm="fixed_window"), 60, [
        (0, True, 4, 60), (20, True, 3, 40),            # t: until the window (opened at 0) ends
        (20, True, 2, 40), (20, True, 1, 40), (20, True, 0, 40),
        (20, False, 0, 40),                               # denied: the window's end, too
    ], id="fixed_window"),
    pytest.param(Policy("sl", rate="5/m", algorithm="sliding_log"), 60, [
        (0, True, 4, 60), (20, True, 3, 60),            # t: until the newest hit is 60 s old
        (20, True, 2, 60), (20, True, 1, 60), (20, True, 0, 60),
        (20, False, 0, 40),                               # denied: until the hit of 0 ages out
    ], id="sliding_log"),
    pytest.param(Policy("sw", rate="5/m", algorithm="sliding_window"), 60, [
        (30, True, 4, 90), (30, True, 3, 90),           # t: until the next window ends
        (30, True, 2, 90), (30, True, 1, 90), (30, True, 0, 90),
        (30, False, 0, 42),   # denied: until 5 * (60 - e) / 60 <= 4 in the next window, e = 12
    ], id="sliding_window"),
    pytest.param(Policy("tb", rate="6/m", algorithm="token_bucket", burst=3), 30, [
        (0, True, 2, 10), (0, True, 1, 20), (0, True, 0, 30),   # t: until the bucket is full
        (0, False, 0, 10),                                        # denied: until a token comes
    ], id="token_bucket"),
    pytest.param(Policy("lb", rate="6/m", algorithm="leaky_bucket", burst=3), 30, [
        (0, True, 2, 10), (0, True, 1, 20), (0, True, 0, 30),   # t: until the bucket is empty
        (0, False, 0, 10),                                        # denied: until one more fits
    ], id="leaky_bucket"),
    pytest.param(Policy("gc", rate="6/m", algorithm="gcra", burst=3), 30, [
        (0, True, 2, 10), (0, True, 1, 20), (0, True, 0, 30),   # t: until the TAT passes
        (0, False, 0, 10),                                        # denied: until one more fits
    ], id="gcra"),
])
@pytest.mark.topologies
def test_w_and_t_for_every_algorithm(
    policy: Policy, window: int, steps: list[tuple[int, bool, int, int]]
) -> None:
    """What docs/views.md says ``w`` and ``t`` are, per algorithm, against real Redis on an
    injected clock: ``q`` per ``w`` is the sustained rate; ``t`` is until the state is full again
    while admitted, and until the same request fits once denied."""
    name = policy.name
    for offset, allowed, remaining, t in steps:
        [d] = evaluate([(policy, "client", 1)], now_us=T0 + offset * 1_000_000)
        headers = rate_limit_headers([d], mode="ietf")
        assert headers["RateLimit-Policy"] == f'"{name}";q={policy.limit};w={window}'
        assert (d.allowed, headers["RateLimit"]) == (allowed, f'"{name}";r={remaining};t={t}')
    assert headers["Retry-After"] == str(t)


@pytest.mark.topologies
def test_t_of_a_concurrency_policy_against_redis() -> None:
    policy = Policy("cc", algorithm="concurrency", limit=1, timeout="10m")
    held = policy.hit("client")
    denied = policy.hit("client")
    headers = rate_limit_headers([held], mode="ietf")
    assert headers["RateLimit"] == '"cc";r=0'
    headers = rate_limit_headers([denied], mode="ietf")
    assert headers["RateLimit"] == '"cc";r=0' and 599 <= int(headers["Retry-After"]) <= 600
    policy.release("client", held)


@pytest.mark.unit
def test_a_policy_s_item_follows_the_quota_each_decision_carries() -> None:
    # The item of RateLimit-Policy is remembered per policy and quota: a live override's
    # quota (another limit on the same policy) gets its own, never the policy's.
    for limit in (20, 7, 20):
        changed = Decision(True, limit, 1, 2.9, 0.0, BUCKET, "k")
        assert rate_limit_headers([changed], mode="ietf")["RateLimit-Policy"] == (
            f'"api";q={limit};w=12')
