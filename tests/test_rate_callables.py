"""A rate callable's mistakes never make a limit unlimited (issue 35).

A callable ``rate`` (per-plan rates) that returns something that is not a rate, or raises, is
decided at the policy's ``fallback_rate``; without one the request is answered 503, whatever
``FAIL_OPEN`` says (it is about Redis, not about the project's own code). The ERROR line names
the policy, the callable and what it did, once a minute. Before: a garbage rate admitted every
request (the FAIL_OPEN path), and a raising one was a 500.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory, override_settings
from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislua.checks import check_settings
from django_redislua.decorators import ratelimit
from django_redislua.drf import PolicyThrottle
from django_redislua.limiting import Policy, PolicyError
from tests.settings import MIDDLEWARE, REDISLUA

pytestmark = pytest.mark.urls("tests.test_rate_callables")
HERE = "tests.test_rate_callables"


def garbage(request: HttpRequest) -> object:
    return "100 per hour"  # the issue's own example


def not_text(request: HttpRequest) -> object:
    return 100


def raising(request: HttpRequest) -> str:
    raise KeyError("plan 'enterprise-2'")


def plans(request: HttpRequest) -> str | None:
    return None if request.GET.get("plan") == "staff" else "3/m"


CALLABLES = {"garbage": garbage, "not_text": not_text, "raising": raising}


def policies(fallback: str | None = None, mode: str = "enforce") -> dict[str, Any]:
    extra = {} if fallback is None else {"fallback_rate": fallback}
    return {f"per-plan-{name}": {"rate": f"{HERE}.{name}", "key": "ip", "mode": mode, **extra}
            for name in CALLABLES}


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def drf_view(policy: str) -> Any:
    class View(APIView):
        authentication_classes: list[type] = []
        permission_classes: list[type] = []
        throttle_classes = [PolicyThrottle]
        throttle_policy = policy

        def get(self, request: Request) -> Response:
            return Response({"ok": True})

    return View.as_view()


urlpatterns = []
for _name in CALLABLES:
    urlpatterns += [
        path(f"deco/{_name}/", ratelimit(f"per-plan-{_name}")(ok)),
        path(f"mw/{_name}/", ok),
        path(f"drf/{_name}/", drf_view(f"per-plan-{_name}")),
    ]
LAYERS = ("deco", "mw", "drf")


@pytest.fixture
def configured() -> Iterator[Any]:
    def configure(**options: Any) -> override_settings:
        return override_settings(
            MIDDLEWARE=[*MIDDLEWARE, "django_redislua.middleware.RateLimitMiddleware"],
            REDISLUA={**REDISLUA, "POLICIES": policies(**options), "FAIL_OPEN": True,
                      "MIDDLEWARE_POLICIES": [{"path": f"/mw/{n}/", "policy": f"per-plan-{n}"}
                                              for n in CALLABLES]},
        )
    yield configure


def statuses(url: str, n: int) -> list[int]:
    client = Client(raise_request_exception=True)  # a 500 would raise here
    return [client.get(url).status_code for _ in range(n)]


@pytest.mark.parametrize("name", CALLABLES)
@pytest.mark.parametrize("layer", LAYERS)
def test_a_broken_rate_callable_is_answered_503_even_failing_open(
    configured: Any, layer: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with configured(), caplog.at_level("ERROR", logger="django_redislua"):
        assert statuses(f"/{layer}/{name}/", 3) == [503] * 3
    lines = [r for r in caplog.records if r.name == "django_redislua"]
    assert len(lines) == 1, [r.getMessage() for r in lines]  # once a minute, not per request
    message = lines[0].getMessage()
    assert f"policy 'per-plan-{name}'" in message
    assert f"{HERE}.{name}" in message  # the callable
    assert {"garbage": "'100 per hour'", "not_text": "returned 100",
            "raising": "KeyError"}[name] in message  # what it did
    assert "fallback_rate" in message  # and how to make it decide instead
    assert bool(lines[0].exc_info) == (name == "raising")  # its traceback


@pytest.mark.parametrize("name", CALLABLES)
@pytest.mark.parametrize("layer", LAYERS)
def test_with_a_fallback_rate_it_is_decided_at_that_rate(
    configured: Any, layer: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    with configured(fallback="2/m"), caplog.at_level("ERROR", logger="django_redislua"):
        assert statuses(f"/{layer}/{name}/", 3) == [200, 200, 429]
    message = next(r.getMessage() for r in caplog.records if r.name == "django_redislua")
    assert "decided at its fallback_rate '2/m'" in message


@pytest.mark.parametrize("layer", LAYERS)
def test_a_shadow_policy_with_a_broken_callable_never_refuses(configured: Any,
                                                              layer: str) -> None:
    with configured(mode="shadow"):
        assert statuses(f"/{layer}/raising/", 3) == [200] * 3


def test_a_working_callable_is_unchanged() -> None:
    policy = Policy("plans", rate=plans, algorithm="fixed_window", fallback_rate="1/m")
    rf = RequestFactory()
    assert policy.resolved_for(rf.get("/", {"plan": "staff"})) is None
    resolved = policy.resolved_for(rf.get("/"))
    assert resolved is not None and resolved.limit == 3


@pytest.mark.parametrize(("options", "text"), [
    ({"rate": f"{HERE}.plans", "fallback_rate": "often"}, "often"),
    ({"rate": f"{HERE}.plans", "fallback_rate": "5/x"}, "unknown time unit"),
    ({"rate": "5/m", "fallback_rate": "1/m"}, "not a callable"),
])
def test_a_bad_fallback_rate_is_a_system_check(options: dict[str, Any], text: str) -> None:
    with override_settings(REDISLUA={**REDISLUA, "POLICIES": {"p": options}}):
        found = [m for m in check_settings() if m.id == "redislua.E006"]
    assert found and text in found[0].msg, found
    with pytest.raises(PolicyError):
        Policy("p", **options)
