"""REDISLUA["DENIED_BODY"]: this app's own 429 as plain text (the default) or as RFC 9457
problem details with draft-ietf-httpapi-ratelimit-headers-11's quota-exceeded type; through the
decorator and the middleware, sync and async, on the real Redis test server."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.test import override_settings
from django.test.client import RequestFactory

from django_redislua.checks import check_settings
from django_redislua.decorators import ratelimit
from django_redislua.headers import rate_limit_headers
from django_redislua.limiting import Decision, Policy, RateLimited
from django_redislua.middleware import RateLimitMiddleware
from django_redislua.problem import quota_exceeded, quota_exceeded_response

pytestmark = pytest.mark.topologies

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
POLICIES = {
    "pd-a": {"algorithm": "fixed_window", "rate": "1/m", "key": "ip"},
    "pd-b": {"algorithm": "sliding_log", "rate": "1/m", "key": "ip"},
    "pd-wide": {"algorithm": "gcra", "rate": "100/m", "key": "ip"},
}
RULES = [{"path": "/pd/", "policy": name} for name in ("pd-a", "pd-b", "pd-wide")]
factory = RequestFactory()


def redislua(**changes: Any) -> override_settings:
    """The test settings' REDISLUA (a cluster run's CONNECTION included) with these policies."""
    return override_settings(REDISLUA={
        **settings.REDISLUA, "POLICIES": POLICIES, "MIDDLEWARE_POLICIES": RULES, **changes,
    })


@ratelimit("pd-a")
@ratelimit("pd-b")
@ratelimit("pd-wide")
def view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("pd-a")
@ratelimit("pd-b")
@ratelimit("pd-wide")
async def async_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


async def async_ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def sf_names(field: str) -> list[str]:
    """The policy names of a RateLimit-Policy field, as a Structured Field parser reads them."""
    return [re.sub(r"\\(.)", r"\1", m) for m in re.findall(r'"((?:[^"\\]|\\.)*)"(?:;|$)', field)]


def assert_problem(response: HttpResponseBase, violated: list[str]) -> dict[str, Any]:
    """A 429 whose body is the quota-exceeded problem, headers and all."""
    assert response.status_code == 429
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)  # type: ignore[attr-defined]
    assert body["type"] == QUOTA_EXCEEDED
    assert body["title"] == "Quota Exceeded"
    assert body["status"] == 429
    assert body["violated-policies"] == violated
    wait = int(response["Retry-After"])
    assert body["detail"] == (
        f"Quota exceeded for {', '.join(violated)}; retry after {wait} seconds.")
    # Named as the headers name them, in the same order; the allowed policy is not violated.
    names = sf_names(response["RateLimit-Policy"])
    assert [n for n in names if n in violated] == violated and "pd-wide" in names
    assert response["RateLimit"]
    return body


def test_default_body_is_still_plain_text() -> None:
    for address, changes in (("10.1.0.1", {}), ("10.1.0.2", {"DENIED_BODY": "text"})):
        with redislua(**changes):
            assert view(factory.get("/", REMOTE_ADDR=address)).status_code == 200
            denied = view(factory.get("/", REMOTE_ADDR=address))
        assert denied.status_code == 429
        assert denied["Content-Type"] == "text/plain; charset=utf-8"
        assert denied.content == b"Too Many Requests\n"
        assert "Retry-After" in denied and "RateLimit" in denied


def test_decorator_denied_by_two_policies_names_both() -> None:
    with redislua(DENIED_BODY="problem"):
        assert view(factory.get("/")).status_code == 200
        assert_problem(view(factory.get("/")), ["pd-a", "pd-b"])


async def test_async_decorator() -> None:
    with redislua(DENIED_BODY="problem"):
        assert (await async_view(factory.get("/"))).status_code == 200
        assert_problem(await async_view(factory.get("/")), ["pd-a", "pd-b"])


def test_middleware() -> None:
    middleware = RateLimitMiddleware(ok)
    with redislua(DENIED_BODY="problem"):
        assert middleware(factory.get("/pd/x/")).status_code == 200
        assert_problem(middleware(factory.get("/pd/x/")), ["pd-a", "pd-b"])
        assert middleware(factory.get("/elsewhere/")).status_code == 200  # no rule applies


async def test_async_middleware() -> None:
    middleware = RateLimitMiddleware(async_ok)
    with redislua(DENIED_BODY="problem"):
        assert (await middleware(factory.get("/pd/x/"))).status_code == 200
        assert_problem(await middleware(factory.get("/pd/x/")), ["pd-a", "pd-b"])


def test_rate_limited_raised_in_a_view_becomes_the_problem() -> None:
    """The middleware's other path: a RateLimited a view raises (``policy.slot``)."""
    policy = Policy("pd-slot", algorithm="concurrency", limit=1, timeout="1m")
    with redislua(DENIED_BODY="problem"):
        held = policy.hit("someone")
        with pytest.raises(RateLimited) as raised, policy.slot("someone"):
            pass
        response = RateLimitMiddleware(ok).process_exception(factory.get("/"), raised.value)
        policy.release("someone", held)
    assert response is not None and response.status_code == 429
    assert response["Content-Type"] == "application/problem+json"
    assert json.loads(response.content)["violated-policies"] == ["pd-slot"]  # type: ignore[attr-defined]
    assert response["RateLimit-Policy"] == '"pd-slot";q=1;qu="concurrent-requests"'


