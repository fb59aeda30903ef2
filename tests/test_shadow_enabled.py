"""Issue 14: a policy's ``"mode": "shadow"`` and the ``REDISLUA["ENABLED"]`` kill switch, on
every request path (``@ratelimit`` sync, async and class-based, RateLimitMiddleware with a sync
and an async ``get_response``, the DRF throttles, compat), plus their system checks and the
admin page's policies table. Everything runs against the real Redis of the test suite.

Shadow: decided and counted exactly as if enforced, but it never blocks, sets no headers,
keeps its Decisions on ``request.ratelimit_shadow``, signals its denials and logs them (one
line a minute per policy), and never changes what an enforced policy stacked with it decides.

ENABLED = False: every layer admits every request without running a key function and without
sending Redis a single command; the Python API still decides.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Iterator, Sequence
from io import StringIO
from typing import Any

import pytest
import redis
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.test import AsyncClient, Client, override_settings
from django.test.client import AsyncRequestFactory, RequestFactory
from django.urls import path
from django.views import View
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from django_redislua import drf
from django_redislua.checks import check_settings
from django_redislua.compat import ratelimit as compat_ratelimit
from django_redislua.decorators import ratelimit
from django_redislua.limiting import Decision, get_policy
from django_redislua.middleware import RateLimitMiddleware
from django_redislua.signals import rate_limited
from django_redislua.testing import CommandRecorder
from tests.settings import MIDDLEWARE, REDISLUA

pytestmark = pytest.mark.urls(__name__)

WHO = "header:x-who"  # the identity is the X-Who header: tests peek at it directly
POLICIES: dict[str, Any] = {
    **REDISLUA["POLICIES"],  # type: ignore[dict-item]
    "sh": {"algorithm": "sliding_log", "rate": "2/d", "key": WHO, "mode": "shadow"},
    "sh2": {"algorithm": "fixed_window", "rate": "1/d", "key": WHO, "mode": "shadow"},
    "enf": {"algorithm": "sliding_log", "rate": "5/d", "key": WHO},
    "counted": {"algorithm": "fixed_window", "rate": "1/d",
                "key": "tests.test_shadow_enabled.counting_key"},
    "sh-slot": {"algorithm": "concurrency", "limit": 1, "key": WHO, "timeout": "1h",
                "mode": "shadow"},
}
# HEADERS "both": a shadow policy must leak neither the IETF nor the legacy X-RateLimit-*.
CONFIG: dict[str, Any] = {**REDISLUA, "POLICIES": POLICIES, "HEADERS": "both"}
RATE_HEADERS = ("ratelimit", "x-ratelimit", "retry-after")
WITH_MIDDLEWARE = [*MIDDLEWARE, "django_redislua.middleware.RateLimitMiddleware"]

KEY_CALLS: list[str] = []


def counting_key(request: HttpRequest) -> str | None:
    KEY_CALLS.append(request.path)
    return request.META.get("HTTP_X_WHO", "anon")


def raising_key(request: HttpRequest) -> str:
    KEY_CALLS.append(request.path)
    raise AssertionError("a key function ran although REDISLUA['ENABLED'] is False")


def compat_key(group: str, request: HttpRequest) -> str:
    KEY_CALLS.append(request.path)
    return request.META.get("HTTP_X_WHO", "anon")


def redislua(**changes: Any) -> override_settings:
    """CONFIG with ``changes``; ``POLICIES`` entries given as ``policy_<name>=`` are merged."""
    policies = dict(POLICIES)
    for name in [k for k in changes if k.startswith("policy_")]:
        policies[name[len("policy_"):].replace("_", "-")] = changes.pop(name)
    return override_settings(REDISLUA={**CONFIG, "POLICIES": policies, **changes})


def mode(name: str, value: str) -> dict[str, Any]:
    return {**POLICIES[name], "mode": value}


@pytest.fixture(autouse=True)
def _config() -> Iterator[None]:
    KEY_CALLS.clear()
    with override_settings(REDISLUA=CONFIG):
        yield
    KEY_CALLS.clear()


class Signals:
    """Receives ``rate_limited``: (sender, policy name, allowed, shadow) per denial."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, str, bool, bool]] = []

    def __call__(self, sender: Any, request: Any, decision: Decision, **kwargs: Any) -> None:
        self.seen.append((sender, decision.policy.name, decision.allowed, decision.shadow))


@pytest.fixture
def signals() -> Iterator[Signals]:
    receiver = Signals()
    rate_limited.connect(receiver, weak=False)
    yield receiver
    rate_limited.disconnect(receiver)


def rate_headers(response: HttpResponseBase) -> list[str]:
    return [h for h in response.headers if h.lower().startswith(RATE_HEADERS)]


