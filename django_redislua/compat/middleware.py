"""django-ratelimit's ``RatelimitMiddleware``: a raised ``Ratelimited`` becomes a response.

``settings.RATELIMIT_VIEW`` (dotted path, called ``view(request, exception)``) builds it when
set; otherwise the response is this app's 429 (``REDISLUA["DENIED_VIEW"]``, Retry-After and the
rate-limit headers), not django-ratelimit's 403.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings as django_settings
from django.http import HttpRequest, HttpResponseBase
from django.utils.module_loading import import_string

from django_redislua.compat.exceptions import Ratelimited
from django_redislua.responses import add_headers, denied_response


class RatelimitMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        return self.get_response(request)

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponseBase | None:
        if not isinstance(exception, Ratelimited):
            return None
        view_path = getattr(django_settings, "RATELIMIT_VIEW", None)
        if view_path is None:
            return denied_response(request, exception)
        response: HttpResponseBase = import_string(view_path)(request, exception)
        add_headers(response, exception.decisions, denied=True)
        return response
