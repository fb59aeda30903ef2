"""One page per feature of the views layer; each decision is one EVALSHA on the Redis clock."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from django_redislua.decorators import ratelimit


def index(request: HttpRequest) -> HttpResponse:
    return render(request, "demo/index.html")


@ratelimit("demo", block=False)
def limited(request: HttpRequest) -> HttpResponse:
    """The "demo" policy: 5 requests a minute per IP. block=False so the page can explain the
    denial itself; it still answers 429 then, and the decorator adds Retry-After."""
    decision = request.ratelimit[0] if request.ratelimit else None  # type: ignore[attr-defined]
    status = 429 if request.limited else 200  # type: ignore[attr-defined]
    return render(request, "demo/limited.html", {"decision": decision}, status=status)


@require_http_methods(["GET", "POST"])
@ratelimit("login")
def login_form(request: HttpRequest) -> HttpResponse:
    """The "login" policy counts POSTs only (5 a minute per IP): reading the form is free."""
    submitted = request.POST.get("username") if request.method == "POST" else None
    return render(request, "demo/login.html", {"submitted": submitted})


@ratelimit("api")
def api(request: HttpRequest) -> JsonResponse:
    """A JSON endpoint on the "api" policy (GCRA, 100/m, bursts of 20)."""
    decision = request.ratelimit[0] if request.ratelimit else None  # type: ignore[attr-defined]
    return JsonResponse({
        "ok": True,
        "remaining": decision.remaining if decision else None,
        "limit": decision.limit if decision else None,
    })


@ratelimit(rate="3/10s", key="ip", algorithm="fixed_window", group="demo-burst")
@ratelimit(rate="10/m", key="ip", algorithm="sliding_log", group="demo-sustained")
def stacked(request: HttpRequest) -> HttpResponse:
    """Two policies, one script call: 3 per 10 s AND 10 per minute. A request denied by one
    consumes nothing from the other."""
    return render(request, "demo/stacked.html", {"decisions": request.ratelimit})  # type: ignore[attr-defined]


@ratelimit("search")
@ratelimit("search-v2")
def shadow(request: HttpRequest) -> HttpResponse:
    """A new, stricter limit tried in shadow mode beside the enforced one: "search-v2" (3/m)
    is decided and counted like "search", but never blocks and sends no headers."""
    return render(request, "demo/shadow.html", {
        "enforced": request.ratelimit,  # type: ignore[attr-defined]
        "shadow": getattr(request, "ratelimit_shadow", []),
    })


def metrics(request: HttpRequest) -> HttpResponse:
    """What Prometheus scrapes: this process's redislua_* metrics (prometheus_client)."""
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    except ImportError:
        return HttpResponse("prometheus_client is not installed: pip install "
                            "'django-redislua[prometheus]'\n", status=501,
                            content_type="text/plain")
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


@ratelimit("demo")
async def async_limited(request: HttpRequest) -> HttpResponse:
    """An ``async def`` view: decided by the asyncio Redis client, no thread hop."""
    return HttpResponse("async ok\n", content_type="text/plain")
