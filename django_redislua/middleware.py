"""``RateLimitMiddleware``: policies applied by URL prefix or URL name, and RateLimited -> 429.

``REDISLUA["MIDDLEWARE_POLICIES"]`` is a list of ``{"policy": name, "path": "/api/"}`` (a path
prefix) or ``{"policy": name, "name": "url-name"}`` (a URL name, or ``"namespace:name"``)
entries; the entries that match a request are decided together in ONE script call before the
view runs. A :class:`~django_redislua.limiting.RateLimited` raised by a view (or by code it
calls, e.g. ``with policy.slot(key):``) becomes the same 429 response the decorator sends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from django.urls import Resolver404, resolve

from django_redislua.conf import settings
from django_redislua.limiting.decision import RateLimited
from django_redislua.request_layer import RuleOrError, aguard, guard, rule_for_name
from django_redislua.responses import denied_response


def _url_names(request: HttpRequest) -> set[str]:
    try:
        match = resolve(request.path_info, getattr(request, "urlconf", None))
    except Resolver404:
        return set()
    if not match.url_name:
        return set()
    return {match.url_name, match.view_name}


def matching_rules(request: HttpRequest) -> list[RuleOrError]:
    """The MIDDLEWARE_POLICIES entries that apply to ``request``, as Rules (or why not)."""
    entries = settings.MIDDLEWARE_POLICIES
    if not entries:
        return []
    names: set[str] | None = None
    rules = []
    for entry in entries:
        if "path" in entry:
            matched = request.path_info.startswith(str(entry["path"]))
        else:
            if names is None:  # resolve the URL only when a rule needs its name
                names = _url_names(request)
            matched = str(entry["name"]) in names
        if matched:
            overrides = {k: entry[k] for k in ("key", "methods", "block", "cost") if k in entry}
            rules.append(rule_for_name(str(entry["policy"]), **overrides))
    return rules


class RateLimitMiddleware:
    """Applies ``MIDDLEWARE_POLICIES``; turns a raised RateLimited into 429. Sync and async."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        rules = matching_rules(request)
        if self.is_async:
            return aguard(request, rules, RateLimitMiddleware,
                          functools.partial(self.get_response, request))
        return guard(request, rules, RateLimitMiddleware,
                     functools.partial(self.get_response, request))

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponseBase | None:
        if isinstance(exception, RateLimited):
            return denied_response(request, exception)
        return None