def shadow_lines(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [
        rec for rec in caplog.records
        if rec.name == "django_redislua" and "shadow_denied" in rec.getMessage()
        and repr(name) in rec.getMessage()
    ]


# -- views ----------------------------------------------------------------------------------------
def _state(request: Any) -> JsonResponse:
    """What the limiter left on the request."""
    return JsonResponse({
        "enforced": [[d.policy.name, d.allowed] for d in getattr(request, "ratelimit", None) or []],
        "shadow": [[d.policy.name, d.allowed, d.shadow]
                   for d in getattr(request, "ratelimit_shadow", None) or []],
        "limited": getattr(request, "limited", None),
    })


@ratelimit("sh")
def shadow_view(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("sh")
async def ashadow_view(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("sh")
class ShadowCBV(View):
    def get(self, request: HttpRequest) -> JsonResponse:
        return _state(request)


@ratelimit("sh")
class AShadowCBV(View):
    async def get(self, request: HttpRequest) -> JsonResponse:
        return _state(request)


@ratelimit("sh")
@ratelimit("sh2")
def two_shadows(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("sh")
@ratelimit("enf")
def stack_shadow_outer(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("enf")
@ratelimit("sh")
def stack_shadow_inner(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("enf")
def enforced_only(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("sh")
@ratelimit("enf")
async def astack(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("enf")
async def aenforced_only(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("sh-slot")
def shadow_slot(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("sh-slot")
async def ashadow_slot(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("sh-slot")
@ratelimit("enf")
def stack_slot(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("counted")
def counted(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("counted")
async def acounted(request: HttpRequest) -> JsonResponse:
    return _state(request)


@ratelimit("counted")
class CountedCBV(View):
    def get(self, request: HttpRequest) -> JsonResponse:
        return _state(request)


@ratelimit("counted")
class ACountedCBV(View):
    async def get(self, request: HttpRequest) -> JsonResponse:
        return _state(request)


@ratelimit(rate="1/d", key=raising_key)
def raising(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="1/d", key=raising_key)
async def araising(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("no-such-policy")
def broken(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("no-such-policy")
async def abroken(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@compat_ratelimit(key=compat_key, rate="1/d")
def compat_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@compat_ratelimit(key=compat_key, rate="1/d")
async def acompat_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def plain(request: HttpRequest) -> JsonResponse:
    return _state(request)


urlpatterns = [
    path("shadow/", shadow_view),
    path("ashadow/", ashadow_view),
    path("cbv/", ShadowCBV.as_view()),
    path("acbv/", AShadowCBV.as_view()),
    path("two-shadows/", two_shadows),
    path("stack-outer/", stack_shadow_outer),
    path("stack-inner/", stack_shadow_inner),
    path("enforced-only/", enforced_only),
    path("astack/", astack),
    path("aenforced-only/", aenforced_only),
    path("slot/", shadow_slot),
    path("aslot/", ashadow_slot),
    path("stack-slot/", stack_slot),
    path("counted/", counted),
    path("acounted/", acounted),
    path("counted-cbv/", CountedCBV.as_view()),
    path("acounted-cbv/", ACountedCBV.as_view()),
    path("raising/", raising),
    path("araising/", araising),
    path("broken/", broken),
    path("abroken/", abroken),
    path("compat/", compat_view),
    path("acompat/", acompat_view),
    path("api/plain/", plain),
    path("plain/", plain),
]


# -- DRF helpers ----------------------------------------------------------------------------------
factory = APIRequestFactory()
ALICE = User(pk=1, username="alice")


def api_view(*throttles: type[BaseThrottle] | None, **attrs: Any) -> Any:
    """An APIView; no throttle classes given: DRF's global DEFAULT_THROTTLE_CLASSES."""

    class Api(APIView):
        authentication_classes: list[Any] = []

        def get(self, request: Request) -> Response:
            return Response(json.loads(_state(request).content))

    if throttles:
        Api.throttle_classes = list(throttles)  # type: ignore[assignment]
    for name, value in attrs.items():
        setattr(Api, name, value)
    return Api.as_view()


def api_call(view: Any, who: str = "a", user: User | None = None) -> Any:
    request = factory.get("/", HTTP_X_WHO=who, REMOTE_ADDR="10.9.9.9")
    if user is not None:
        force_authenticate(request, user=user)
    return view(request)


# =================================================================================================
# 1. Shadow mode on one view
# =================================================================================================
def assert_shadow_run(responses: Sequence[Any], signals: Signals, caplog: Any,
                      sender: Any) -> None:
    """2/d shadow, 8 requests: all 200, no headers, Decisions on ratelimit_shadow only,
    6 signals with shadow True, and one INFO line for the 6 denials."""
    assert [r.status_code for r in responses] == [200] * 8
    assert [rate_headers(r) for r in responses] == [[]] * 8
    bodies = [r.json() for r in responses]
    assert [b["shadow"] for b in bodies] == [[["sh", i < 2, True]] for i in range(8)]
    assert [b["enforced"] for b in bodies] == [[]] * 8
    assert [b["limited"] for b in bodies] == [False] * 8
    assert signals.seen == [(sender, "sh", False, True)] * 6
    lines = shadow_lines(caplog, "sh")
    assert len(lines) == 1, caplog.text
    assert lines[0].levelno == logging.INFO
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def assert_counted_like_enforced(who: str) -> None:
    peek = get_policy("sh").peek(who)
    assert (peek.allowed, peek.remaining, peek.limit) == (False, 0, 2)
    assert peek.retry_after > 0


@pytest.mark.parametrize("url", ["/shadow/", "/cbv/"])
def test_sync_shadow_never_blocks_counts_signals_and_logs_once(
    client: Client, url: str, signals: Signals, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="django_redislua"):
        responses = [client.get(url, headers={"x-who": "a"}) for _ in range(8)]
    assert_shadow_run(responses, signals, caplog, ratelimit)
    assert_counted_like_enforced("a")
    # The same policy switched to enforce: the same state (same name, same key) denies at once.
    with redislua(policy_sh=mode("sh", "enforce")):
        denied = client.get(url, headers={"x-who": "a"})
        assert denied.status_code == 429
        assert int(denied["Retry-After"]) >= 1
        assert '"sh";q=2' in denied["RateLimit-Policy"] and denied["X-RateLimit-Remaining"] == "0"
        other = client.get(url, headers={"x-who": "b"})
        assert other.status_code == 200 and other.json()["enforced"] == [["sh", True]]
    # ...and back to shadow: that 429 is history, the request goes on again.
    assert client.get(url, headers={"x-who": "a"}).status_code == 200


@pytest.mark.parametrize("url", ["/ashadow/", "/acbv/"])
async def test_async_shadow_never_blocks_counts_signals_and_logs_once(
    url: str, signals: Signals, caplog: pytest.LogCaptureFixture
) -> None:
    client = AsyncClient()
    with caplog.at_level(logging.INFO, logger="django_redislua"):
        responses = [await client.get(url, headers={"x-who": "a"}) for _ in range(8)]
    assert_shadow_run(responses, signals, caplog, ratelimit)
    assert_counted_like_enforced("a")
    with redislua(policy_sh=mode("sh", "enforce")):
        denied = await client.get(url, headers={"x-who": "a"})
        assert denied.status_code == 429 and int(denied["Retry-After"]) >= 1


def test_an_exhausted_enforced_policy_switched_to_shadow_admits_at_once(client: Client) -> None:
    with redislua(policy_sh=mode("sh", "enforce")):
        assert [client.get("/shadow/", headers={"x-who": "a"}).status_code
                for _ in range(3)] == [200, 200, 429]
    response = client.get("/shadow/", headers={"x-who": "a"})
    assert response.status_code == 200 and rate_headers(response) == []
    assert response.json()["shadow"] == [["sh", False, True]]


def test_each_shadow_policy_logs_its_own_line_once_a_minute(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="django_redislua"):
        responses = [client.get("/two-shadows/", headers={"x-who": "a"}) for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 6
    assert [sorted(map(tuple, r.json()["shadow"])) for r in responses][-1] == [
        ("sh", False, True), ("sh2", False, True)]
    assert len(shadow_lines(caplog, "sh")) == 1
    assert len(shadow_lines(caplog, "sh2")) == 1
    assert "shadow_denied" in shadow_lines(caplog, "sh2")[0].getMessage()


def test_an_enforced_denial_logs_no_shadow_line(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="django_redislua"):
        codes = [client.get("/enforced-only/", headers={"x-who": "a"}).status_code
                 for _ in range(7)]
    assert codes == [200] * 5 + [429] * 2
    assert not [r for r in caplog.records if "shadow" in r.getMessage()]


SHADOW_ALGORITHMS = [
    {"algorithm": "sliding_log", "rate": "2/d"},
    {"algorithm": "fixed_window", "rate": "2/d"},
    {"algorithm": "sliding_window", "rate": "2/d"},
    {"algorithm": "sliding_window", "rate": "5/d", "cost": 2},
    {"algorithm": "token_bucket", "rate": "2/d", "burst": 3},
    {"algorithm": "leaky_bucket", "rate": "2/d", "burst": 3},
    {"algorithm": "gcra", "rate": "2/d", "burst": 3},
    {"algorithm": "fixed_window", "rate": "0/d"},
]


@pytest.mark.parametrize("options", SHADOW_ALGORITHMS, ids=lambda o: "-".join(map(str, o.values())))
def test_shadow_decides_and_counts_exactly_as_enforce_would(
    client: Client, options: dict[str, Any]
) -> None:
    """Per algorithm: the shadow run's Decisions and final state equal the enforced run's."""
    spec = {**options, "key": WHO}
    with redislua(policy_sh={**spec, "mode": "shadow"}):
        shadow = [client.get("/shadow/", headers={"x-who": "s"}) for _ in range(5)]
        shadow_peek = get_policy("sh").peek("s")
    with redislua(policy_sh={**spec, "mode": "enforce"}):
        enforce = [client.get("/shadow/", headers={"x-who": "e"}) for _ in range(5)]
        enforce_peek = get_policy("sh").peek("e")
    assert [r.status_code for r in shadow] == [200] * 5
    admitted = [r.status_code == 200 for r in enforce]
    assert [r.json()["shadow"][0][1] for r in shadow] == admitted
    assert (shadow_peek.allowed, shadow_peek.remaining, shadow_peek.limit) == (
        enforce_peek.allowed, enforce_peek.remaining, enforce_peek.limit)
    assert False in admitted  # each case does reach a denial


# =================================================================================================
# 2. Shadow stacked with an enforced policy: the enforced one decides as if alone
# =================================================================================================
STACKS = [
    # (enforced "enf", shadow "sh"), each a fresh policy definition
    ({"algorithm": "sliding_log", "rate": "5/d"}, {"algorithm": "sliding_log", "rate": "2/d"}),
    ({"algorithm": "fixed_window", "rate": "3/d"},
     {"algorithm": "gcra", "rate": "10/d", "burst": 10}),
    ({"algorithm": "token_bucket", "rate": "4/d", "burst": 4},
     {"algorithm": "sliding_window", "rate": "2/d"}),
    ({"algorithm": "fixed_window", "rate": "0/d"}, {"algorithm": "sliding_log", "rate": "3/d"}),
    ({"algorithm": "sliding_log", "rate": "4/d"}, {"algorithm": "fixed_window", "rate": "0/d"}),
    ({"algorithm": "sliding_log", "rate": "4/d"},
     {"algorithm": "fixed_window", "rate": "3/d", "cost": 3}),
]
STACK_IDS = ["shadow-tighter", "shadow-looser", "bucket-vs-window", "enforced-zero",
             "shadow-zero", "shadow-cost"]
N = 8


def stack_settings(enf: dict[str, Any], sh: dict[str, Any], **extra: Any) -> override_settings:
    return redislua(policy_enf={**enf, "key": WHO}, policy_sh={**sh, "key": WHO, "mode": "shadow"},
                    **extra)


def reference_shadow(who: str) -> tuple[list[bool], Decision]:
    """The shadow policy hit N times on its own (Python API): what it decides alone."""
    policy = get_policy("sh")
    allowed = [policy.hit(who).allowed for _ in range(N)]
    return allowed, policy.peek(who)


def body_of(response: Any) -> dict[str, Any] | None:
    """What the view saw (None for a 429: the view did not run)."""
    if response.status_code != 200:
        return None
    data = getattr(response, "data", None)
    return data if data is not None else json.loads(response.content)


def assert_stack_parity(baseline: Sequence[Any], stacked: Sequence[Any]) -> None:
    """Baseline (identity "base", the enforced rule alone) against the stack (identity "stk",
    the enforced rule plus the shadow one), N requests each."""
    # The enforced rule admits exactly what it admits alone, and ends in the same state.
    assert [r.status_code for r in stacked] == [r.status_code for r in baseline]
    assert [r.has_header("Retry-After") for r in stacked] == [
        r.has_header("Retry-After") for r in baseline]
    enf = get_policy("enf")
    base_peek, stk_peek = enf.peek("base"), enf.peek("stk")
    assert (stk_peek.allowed, stk_peek.remaining) == (base_peek.allowed, base_peek.remaining)
    # The shadow rule decided (and consumed) as it does alone, whatever the enforced one said.
    ref_allowed, ref_peek = reference_shadow("ref")
    sh_peek = get_policy("sh").peek("stk")
    assert (sh_peek.allowed, sh_peek.remaining) == (ref_peek.allowed, ref_peek.remaining)
    for i, response in enumerate(stacked):
        assert '"sh"' not in response.get("RateLimit-Policy", "")
        assert not response.has_header("Retry-After") or response.status_code == 429
        body = body_of(response)
        if body is None:
            continue
        assert [e[0] for e in body["enforced"]] == ["enf"]
        assert body["shadow"] == [["sh", ref_allowed[i], True]]
        assert body.get("limited") in (False, None)


@pytest.mark.parametrize(("enf", "sh"), STACKS, ids=STACK_IDS)
@pytest.mark.parametrize("url", ["/stack-outer/", "/stack-inner/"])
def test_decorator_stack_shadow_never_changes_the_enforced_outcome(
    client: Client, url: str, enf: dict[str, Any], sh: dict[str, Any]
) -> None:
    with stack_settings(enf, sh):
        baseline = [client.get("/enforced-only/", headers={"x-who": "base"}) for _ in range(N)]
        stacked = [client.get(url, headers={"x-who": "stk"}) for _ in range(N)]
        assert_stack_parity(baseline, stacked)


@pytest.mark.parametrize(("enf", "sh"), STACKS, ids=STACK_IDS)
async def test_async_decorator_stack_shadow_never_changes_the_enforced_outcome(
    enf: dict[str, Any], sh: dict[str, Any]
) -> None:
    client = AsyncClient()
    with stack_settings(enf, sh):
        baseline = [await client.get("/aenforced-only/", headers={"x-who": "base"})
                    for _ in range(N)]
        stacked = [await client.get("/astack/", headers={"x-who": "stk"}) for _ in range(N)]
        assert_stack_parity(baseline, stacked)


def _sync_ok(request: HttpRequest) -> HttpResponse:
    return _state(request)


async def _async_ok(request: HttpRequest) -> HttpResponse:
    return _state(request)


def middleware_rules(*names: str) -> list[dict[str, str]]:
    return [{"path": "/api/", "policy": name} for name in names]


ORDERS = [("sh", "enf"), ("enf", "sh")]


@pytest.mark.parametrize(("enf", "sh"), STACKS, ids=STACK_IDS)
@pytest.mark.parametrize("order", ORDERS, ids=["shadow-first", "shadow-last"])
def test_sync_middleware_stack_shadow_never_changes_the_enforced_outcome(
    enf: dict[str, Any], sh: dict[str, Any], order: tuple[str, str]
) -> None:
    middleware = RateLimitMiddleware(_sync_ok)
    assert not middleware.is_async
    rf = RequestFactory()

    def run(who: str) -> list[HttpResponseBase]:
        return [middleware(rf.get("/api/x", headers={"x-who": who})) for _ in range(N)]

    with stack_settings(enf, sh, MIDDLEWARE_POLICIES=middleware_rules("enf")):
        baseline = run("base")
    with stack_settings(enf, sh, MIDDLEWARE_POLICIES=middleware_rules(*order)):
        stacked = run("stk")
        assert_stack_parity(baseline, stacked)


@pytest.mark.parametrize(("enf", "sh"), STACKS, ids=STACK_IDS)
@pytest.mark.parametrize("order", ORDERS, ids=["shadow-first", "shadow-last"])
async def test_async_middleware_stack_shadow_never_changes_the_enforced_outcome(
    enf: dict[str, Any], sh: dict[str, Any], order: tuple[str, str]
) -> None:
    middleware = RateLimitMiddleware(_async_ok)
    assert middleware.is_async
    rf = AsyncRequestFactory()

    async def run(who: str) -> list[HttpResponseBase]:
        return [await middleware(rf.get("/api/x", headers={"x-who": who})) for _ in range(N)]

    with stack_settings(enf, sh, MIDDLEWARE_POLICIES=middleware_rules("enf")):
        baseline = await run("base")
    with stack_settings(enf, sh, MIDDLEWARE_POLICIES=middleware_rules(*order)):
        stacked = await run("stk")
        assert_stack_parity(baseline, stacked)


@pytest.mark.parametrize(("enf", "sh"), STACKS, ids=STACK_IDS)
@pytest.mark.parametrize("order", ORDERS, ids=["shadow-first", "shadow-last"])
def test_policy_throttle_list_shadow_never_changes_the_enforced_outcome(
    enf: dict[str, Any], sh: dict[str, Any], order: tuple[str, str]
) -> None:
    with stack_settings(enf, sh):
        baseline_view = api_view(drf.PolicyThrottle, throttle_policy=["enf"])
        stacked_view = api_view(drf.PolicyThrottle, throttle_policy=list(order))
        baseline = [api_call(baseline_view, "base") for _ in range(N)]
        stacked = [api_call(stacked_view, "stk") for _ in range(N)]
        assert_stack_parity(baseline, stacked)


# -- shadow on the middleware and DRF paths, end to end ----------------------------------------
@override_settings(MIDDLEWARE=WITH_MIDDLEWARE)
def test_middleware_shadow_end_to_end(
    client: Client, signals: Signals, caplog: pytest.LogCaptureFixture
) -> None:
    with redislua(MIDDLEWARE_POLICIES=middleware_rules("sh")), \
            caplog.at_level(logging.INFO, logger="django_redislua"):
        responses = [client.get("/api/plain/", headers={"x-who": "a"}) for _ in range(8)]
    assert_shadow_run(responses, signals, caplog, RateLimitMiddleware)
    assert_counted_like_enforced("a")
    with redislua(policy_sh=mode("sh", "enforce"), MIDDLEWARE_POLICIES=middleware_rules("sh")):
        assert client.get("/api/plain/", headers={"x-who": "a"}).status_code == 429


@override_settings(MIDDLEWARE=WITH_MIDDLEWARE)
async def test_async_middleware_shadow_end_to_end(
    signals: Signals, caplog: pytest.LogCaptureFixture
) -> None:
    client = AsyncClient()
    with redislua(MIDDLEWARE_POLICIES=middleware_rules("sh")), \
            caplog.at_level(logging.INFO, logger="django_redislua"):
        responses = [await client.get("/api/plain/", headers={"x-who": "a"}) for _ in range(8)]
    assert_shadow_run(responses, signals, caplog, RateLimitMiddleware)
    assert_counted_like_enforced("a")


def test_policy_throttle_shadow_end_to_end(
    signals: Signals, caplog: pytest.LogCaptureFixture
) -> None:
    view = api_view(drf.PolicyThrottle, throttle_policy="sh")
    with caplog.at_level(logging.INFO, logger="django_redislua"):
        responses = [api_call(view) for _ in range(8)]
    assert [r.status_code for r in responses] == [200] * 8
    assert [rate_headers(r) for r in responses] == [[]] * 8
    assert [r.data["shadow"] for r in responses] == [[["sh", i < 2, True]] for i in range(8)]
    assert [r.data["enforced"] for r in responses] == [[]] * 8
    assert signals.seen == [(drf.PolicyThrottle, "sh", False, True)] * 6
    assert len(shadow_lines(caplog, "sh")) == 1
    assert_counted_like_enforced("a")
    with redislua(policy_sh=mode("sh", "enforce")):
        denied = api_call(view)
        assert denied.status_code == 429 and float(denied["Retry-After"]) >= 1


def shadow_rate(request: HttpRequest) -> str | None:
    """A rate callable: unlimited for X-Who "vip", else 1/d."""
    return None if request.META.get("HTTP_X_WHO") == "vip" else "1/d"


@override_settings(MIDDLEWARE=WITH_MIDDLEWARE)
def test_shadow_with_a_rate_callable_and_middleware_plus_decorator(client: Client) -> None:
    """A per-request rate keeps the policy's mode; the middleware's and the decorator's shadow
    Decisions both land on request.ratelimit_shadow, and neither blocks."""
    dynamic = {"rate": "tests.test_shadow_enabled.shadow_rate", "key": WHO, "mode": "shadow"}
    with redislua(policy_sh2=dynamic, MIDDLEWARE_POLICIES=[{"path": "/shadow/", "policy": "sh2"}]):
        responses = [client.get("/shadow/", headers={"x-who": "a"}) for _ in range(4)]
        vip = client.get("/shadow/", headers={"x-who": "vip"})
    assert [r.status_code for r in responses] == [200] * 4
    assert [rate_headers(r) for r in responses] == [[]] * 4
    assert [r.json()["shadow"] for r in responses] == [
        [["sh2", i < 1, True], ["sh", i < 2, True]] for i in range(4)]
    assert [r.json()["enforced"] for r in responses] == [[]] * 4
    assert vip.json()["shadow"] == [["sh", True, True]]  # the callable said: unlimited


# -- a shadow concurrency policy: its slot must be given back like an enforced one's -----------
def test_policy_throttle_shadow_concurrency_slot_is_released(r: redis.Redis) -> None:
    view = api_view(drf.PolicyThrottle, throttle_policy="sh-slot")
    responses = [api_call(view) for _ in range(3)]
    assert [r_.data["shadow"] for r_ in responses] == [[["sh-slot", True, True]]] * 3
    assert r.zcard(get_policy("sh-slot").redis_key("a")) == 0


def test_policy_throttle_shadow_slot_taken_beside_a_denying_policy_is_released(
    r: redis.Redis,
) -> None:
    """The enforced policy denies every request (0/d); the shadow concurrency policy still
    takes its slot each time (it consumes whenever it allows), so it must give it back."""
    with redislua(policy_enf={"algorithm": "fixed_window", "rate": "0/d", "key": WHO}):
        view = api_view(drf.PolicyThrottle, throttle_policy=["enf", "sh-slot"])
        assert [api_call(view).status_code for _ in range(3)] == [429] * 3
    assert r.zcard(get_policy("sh-slot").redis_key("a")) == 0
    assert get_policy("sh-slot").peek("a").allowed


def test_enforced_concurrency_slot_is_released_by_the_decorator(
    client: Client, r: redis.Redis
) -> None:
    """The reference for the shadow tests below: the same policy enforced gives its slot back."""
    with redislua(policy_sh_slot=mode("sh-slot", "enforce")):
        codes = [client.get("/slot/", headers={"x-who": "a"}).status_code for _ in range(3)]
    assert codes == [200] * 3
    assert r.zcard(get_policy("sh-slot").redis_key("a")) == 0


def test_decorator_shadow_concurrency_slot_is_released(client: Client, r: redis.Redis) -> None:
    responses = [client.get("/slot/", headers={"x-who": "a"}) for _ in range(3)]
    assert [resp.status_code for resp in responses] == [200] * 3
    # Enforced, each request takes the one slot and gives it back: all three are allowed.
    assert [resp.json()["shadow"] for resp in responses] == [[["sh-slot", True, True]]] * 3
    assert r.zcard(get_policy("sh-slot").redis_key("a")) == 0


async def test_async_decorator_shadow_concurrency_slot_is_released(r: redis.Redis) -> None:
    client = AsyncClient()
    responses = [await client.get("/aslot/", headers={"x-who": "a"}) for _ in range(3)]
    assert [resp.json()["shadow"] for resp in responses] == [[["sh-slot", True, True]]] * 3
    assert r.zcard(get_policy("sh-slot").redis_key("a")) == 0


def test_middleware_shadow_concurrency_slot_is_released(r: redis.Redis) -> None:
    middleware = RateLimitMiddleware(_sync_ok)
    rf = RequestFactory()
    with redislua(MIDDLEWARE_POLICIES=middleware_rules("sh-slot")):
        responses = [middleware(rf.get("/api/x", headers={"x-who": "a"})) for _ in range(3)]
    assert [json.loads(resp.content)["shadow"] for resp in responses] == [
        [["sh-slot", True, True]]] * 3
    assert r.zcard(get_policy("sh-slot").redis_key("a")) == 0


def test_decorator_shadow_slot_taken_beside_a_denying_policy_is_released(
    client: Client, r: redis.Redis
) -> None:
    """As test_policy_throttle_shadow_slot_taken_beside_a_denying_policy_is_released: the
    enforced policy denies everything, the shadow slot is taken and must be freed."""
    with redislua(policy_enf={"algorithm": "fixed_window", "rate": "0/d", "key": WHO}):
        codes = [client.get("/stack-slot/", headers={"x-who": "a"}).status_code
                 for _ in range(3)]
    assert codes == [429] * 3
    assert r.zcard(get_policy("sh-slot").redis_key("a")) == 0


async def test_async_middleware_shadow_slot_taken_beside_a_denying_policy_is_released(
    r: redis.Redis,
) -> None:
    middleware = RateLimitMiddleware(_async_ok)
    rules = middleware_rules("enf", "sh-slot")
    with redislua(policy_enf={"algorithm": "fixed_window", "rate": "0/d", "key": WHO},
                  MIDDLEWARE_POLICIES=rules):
        responses = [await middleware(AsyncRequestFactory().get("/api/x", headers={"x-who": "a"}))
                     for _ in range(3)]
    assert [resp.status_code for resp in responses] == [429] * 3
    assert r.zcard(get_policy("sh-slot").redis_key("a")) == 0


# =================================================================================================
# 3. ENABLED = False: no Redis command, no key function, no header, no 503
# =================================================================================================
def disabled() -> override_settings:
    return redislua(ENABLED=False, FAIL_OPEN=False)


def assert_admitted_quietly(responses: Sequence[Any], recorder: CommandRecorder) -> None:
    assert [r.status_code for r in responses] == [200] * len(responses)
    assert [rate_headers(r) for r in responses] == [[]] * len(responses)
    assert recorder.commands == []
    assert KEY_CALLS == []


SYNC_URLS = ["/counted/", "/counted-cbv/", "/raising/", "/broken/", "/shadow/", "/stack-outer/",
             "/compat/"]
ASYNC_URLS = ["/acounted/", "/acounted-cbv/", "/araising/", "/abroken/", "/ashadow/",
              "/astack/", "/acompat/"]


def test_disabled_sync_decorators_send_nothing(client: Client, recorder: CommandRecorder) -> None:
    with override_settings(MIDDLEWARE=WITH_MIDDLEWARE), \
            redislua(ENABLED=False, FAIL_OPEN=False,
                     MIDDLEWARE_POLICIES=[{"path": "/", "policy": "counted"},
                                          {"path": "/", "policy": "no-such-policy"}]), \
            recorder:
        responses = [client.get(url, headers={"x-who": "a"}) for url in SYNC_URLS for _ in range(4)]
    assert_admitted_quietly(responses, recorder)
    for response in responses:
        assert response.wsgi_request.__dict__.get("ratelimit_shadow") is None


async def test_disabled_async_decorators_send_nothing(recorder: CommandRecorder) -> None:
    client = AsyncClient()
    with override_settings(MIDDLEWARE=WITH_MIDDLEWARE), \
            redislua(ENABLED=False, FAIL_OPEN=False,
                     MIDDLEWARE_POLICIES=[{"path": "/", "policy": "counted"},
                                          {"path": "/", "policy": "no-such-policy"}]), \
            recorder:
        responses = [await client.get(url, headers={"x-who": "a"})
                     for url in ASYNC_URLS for _ in range(4)]
    assert_admitted_quietly(responses, recorder)


def test_disabled_middleware_sync_and_async_get_response_send_nothing(
    recorder: CommandRecorder,
) -> None:
    sync_mw, async_mw = RateLimitMiddleware(_sync_ok), RateLimitMiddleware(_async_ok)
    rules = middleware_rules("counted", "sh", "enf", "no-such-policy")
    with redislua(ENABLED=False, FAIL_OPEN=False, MIDDLEWARE_POLICIES=rules), recorder:
        responses = [sync_mw(RequestFactory().get("/api/x", headers={"x-who": "a"}))
                     for _ in range(5)]
        responses += [asyncio.run(async_mw(AsyncRequestFactory().get("/api/x")))
                      for _ in range(5)]
    assert_admitted_quietly(responses, recorder)


def test_disabled_drf_global_and_policy_throttles_send_nothing(
    recorder: CommandRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    for cls in (drf.AnonRateThrottle, drf.UserRateThrottle):
        original = cls.get_cache_key

        def counting(self: Any, request: Any, view: Any, _original: Any = original) -> Any:
            KEY_CALLS.append("drf")
            return _original(self, request, view)

        monkeypatch.setattr(cls, "get_cache_key", counting)
    global_view = api_view()  # DEFAULT_THROTTLE_CLASSES: this app's Anon and User throttles
    assert {type(t) for t in global_view.cls().get_throttles()} == {
        drf.AnonRateThrottle, drf.UserRateThrottle}
    policy_view = api_view(drf.PolicyThrottle, throttle_policy=["counted", "sh", "no-such-policy"])
    scoped_view = api_view(drf.ScopedRateThrottle, throttle_scope="nope")  # no rate: broken
    rates = {"DEFAULT_THROTTLE_RATES": {"anon": "1/d", "user": "1/d"}}
    with override_settings(REST_FRAMEWORK=rates), \
            redislua(ENABLED=False, FAIL_OPEN=False), recorder:
        responses = [api_call(global_view) for _ in range(3)]
        responses += [api_call(global_view, user=ALICE) for _ in range(3)]
        responses += [api_call(policy_view) for _ in range(3)]
        responses += [api_call(scoped_view) for _ in range(3)]
    assert_admitted_quietly(responses, recorder)
    with override_settings(REST_FRAMEWORK=rates):
        # Switched back on: limits apply, starting from nothing (the disabled requests left no
        # trace), and the broken rules answer 503 again with FAIL_OPEN off.
        assert [api_call(global_view).status_code for _ in range(2)] == [200, 429]
        assert [api_call(global_view, user=ALICE).status_code for _ in range(2)] == [200, 429]
        assert KEY_CALLS
        with redislua(FAIL_OPEN=False):
            assert api_call(policy_view).status_code == 503
            assert api_call(scoped_view).status_code == 503
        counted_view = api_view(drf.PolicyThrottle, throttle_policy="counted")
        assert [api_call(counted_view).status_code for _ in range(2)] == [200, 429]


def test_disabled_then_enabled_again_limits_from_a_clean_state(client: Client) -> None:
    with disabled():
        assert [client.get("/counted/").status_code for _ in range(5)] == [200] * 5
        assert [client.get("/compat/").status_code for _ in range(5)] == [200] * 5
    assert KEY_CALLS == []
    # On again: the first request is the first counted one.
    assert [client.get("/counted/").status_code for _ in range(2)] == [200, 429]
    assert [client.get("/compat/").status_code for _ in range(2)] == [200, 403]
    assert KEY_CALLS  # the key functions run again
    with redislua(FAIL_OPEN=False):
        assert client.get("/broken/").status_code == 503


async def test_disabled_then_enabled_again_async() -> None:
    client = AsyncClient()
    with disabled():
        assert [(await client.get("/acounted/")).status_code for _ in range(5)] == [200] * 5
        assert [(await client.get("/acompat/")).status_code for _ in range(5)] == [200] * 5
        # The asyncio Python API still decides.
        policy = get_policy("enf")
        assert [(await policy.ahit("apy")).allowed for _ in range(6)] == [True] * 5 + [False]
    assert KEY_CALLS == []
    assert [(await client.get("/acounted/")).status_code for _ in range(2)] == [200, 429]
    with redislua(FAIL_OPEN=False):
        assert (await client.get("/abroken/")).status_code == 503


def test_disabled_python_api_still_decides(recorder: CommandRecorder) -> None:
    with disabled():
        policy = get_policy("enf")
        with recorder:
            decisions = [policy.hit("py") for _ in range(6)]
        assert [d.allowed for d in decisions] == [True] * 5 + [False]
        assert recorder.commands  # it did ask Redis
        assert policy.peek("py").remaining == 0
        shadow = get_policy("sh")
        assert [shadow.hit("py").allowed for _ in range(3)] == [True, True, False]


def test_disabled_leaves_no_redis_key_behind(client: Client, r: redis.Redis) -> None:
    with disabled():
        for url in ("/shadow/", "/counted/", "/stack-outer/", "/compat/"):
            for _ in range(3):
                client.get(url, headers={"x-who": "a"})
    assert r.dbsize() == 0


# =================================================================================================
# 4. System checks
# =================================================================================================
def check_ids(**redislua_settings: Any) -> list[str]:
    with override_settings(REDISLUA=redislua_settings):
        return [m.id for m in check_settings()]


@pytest.mark.parametrize("value", ["dry-run", "Shadow", "SHADOW", "enforced", "", None, True])
def test_e026_a_mode_that_is_neither_enforce_nor_shadow(value: Any) -> None:
    policies = {"p": {"rate": "5/m", "mode": value}}
    assert check_ids(CONNECTION="default", POLICIES=policies) == ["redislua.E026"]


@pytest.mark.parametrize("value", ["shadow", "enforce"])
def test_valid_modes_have_no_messages(value: str) -> None:
    policies = {"p": {"rate": "5/m", "mode": value}}
    assert check_ids(CONNECTION="default", POLICIES=policies) == []


def test_e026_names_the_policy_and_reaches_manage_py_check() -> None:
    bad = {"POLICIES": {"p": {"rate": "5/m", "mode": "dry-run"}}}
    with override_settings(REDISLUA=bad):
        [message] = check_settings()
        assert "'p'" in message.msg and "'dry-run'" in message.msg
        with pytest.raises(SystemCheckError, match=r"redislua\.E026"):
            call_command("check", stdout=StringIO(), stderr=StringIO())


@pytest.mark.parametrize("value", ["no", "False", 0, 1, None, "true"])
def test_e024_enabled_not_a_bool(value: Any) -> None:
    assert check_ids(CONNECTION="default", ENABLED=value) == ["redislua.E024"]


@pytest.mark.parametrize("value", [True, False])
def test_enabled_bools_have_no_messages(value: bool) -> None:
    assert check_ids(CONNECTION="default", ENABLED=value) == []


def test_e024_names_enabled() -> None:
    with override_settings(REDISLUA={"ENABLED": "no"}):
        [message] = check_settings()
    assert message.id == "redislua.E024" and "ENABLED" in message.msg


@pytest.mark.parametrize(("fail_open", "status"), [(True, 200), (False, 503)])
def test_an_invalid_mode_at_request_time_meets_the_fail_open_guard(
    client: Client, fail_open: bool, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    with redislua(policy_sh=mode("sh", "dry-run"), FAIL_OPEN=fail_open), \
            caplog.at_level(logging.ERROR, logger="django_redislua"):
        assert [client.get("/shadow/", headers={"x-who": "a"}).status_code
                for _ in range(3)] == [status] * 3
        view = api_view(drf.PolicyThrottle, throttle_policy="sh")
        assert api_call(view).status_code == status
    assert "redislua.E026" in caplog.text


# =================================================================================================
# 5. The admin page shows each policy's mode
# =================================================================================================
def _row_mode(page: str, name: str) -> str:
    match = re.search(
        r'<th scope="row"><a href="\?policy=' + re.escape(name) + r'">' + re.escape(name)
        + r"</a></th>\s*<td>[^<]*</td><td>(.*?)</td>", page, re.S)
    assert match, f"no row for {name!r}"
    return re.sub(r"<[^>]+>", "", match.group(1)).strip()


@pytest.mark.django_db
@pytest.mark.urls("tests.testapp.admin_urls")
def test_admin_policies_table_shows_each_mode() -> None:
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(
        content_type__app_label="django_redislua", codename="view_redislua"))
    client = Client()
    client.force_login(user)
    response = client.get("/admin/django_redislua/redislua/")
    assert response.status_code == 200
    modes = {row["name"]: row.get("mode") for row in response.context["policies"]}
    assert modes["sh"] == modes["sh2"] == modes["sh-slot"] == "shadow"
    assert modes["enf"] == modes["login"] == modes["api"] == "enforce"
    page = response.content.decode()
    assert "<th scope=\"col\">Mode</th>" in page
    assert _row_mode(page, "sh") == "shadow" and 'class="redislua-shadow"' in page
    assert _row_mode(page, "enf") == "enforce"
    assert _row_mode(page, "login") == "enforce"
    with redislua(policy_sh=mode("sh", "enforce")):
        page = client.get("/admin/django_redislua/redislua/").content.decode()
    assert _row_mode(page, "sh") == "enforce"
    assert _row_mode(page, "sh2") == "shadow"



# =================================================================================================
# A shadow rule never refuses a request, not even with 503 (FAIL_OPEN = False)
# =================================================================================================
DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1: connection refused at once


def shadow_rate_garbage(request: HttpRequest) -> Any:
    return 42  # not a rate: the rule cannot be used (redislua.E006 at request time)


@pytest.mark.parametrize("path", ["/shadow/", "/ashadow/"])
def test_shadow_only_view_is_served_when_redis_is_down_and_fail_open_is_off(
    path: str, client: Client
) -> None:
    with redislua(CONNECTION=DEAD_REDIS, FAIL_OPEN=False):
        responses = [client.get(path, headers={"x-who": "down"}) for _ in range(3)]
    assert [resp.status_code for resp in responses] == [200] * 3
    assert [rate_headers(resp) for resp in responses] == [[]] * 3


def test_enforced_beside_shadow_still_answers_503_when_redis_is_down(client: Client) -> None:
    with redislua(CONNECTION=DEAD_REDIS, FAIL_OPEN=False):
        response = client.get("/stack-outer/", headers={"x-who": "down"})
    assert response.status_code == 503


def test_shadow_only_throttle_admits_when_redis_is_down_and_fail_open_is_off() -> None:
    view = api_view(drf.PolicyThrottle, throttle_policy="sh")
    with redislua(CONNECTION=DEAD_REDIS, FAIL_OPEN=False):
        assert [api_call(view, who="down").status_code for _ in range(3)] == [200] * 3


def test_broken_shadow_rule_never_answers_503(client: Client, r: redis.Redis) -> None:
    broken_shadow = {"algorithm": "sliding_log", "key": WHO, "mode": "shadow",
                     "rate": "tests.test_shadow_enabled.shadow_rate_garbage"}
    with redislua(policy_sh=broken_shadow, FAIL_OPEN=False):
        assert client.get("/shadow/", headers={"x-who": "b"}).status_code == 200
        # beside an enforced rule, that rule still decides (and limits)
        codes = [client.get("/stack-outer/", headers={"x-who": "b"}).status_code
                 for _ in range(6)]
    assert codes == [200] * 5 + [429]
