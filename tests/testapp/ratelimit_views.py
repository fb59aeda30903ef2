"""Views for the decorator, middleware and compat tests (tests/test_decorators.py & co)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.views import View

from django_redislua.compat import ratelimit as compat_ratelimit
from django_redislua.decorators import ratelimit
from django_redislua.limiting import RateLimited, get_policy

SLOT_SEEN: list[int] = []  # in-flight counts observed inside views


def ok(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def staff_unlimited(request: HttpRequest) -> str | None:
    """A rate callable: None (unlimited) for staff, else 2 a minute."""
    user = getattr(request, "user", None)
    return None if user is not None and user.is_staff else "2/m"


def tenant_key(request: HttpRequest) -> str | None:
    return request.headers.get("X-Tenant")


@ratelimit(rate="3/m", key="ip")
def inline(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit("login")
def login(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="2/m", key="ip", methods=["POST"])
def post_only(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="2/m", key="header:x-api-key")
def by_header(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="2/m", key="get:q")
def by_get(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="2/m", key="post:email")
def by_post(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="2/m", key="user")
def by_user(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="2/m", key="user_or_ip")
def by_user_or_ip(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="2/m", key=tenant_key)
def by_callable_key(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="2/m", key="tests.testapp.ratelimit_views.tenant_key")
def by_dotted_key(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate=staff_unlimited, key="ip")
def callable_rate(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="tests.testapp.ratelimit_views.staff_unlimited", key="ip")
def dotted_rate(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="2/m", key="ip", block=False)
def not_blocking(request: HttpRequest) -> JsonResponse:
    return JsonResponse({
        "limited": request.limited,  # type: ignore[attr-defined]
        "decisions": [d.allowed for d in request.ratelimit],  # type: ignore[attr-defined]
    })


@ratelimit(rate="5/m", key="ip", group="stack-wide")
@ratelimit(rate="2/m", key="ip", group="stack-narrow")
@ratelimit("search")
def stacked(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def passthrough(view):  # type: ignore[no-untyped-def]
    """A foreign decorator between two @ratelimit (functools.wraps keeps the chain)."""
    import functools

    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):  # type: ignore[no-untyped-def]
        return view(request, *args, **kwargs)

    return wrapper


@ratelimit(rate="5/m", key="ip", group="through-wide")
@passthrough
@ratelimit(rate="2/m", key="ip", group="through-narrow")
def stacked_through(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(rate="2/m", key="ip")
async def async_view(request: HttpRequest) -> HttpResponse:
    await asyncio.sleep(0)
    return HttpResponse("ok")


@ratelimit(rate="5/m", key="ip", group="astack-wide")
@ratelimit(rate="2/m", key="ip", group="astack-narrow")
async def async_stacked(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(limit=1, key="ip", timeout="1m", group="slot")
def concurrency(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@ratelimit(limit=1, key="ip", timeout="1m", group="slot-stream")
def concurrency_stream(request: HttpRequest) -> StreamingHttpResponse:
    def body() -> Iterator[bytes]:
        policy = request.ratelimit[0].policy  # type: ignore[attr-defined]
        SLOT_SEEN.append(policy.peek("127.0.0.1").remaining)
        yield b"chunk"

    return StreamingHttpResponse(body())


@ratelimit(limit=1, key="ip", timeout="1m", group="slot-async")
async def concurrency_async(request: HttpRequest) -> HttpResponse:
    policy = request.ratelimit[0].policy  # type: ignore[attr-defined]
    SLOT_SEEN.append((await policy.apeek("127.0.0.1")).remaining)
    return HttpResponse("ok")


def raises_rate_limited(request: HttpRequest) -> HttpResponse:
    decision = get_policy("login").hit("raiser")
    raise RateLimited([decision])


# -- class-based views ----------------------------------------------------------------------
@ratelimit(rate="2/m", key="ip", group="cbv-class")
class ClassDecorated(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


@ratelimit(rate="5/m", key="ip", group="cbv-wide")
@ratelimit(rate="2/m", key="ip", group="cbv-narrow")
class ClassStacked(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


class MethodDecorated(View):
    @method_decorator(ratelimit(rate="2/m", key="ip", methods=["POST"]))
    def post(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


@method_decorator(ratelimit(rate="5/m", key="ip", group="md-wide"), name="dispatch")
@method_decorator(ratelimit(rate="2/m", key="ip", group="md-narrow"), name="dispatch")
class MethodDecoratorStacked(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


@ratelimit(rate="2/m", key="ip", group="cbv-async")
class AsyncClassDecorated(View):
    async def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


# -- compat ---------------------------------------------------------------------------------
@compat_ratelimit(key="ip", rate="2/m")
def compat_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


@compat_ratelimit(key="ip", rate="2/m", block=False)
def compat_not_blocking(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"limited": request.limited})  # type: ignore[attr-defined]


def denied_view(request: HttpRequest, exception: RateLimited) -> HttpResponse:
    """A DENIED_VIEW: JSON with the wait, still 429."""
    return JsonResponse(
        {"detail": "slow down", "policies": [d.policy.name for d in exception.decisions
                                             if not d.allowed]},
        status=429,
    )
