from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from django_redislua import get_policy
from django_redislua.headers import rate_limit_headers
from django_redislua.keys import client_ip


def index(request: HttpRequest) -> HttpResponse:
    return render(request, "demo/index.html")


def limited(request: HttpRequest) -> HttpResponse:
    """5 requests a minute per IP, decided by one EVALSHA on the Redis server clock."""
    decision = get_policy("demo").hit(client_ip(request) or "unknown")
    status = 200 if decision.allowed else 429
    response = render(request, "demo/limited.html", {"decision": decision}, status=status)
    for name, value in rate_limit_headers([decision]).items():
        response[name] = value
    return response
