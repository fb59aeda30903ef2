"""A login (and keyed endpoints) on every layer that reads a request value for a key: the
decorator, the middleware, a DRF throttle, compat (tests/test_request_values.py), served by the
test client and by gunicorn (ROOT_URLCONF = "tests.testapp.login_views", POLICIES below).

Every login answers 401 for wrong credentials and 200 for the right ones, reading them from a
form or a JSON body (DRF: ``request.data``), as a team's login would.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_redislua.compat.ratelimit import ratelimit as compat_ratelimit
from django_redislua.decorators import ratelimit
from django_redislua.drf import PolicyThrottle
from tests.testapp.login_policies import KEY_SPECS, MIDDLEWARE_POLICIES, POLICIES, RATE

__all__ = ["MIDDLEWARE_POLICIES", "POLICIES", "RATE", "urlpatterns"]

def credentials(request: HttpRequest) -> dict[str, Any]:
    """The posted credentials: a form, or a JSON object body (what the plain views accept)."""
    if request.content_type == "application/json":
        try:
            data = json.loads(request.body)
        except (ValueError, RecursionError):
            return {}
        return data if isinstance(data, dict) else {}
    return dict(request.POST.items())


def answer(data: Any) -> int:
    ok = data.get("username") == "alice" and data.get("password") == "right"
    return 200 if ok else 401


@csrf_exempt
def plain_login(request: HttpRequest) -> HttpResponse:
    return HttpResponse(status=answer(credentials(request)))


@csrf_exempt
def plain_endpoint(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class DRFLogin(APIView):
    authentication_classes: list[type] = []
    permission_classes: list[type] = []
    throttle_classes = [PolicyThrottle]
    throttle_policy = "login-user"

    def post(self, request: Request) -> Response:
        data = request.data if hasattr(request.data, "get") else {}
        return Response(status=answer(data))


def drf_endpoint(policy: str) -> Any:
    class Endpoint(APIView):
        authentication_classes: list[type] = []
        permission_classes: list[type] = []
        throttle_classes = [PolicyThrottle]
        throttle_policy = policy

        def get(self, request: Request) -> Response:
            return Response({"ok": True})

        def post(self, request: Request) -> Response:
            return Response({"ok": True})

    return Endpoint.as_view()


def compat_endpoint(spec: str) -> Any:
    @csrf_exempt
    @compat_ratelimit(key=spec, rate=RATE, block=True, group=f"rv-compat-{spec}")
    def endpoint(request: HttpRequest) -> HttpResponse:
        return JsonResponse({"ok": True})

    return endpoint


urlpatterns = [
    path("deco/login/", csrf_exempt(ratelimit("login-user")(plain_login))),
    path("mw/login/", plain_login),
    path("drf/login/", DRFLogin.as_view()),
    path("compat/login/", compat_ratelimit(key="post:username", rate=RATE, method="POST",
                                           group="rv-compat-login")(plain_login)),
]
for kind in KEY_SPECS:
    urlpatterns += [
        path(f"deco/{kind}/", csrf_exempt(ratelimit(f"rv-{kind}")(plain_endpoint))),
        path(f"mw/{kind}/", plain_endpoint),
        path(f"drf/{kind}/", drf_endpoint(f"rv-{kind}")),
        path(f"compat/{kind}/", compat_endpoint(KEY_SPECS[kind])),
    ]
