"""``is_ratelimited`` and ``get_usage`` with django-ratelimit's arguments, decided in Redis.

A django-ratelimit limit is a fixed window per ``(group, rate, methods)``; here it is this
engine's ``fixed_window`` policy, timed by the Redis server clock, one round trip per call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.utils.module_loading import import_string

from django_redislua.conf import settings
from django_redislua.connection import CLIENT_ERRORS
from django_redislua.keys import client_ip
from django_redislua.limiting import Decision, Policy, aevaluate, evaluate
from django_redislua.request_layer import report_outage
from django_redislua.signals import rate_limited

ALL = (None,)  # every HTTP method (django-ratelimit's sentinel)
UNSAFE = ["DELETE", "PATCH", "POST", "PUT"]
PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
Usage = dict[str, Any]


def _ip(request: HttpRequest) -> str:
    meta_key = getattr(django_settings, "RATELIMIT_IP_META_KEY", None)
    if meta_key is None:
        return client_ip(request) or ""
    if callable(meta_key):
        return str(meta_key(request))
    if "." in meta_key:
        return str(import_string(meta_key)(request))
    return str(request.META.get(meta_key, ""))


def _user(request: HttpRequest) -> str:
    # django-ratelimit keys anonymous users as str(None): they share one counter.
    return str(request.user.pk)


def _user_or_ip(request: HttpRequest) -> str:
    return str(request.user.pk) if request.user.is_authenticated else _ip(request)


SIMPLE_KEYS: dict[str, Callable[[HttpRequest], str]] = {
    "ip": _ip, "user": _user, "user_or_ip": _user_or_ip,
}
ACCESSOR_KEYS: dict[str, Callable[[HttpRequest, str], str]] = {
    "get": lambda r, k: str(r.GET.get(k, "")),
    "post": lambda r, k: str(r.POST.get(k, "")),
    "header": lambda r, k: str(r.META.get("HTTP_" + k.replace("-", "_").upper(), "")),
}


def _method_matches(request: HttpRequest, method: Any) -> bool:
    if method == ALL or method is None:
        return True
    methods = method if isinstance(method, (list, tuple)) else [method]
    return request.method in [str(m).upper() for m in methods]


def split_rate(rate: str | tuple[int, int]) -> tuple[int, int]:
    """``"5/m"`` -> ``(5, 60)``, ``"100/10s"`` -> ``(100, 10)``; ``(count, seconds)`` as is."""
    if isinstance(rate, tuple):
        return int(rate[0]), int(rate[1])
    count, _, period = rate.partition("/")
    multiplier = "".join(c for c in period if c.isdigit())
    unit = (period[len(multiplier):] or "s")[0].lower()
    if not count.strip().isdigit() or unit not in PERIODS:
        raise ImproperlyConfigured(f"Ratelimit rate {rate!r} is not like '5/m' or '100/10s'")
    return int(count), PERIODS[unit] * (int(multiplier) if multiplier else 1)


def _group_of(fn: Any) -> str:
    if isinstance(fn, functools.partial):
        fn = fn.func
    parts = [getattr(fn, "__module__", "")]
    if hasattr(fn, "__self__"):
        parts.append(fn.__self__.__class__.__name__)
    parts.append(fn.__qualname__)
    return ".".join(p for p in parts if p)


@functools.lru_cache(maxsize=1024)
def _policy(group: str, count: int, seconds: int, methods: str) -> Policy:
    # Like django-ratelimit's cache key, the counter is per group, rate and method set.
    name = f"compat:{group}:{count}/{seconds}s:{methods}".translate({ord("{"): "_", ord("}"): "_"})
    return Policy(name, rate=f"{count}/{seconds}s", algorithm="fixed_window")


def _methods_part(method: Any) -> str:
    if method == ALL or method is None:
        return ""
    methods = method if isinstance(method, (list, tuple)) else [method]
    return "".join(sorted(str(m).upper() for m in methods))


def _check(
    request: HttpRequest, group: str | None, fn: Any, key: Any, rate: Any, method: Any
) -> tuple[Policy, str] | None:
    """The policy and identity django-ratelimit would count this request under, or None."""
    if group is None and fn is None:
        raise ImproperlyConfigured("get_usage must be called with either `group` or `fn` arguments")
    if not getattr(django_settings, "RATELIMIT_ENABLE", True):
        return None
    if not _method_matches(request, method):
        return None
    group = group if group is not None else _group_of(fn)
    if callable(rate):
        rate = rate(group, request)
    elif isinstance(rate, str) and "/" not in rate and "." in rate:
        rate = import_string(rate)(group, request)
    if rate is None:
        return None
    count, seconds = split_rate(rate)
    if seconds <= 0:
        raise ImproperlyConfigured("Ratelimit period must be greater than 0")
    if not key:
        raise ImproperlyConfigured("Ratelimit key must be specified")
    if callable(key):
        value = key(group, request)
    elif key in SIMPLE_KEYS:
        value = SIMPLE_KEYS[key](request)
    elif ":" in key:
        accessor, _, name = key.partition(":")
        if accessor not in ACCESSOR_KEYS:
            raise ImproperlyConfigured(f"Unknown ratelimit key: {key}")
        value = ACCESSOR_KEYS[accessor](request, name)
    elif "." in key:
        value = import_string(key)(group, request)
    else:
        raise ImproperlyConfigured(f"Could not understand ratelimit key: {key}")
    identity = "" if value is None else str(value)
    return _policy(group, count, seconds, _methods_part(method)), identity


def _fail_open() -> bool:
    return bool(getattr(django_settings, "RATELIMIT_FAIL_OPEN", settings.FAIL_OPEN))


def _usage(request: HttpRequest, decision: Decision, increment: bool) -> Usage:
    used = decision.limit - max(0, decision.remaining)
    if increment and not decision.allowed:
        rate_limited.send(get_usage, request=request, decision=decision)
        used += 1  # django-ratelimit counts the denied request too: count > limit
    return {
        "count": used,
        "limit": decision.limit,
        "should_limit": not decision.allowed,
        "time_left": max(0, round(decision.reset_after)),
        "decision": decision,
    }


def _outage(exc: BaseException) -> Usage | None:
    report_outage(exc)
    if _fail_open():
        return None
    return {"count": 0, "limit": 0, "should_limit": True, "time_left": -1}


def get_usage(
    request: HttpRequest, group: str | None = None, fn: Any = None, key: Any = None,
    rate: Any = None, method: Sequence[str] | str | tuple[None] = ALL, increment: bool = False,
) -> Usage | None:
    """django-ratelimit's ``get_usage``: ``{count, limit, should_limit, time_left}`` or None.

    Also carries ``decision`` (this engine's Decision). ``increment=False`` only looks:
    ``should_limit`` then tells whether the next request would be limited.
    """
    check = _check(request, group, fn, key, rate, method)
    if check is None:
        return None
    policy, value = check
    try:
        decision = evaluate([(policy, value, 1)], peek=not increment)[0]
    except CLIENT_ERRORS as exc:
        return _outage(exc)
    return _usage(request, decision, increment)


async def aget_usage(
    request: HttpRequest, group: str | None = None, fn: Any = None, key: Any = None,
    rate: Any = None, method: Sequence[str] | str | tuple[None] = ALL, increment: bool = False,
) -> Usage | None:
    """The asyncio twin of :func:`get_usage` (not in django-ratelimit)."""
    check = _check(request, group, fn, key, rate, method)
    if check is None:
        return None
    policy, value = check
    try:
        decision = (await aevaluate([(policy, value, 1)], peek=not increment))[0]
    except CLIENT_ERRORS as exc:
        return _outage(exc)
    return _usage(request, decision, increment)


def is_ratelimited(
    request: HttpRequest, group: str | None = None, fn: Any = None, key: Any = None,
    rate: Any = None, method: Sequence[str] | str | tuple[None] = ALL, increment: bool = False,
) -> bool:
    """django-ratelimit's ``is_ratelimited``: True when this request is over the limit."""
    usage = get_usage(request, group, fn, key, rate, method, increment)
    return bool(usage and usage["should_limit"])
