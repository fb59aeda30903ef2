"""The views the root URLconf routes, for the checks and for policy discovery (no requests)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def url_views() -> Iterator[tuple[str, Any]]:
    """``(route, callback)`` of every view the root URLconf reaches (includes followed)."""
    from django.urls import URLPattern, URLResolver, get_resolver

    def walk(patterns: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        for entry in patterns:
            if isinstance(entry, URLResolver):
                yield from walk(entry.url_patterns, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern):
                yield prefix + str(entry.pattern), entry.callback

    try:
        patterns = get_resolver().url_patterns
    except Exception:  # Django's own URL checks report a URLconf that fails to import
        return
    yield from walk(patterns, "")


def view_targets(callback: Any) -> Iterator[Any]:
    """The callables a view's ``@ratelimit`` can sit on: the function, or a class-based view's
    ``dispatch`` and handler methods."""
    yield callback
    view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if isinstance(view_class, type):
        for name in ("dispatch", *getattr(view_class, "http_method_names", ())):
            method = getattr(view_class, name, None)
            if method is not None:
                yield method
