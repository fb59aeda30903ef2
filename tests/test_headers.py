"""rate_limit_headers against draft-ietf-httpapi-ratelimit-headers-10 and the legacy form."""

from __future__ import annotations

import re

import pytest

from django_redislua.headers import rate_limit_headers, retry_after_seconds
from django_redislua.limiting import Decision, Policy

pytestmark = pytest.mark.topologies

WINDOW = Policy("login", rate="5/m", algorithm="sliding_log")
BUCKET = Policy("api", rate="100/m", algorithm="gcra", burst=20)
SLOTS = Policy("export", algorithm="concurrency", limit=2, timeout="10m")
# An sf-string item with integer parameters (RFC 8941 List of Items).
SF_ITEM = re.compile(r'"(?:[^"\\]|\\.)*"(?:;[a-z]+=\d+)+')


def decision(policy: Policy, allowed: bool, remaining: int, reset: float, retry: float) -> Decision:
    return Decision(allowed, policy.limit, remaining, reset, retry, policy, "k")


def test_ietf_lists_every_policy() -> None:
    headers = rate_limit_headers(
        [decision(WINDOW, True, 3, 41.2, 0.0), decision(BUCKET, True, 19, 2.9, 0.0),
         decision(SLOTS, True, 1, 0.0, 0.0)], mode="ietf",
    )
    assert headers == {
        "RateLimit-Policy": '"login";q=5;w=60, "api";q=20;w=12, "export";q=2',
        "RateLimit": '"login";r=3;t=42, "api";r=19;t=3, "export";r=1;t=0',
    }
    for field in headers.values():
        assert all(SF_ITEM.fullmatch(item) for item in field.split(", "))


def test_retry_after_is_whole_seconds_rounded_up() -> None:
    assert retry_after_seconds([decision(WINDOW, False, 0, 10, 0.2)]) == 1
    assert retry_after_seconds([decision(WINDOW, False, 0, 10, 4.0)]) == 4
    assert retry_after_seconds([decision(WINDOW, False, 0, 10, 4.001)]) == 5
    assert retry_after_seconds([decision(WINDOW, True, 2, 10, 0.0)]) == 0
    # Several denials: the longest wait, as none may succeed sooner.
    both = [decision(WINDOW, False, 0, 10, 3.5), decision(BUCKET, False, 0, 3, 0.1)]
    assert retry_after_seconds(both) == 4


@pytest.mark.parametrize("mode", ["ietf", "legacy", "both", None])
def test_denied_always_has_retry_after(mode: str | None) -> None:
    headers = rate_limit_headers([decision(WINDOW, False, 0, 30, 12.5)], mode=mode)
    assert headers["Retry-After"] == "13"


def test_legacy_describes_the_tightest_policy() -> None:
    headers = rate_limit_headers(
        [decision(WINDOW, True, 3, 41.2, 0.0), decision(BUCKET, True, 1, 5.5, 0.0)], mode="legacy"
    )
    assert headers == {
        "X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "6",
    }


def test_denied_legacy_prefers_the_denying_policy() -> None:
    headers = rate_limit_headers(
        [decision(WINDOW, False, 0, 41.2, 30.0), decision(BUCKET, True, 0, 5.5, 0.0)], mode="legacy"
    )
    assert headers["X-RateLimit-Limit"] == "5"


def test_names_are_escaped_sf_strings() -> None:
    odd = Policy('we"ird\\näme', rate="1/s", algorithm="fixed_window")
    field = rate_limit_headers([decision(odd, True, 0, 1, 0)], mode="ietf")["RateLimit-Policy"]
    assert field == '"we\\"ird\\\\nme";q=1;w=1'


def test_no_decisions_no_headers() -> None:
    assert rate_limit_headers([], mode="both") == {}