def test_a_denied_view_of_the_users_own_is_theirs() -> None:
    with redislua(DENIED_BODY="problem",
                  DENIED_VIEW="tests.testapp.ratelimit_views.denied_view"):
        view(factory.get("/"))
        denied = view(factory.get("/"))
    assert denied.status_code == 429
    assert denied["Content-Type"] == "application/json"
    assert json.loads(denied.content) == {"detail": "slow down", "policies": ["pd-a", "pd-b"]}
    assert "Retry-After" in denied and "RateLimit" in denied


def test_a_bad_value_is_a_check_error_and_denials_keep_the_text_body() -> None:
    with redislua(DENIED_BODY="json"):
        # (errors only: on a cluster, redis-py before 8 adds the W004 warning)
        assert [m.id for m in check_settings() if m.is_serious()] == ["redislua.E028"]
        view(factory.get("/"))
        denied = view(factory.get("/"))
    assert denied.status_code == 429 and denied.content == b"Too Many Requests\n"


def test_names_are_the_headers_names_and_the_json_is_json_whatever_they_hold() -> None:
    """Policy names come from settings, yet the body is built by json.dumps: quotes,
    backslashes, markup and control characters stay inside their JSON string. A name is the
    printable ASCII the RateLimit-Policy header carries, so the two match."""
    odd = Policy('x", "status": 200, "y\\\n<script>ü', rate="1/m", algorithm="fixed_window")
    plain = Policy("plain", rate="1/m", algorithm="fixed_window")
    denied = [Decision(False, 1, 0, 30.0, 29.2, odd, "k"),
              Decision(False, 1, 0, 30.0, 29.2, odd, "k"),  # two rules on one policy: once
              Decision(True, 1, 0, 60.0, 0.0, plain, "k")]
    response = quota_exceeded_response(RateLimited(denied))
    body = json.loads(response.content)
    assert body["status"] == 429
    assert body["violated-policies"] == ['x", "status": 200, "y\\<script>']
    header = rate_limit_headers(denied, mode="ietf")["RateLimit-Policy"]
    assert sf_names(header)[0] == body["violated-policies"][0]


def test_a_denial_no_wait_lifts_says_so() -> None:
    closed = Policy("closed", rate="0/m", algorithm="fixed_window")
    body = quota_exceeded(RateLimited([Decision(False, 0, 0, 0.0, float("inf"), closed, "k")]))
    assert body["detail"] == "Quota exceeded for closed; no wait will admit this request."
    assert body["violated-policies"] == ["closed"]


def test_a_blocked_identity_is_abnormal_usage_naming_the_blocking_policy() -> None:
    from django_redislua import overrides

    with redislua(DENIED_BODY="problem"):
        assert view(factory.get("/", REMOTE_ADDR="10.9.0.1")).status_code == 200
        overrides.block("pd-wide", "10.9.0.1", ttl="10m", reason="scraping")
        response = view(factory.get("/", REMOTE_ADDR="10.9.0.1"))
    assert response.status_code == 429
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert body["type"] == "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"
    assert body["title"] == "Abnormal Usage Detected" and body["status"] == 429
    assert body["violated-policies"] == ["pd-wide"]  # the block, not the quotas also used up
    assert 590 <= int(response["Retry-After"]) <= 600
    wait = response["Retry-After"]
    assert body["detail"] == f"Requests blocked by pd-wide; retry after {wait} seconds."
