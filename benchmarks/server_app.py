"""The Django project benchmarks/bench_servers.py serves: settings, views and URLs in one module.

A trivial view (``ok``, a few bytes) four ways: sync and async, bare and limited by one policy
(``@ratelimit("bench")``, the client's address as identity, a quota no run exhausts: the
allowed path only). No middleware: what is left to compare is the server, the view and the
limiter. ``REDIS_URL`` names the benchmark's server.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application
from django.http import HttpRequest, HttpResponse
from django.urls import path

from django_redislua.decorators import ratelimit

SECRET_KEY = "bench-servers"  # a throwaway loopback server
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
ROOT_URLCONF = __name__
INSTALLED_APPS = ["django_redislua"]
MIDDLEWARE: list[str] = []
DATABASES: dict[str, object] = {}
USE_TZ = True
REDISLUA = {
    "CONNECTION": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    "POLICIES": {"bench": {"rate": f"{10**9}/h", "key": "ip"}},
}


def bare(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok")


@ratelimit("bench")
def limited(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok")


async def abare(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok")


@ratelimit("bench")
async def alimited(request: HttpRequest) -> HttpResponse:
    return HttpResponse(b"ok")


urlpatterns = [
    path("bare/", bare), path("limited/", limited),
    path("abare/", abare), path("alimited/", alimited),
]

os.environ.setdefault("DJANGO_SETTINGS_MODULE", __name__)
wsgi = get_wsgi_application()
asgi = get_asgi_application()
