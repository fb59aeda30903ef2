"""Logins that count only failures (``count_failures``, issue 35) on every layer: the decorator
(a sync and an ``async def`` view), the middleware and DRF's PolicyThrottle, each stacked with a
per-address policy that counts every attempt; Django's own LoginView; served to
tests/test_count_failures.py (ROOT_URLCONF = "tests.testapp.failures_views", POLICIES below).

A login answers 200 for alice's right password and 401 for anything else; the password
"boom" makes the view raise, "crash" answer 500. Every view counts its calls (``calls``) and
runs ``during_view``'s callables first (a test stops Redis there: between the decision and
the refund).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislua.decorators import ratelimit
from django_redislua.drf import PolicyThrottle

BUDGET = 3
POLICIES: dict[str, dict[str, Any]] = {
    "failures": {"algorithm": "sliding_log", "rate": f"{BUDGET}/15m", "key": "post:username",
                 "methods": ["POST"], "count_failures": [401]},
    "per-ip": {"algorithm": "sliding_log", "rate": "40/15m", "key": "ip", "methods": ["POST"]},
    # Django's LoginView renders its form again (200) for wrong credentials, redirects (302)
    # on success.
    "django-login": {"algorithm": "sliding_log", "rate": f"{BUDGET}/15m",
                     "key": "post:username", "methods": ["POST"], "count_failures": [200]},
    # Decided and stored, but never refusing: shadow, and block=False.
    "shadow": {"algorithm": "gcra", "rate": f"{BUDGET}/15m", "key": "post:username",
               "methods": ["POST"], "count_failures": True, "mode": "shadow"},
    "marking": {"algorithm": "fixed_window", "rate": f"{BUDGET}/15m", "key": "post:username",
                "methods": ["POST"], "count_failures": True, "block": False},
}
MIDDLEWARE_POLICIES = [{"path": "/mw/", "policy": "failures"},
                       {"path": "/mw/", "policy": "per-ip"}]

calls: Counter[str] = Counter()
_calls_lock = threading.Lock()
during_view: list[Callable[[], object]] = []


def status_for(data: Mapping[str, Any]) -> int:
    password = data.get("password")
    if password == "boom":
        raise RuntimeError("the login view failed")
    if password == "crash":
        return 500
    return 200 if data.get("username") == "alice" and password == "right" else 401


def _entered(name: str) -> None:
    with _calls_lock:
        calls[name] += 1
    for step in during_view:
        step()


def login(request: HttpRequest) -> HttpResponse:
    _entered(request.path)
    return HttpResponse(status=status_for(request.POST))


async def alogin(request: HttpRequest) -> HttpResponse:
    _entered(request.path)
    return HttpResponse(status=status_for(request.POST))


class DRFLogin(APIView):
    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    throttle_classes = [PolicyThrottle]
    throttle_policy = ["failures", "per-ip"]

    def post(self, request: Request) -> Response:
        _entered(request.path)
        return Response(status=status_for(request.data))


def django_login(request: HttpRequest) -> Any:
    _entered(request.path)
    return LoginView.as_view(template_name="admin/login.html")(request)


def limited(view: Callable[..., Any], *names: str) -> Callable[..., Any]:
    for name in reversed(names):
        view = ratelimit(name)(view)
    return csrf_exempt(view)


urlpatterns = [
    path("admin/", admin.site.urls),  # (the login form's template links to it)
    path("deco/login/", limited(login, "failures", "per-ip")),
    path("adeco/login/", limited(alogin, "failures", "per-ip")),
    path("mw/login/", csrf_exempt(login)),
    path("drf/login/", DRFLogin.as_view()),
    path("deco/django-login/", limited(django_login, "django-login")),
    path("deco/soft/", limited(login, "shadow", "marking")),
    path("deco/inline/", csrf_exempt(ratelimit(
        rate="3/15m", key="post:username", algorithm="token_bucket", methods=["POST"],
        count_failures=lambda request, response: response.status_code == 401,
    )(login))),
]
