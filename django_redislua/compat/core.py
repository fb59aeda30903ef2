"""``is_ratelimited`` and ``get_usage`` with django-ratelimit 4.1's arguments, decided in Redis.

django-ratelimit keeps one counter per ``(group, rate, key value, methods)`` and window: every
counted request increments it, denied ones too, and a request is limited when the count is
above the limit. Here that counter is this engine's ``fixed_window`` policy with a limit that is
never reached (:data:`COUNTER_LIMIT`), so the script counts every request and answers the
count, in one round trip, timed by the Redis server clock; the comparison with the real limit
is django-ratelimit's ``count > limit``. A rate whose count is 0 limits every request without
asking Redis. docs/migrating.md lists what knowingly differs, and why.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import math
import re
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.utils.module_loading import import_string

from django_redislua import metrics
from django_redislua.atransport import arun
from django_redislua.conf import settings
from django_redislua.keys import body_field, client_ip
from django_redislua.limiting.decision import Decision
from django_redislua.limiting.policy import Policy
from django_redislua.protocol import Protocol
from django_redislua.request_layer import Rule, deciding, signalling
from django_redislua.transport import run

__all__ = ["is_ratelimited", "get_usage"]  # noqa: RUF022 (django-ratelimit's order)

ALL = (None,)  # every HTTP method (django-ratelimit's sentinel)
UNSAFE = ["DELETE", "PATCH", "POST", "PUT"]
PERIODS = {"s": 1, "m": 60, "h": 60 * 60, "d": 24 * 60 * 60}
# django-ratelimit's rate syntax, matched (not full-matched) as it does: "5/m", "100/10s",
# "5/minute" (read as "5/m"), "5/" and "5/x" (per second), "5/10" (per 10 seconds). The unit is
# lower case only: django-ratelimit reads "5/M" as 5 per second, and so does compat.
RATE_RE = re.compile(r"([\d]+)/([\d]*)([smhd])?")
# The limit of the counting policy: never reached, so the script counts every request (denied
# ones too, as django-ratelimit does) and its `remaining` gives the count exactly (< 2**53).
COUNTER_LIMIT = 1 << 52
Usage = dict[str, Any]
Method = Sequence[str] | str | tuple[None] | None


# -- keys --------------------------------------------------------------------------------------
def _setting(name: str, default: Any) -> Any:
    return getattr(django_settings, name, default)


def mask_ip(ip: str) -> str:
    """django-ratelimit's masking: the network address of ``ip`` under the IPv4/IPv6 mask.

    ``RATELIMIT_IPV4_MASK`` (default 32) and ``RATELIMIT_IPV6_MASK`` (default 64); when unset,
    ``REDISLUA["IPV4_MASK"]`` / ``["IPV6_MASK"]`` (same defaults). A value that already names a
    network (``2001:db8::/64``, what :func:`django_redislua.keys.client_ip` returns) is masked
    from its network address. A value that is not an address raises ValueError, as in 4.1.
    """
    if ":" in ip:
        mask = _setting("RATELIMIT_IPV6_MASK", settings.IPV6_MASK)
    else:
        mask = _setting("RATELIMIT_IPV4_MASK", settings.IPV4_MASK)
    address = ip.partition("/")[0]
    return str(ipaddress.ip_network(f"{address}/{mask}", strict=False).network_address)


def _peer_address(request: HttpRequest) -> str:
    if settings.TRUSTED_PROXIES > 0:
        # Not in django-ratelimit: REDISLUA["TRUSTED_PROXIES"] picks the address a trusted
        # proxy saw, as in the native layers (0, the default, keeps django-ratelimit's rule).
        address = client_ip(request)
    else:
        address = request.META.get("REMOTE_ADDR")
    if not address:
        raise ImproperlyConfigured(
            "IP address in REMOTE_ADDR is empty. This can happen when using a reverse proxy "
            "and connecting to the app server with Unix sockets. See the documentation for "
            "RATELIMIT_IP_META_KEY."
        )
    return str(address)


def get_ip(request: HttpRequest) -> str:
    """The ``ip`` key: ``REMOTE_ADDR`` or ``RATELIMIT_IP_META_KEY``, then masked.

    ``RATELIMIT_IP_META_KEY`` is a ``request.META`` key, a callable ``(request)`` or the dotted
    path of one; whichever gives the address, it is masked (:func:`mask_ip`).
    """
    ip_meta = _setting("RATELIMIT_IP_META_KEY", None)
    if not ip_meta:
        ip = _peer_address(request)
    elif callable(ip_meta):
        ip = ip_meta(request)
    elif isinstance(ip_meta, str) and "." in ip_meta:
        ip = import_string(ip_meta)(request)
    elif ip_meta in request.META:
        ip = request.META[ip_meta]
    else:
        raise ImproperlyConfigured(f'Could not get IP address from "{ip_meta}"')
    return mask_ip(ip)


def _user(request: HttpRequest) -> str:
    # django-ratelimit keys anonymous users as str(None): they share one counter.
    return str(request.user.pk)


def _user_or_ip(request: HttpRequest) -> str:
    return str(request.user.pk) if request.user.is_authenticated else get_ip(request)


def _header(request: HttpRequest, name: str) -> str:
    return str(request.META.get("HTTP_" + name.replace("-", "_").upper(), ""))


SIMPLE_KEYS: dict[str, Callable[[HttpRequest], str]] = {
    "ip": get_ip, "user": _user, "user_or_ip": _user_or_ip,
}
ACCESSOR_KEYS: dict[str, Callable[[HttpRequest, str], str]] = {
    "get": lambda r, k: str(r.GET.get(k, "")),
    # The field wherever the request carries it (a form, a JSON body, DRF's request.data);
    # django-ratelimit reads request.POST only, so every JSON request shared the key "".
    "post": lambda r, k: body_field(r, k) or "",
    "header": _header,
}


def _key_value(request: HttpRequest, group: str, key: Any) -> str:
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
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return "" if value is None else str(value)


# -- methods, groups, rates --------------------------------------------------------------------
def _method_matches(request: HttpRequest, method: Method) -> bool:
    if method == ALL or method is None:
        return True
    methods = method if isinstance(method, (list, tuple)) else [method]
    return request.method in [str(m).upper() for m in methods]


def _methods_part(method: Method) -> str:
    """The method set in the counter's name, as in django-ratelimit's cache key."""
    if method == ALL or method is None:
        return ""
    if isinstance(method, (list, tuple)):
        return "".join(sorted(str(m).upper() for m in method))
    return str(method)  # a single method is used as given: "post" and "POST" count apart


def split_rate(rate: str | tuple[Any, Any]) -> tuple[Any, Any]:
    """``"5/m"`` -> ``(5, 60)``, ``"100/10s"`` -> ``(100, 10)``; ``(count, seconds)`` as is.

    django-ratelimit's ``_split_rate``; a string it cannot read is ImproperlyConfigured here
    (django-ratelimit fails with an AttributeError).
    """
    if isinstance(rate, tuple):
        return rate
    match = RATE_RE.match(rate) if isinstance(rate, str) else None
    if match is None:
        raise ImproperlyConfigured(f"Ratelimit rate {rate!r} is not like '5/m' or '100/10s'")
    count, multi, period = match.groups()
    seconds = PERIODS[(period or "s").lower()]
    if multi:
        seconds *= int(multi)
    return int(count), seconds


_split_rate = split_rate  # django-ratelimit's name


def _group_of(fn: Any) -> str:
    """django-ratelimit's default group: module, the instance's class for a bound method, and
    the qualified name (``method_decorator`` hands the decorator a partial of a bound method)."""
    if isinstance(fn, functools.partial):
        fn = fn.func
    parts = []
    if hasattr(fn, "__module__"):
        parts.append(str(fn.__module__))
    if hasattr(fn, "__self__"):
        parts.append(fn.__self__.__class__.__name__)
    parts.append(fn.__qualname__)
    return ".".join(parts)


def _window_end(value: str, period: Any, now: int) -> Any:
    """django-ratelimit's ``_get_window``: the end of the current window, per-key jitter."""
    if period == 1:
        return now
    w = now - (now % period) + (zlib.crc32(value.encode("utf-8", "surrogateescape")) % period)
    return w + period if w < now else w


@functools.lru_cache(maxsize=1024)
def _policies(group: str, count: Any, seconds: Any, methods: str) -> tuple[Policy, Policy]:
    """The counting policy and the policy decisions show, per group, rate and method set."""
    name = f"compat:{group}:{count}/{seconds}s:{methods}".translate(
        {ord("{"): "_", ord("}"): "_"}
    )
    counter = Policy(name, rate=f"{COUNTER_LIMIT}/{seconds}s", algorithm="fixed_window")
    shown = Policy(public_name(group, name), rate=f"{max(0, math.ceil(count))}/{seconds}s",
                   algorithm="fixed_window")
    return counter, shown


def public_name(group: str, counter_name: str) -> str:
    """The name the rate-limit headers show: the group's last part and a digest of the counter,
    like the native decorator's inline names (a group is often the view's module path, which
    tells clients how the code is laid out): ``"hello-3fa9c2b1"``."""
    last = group.rpartition(".")[2].rpartition(":")[2][-40:] or "group"
    return f"{last}-{hashlib.sha256(counter_name.encode()).hexdigest()[:8]}"


class _Check:
    """What django-ratelimit would count this request under, and how it reads the count."""

    __slots__ = ("count", "counter", "limit", "seconds", "shown", "value")

    def __init__(self, group: str, limit: Any, seconds: Any, methods: str, value: str) -> None:
        self.limit = limit
        self.seconds = seconds
        self.value = value
        self.counter, self.shown = _policies(group, limit, seconds, methods)
        self.count = 0  # the window's count, once read

    def rule(self) -> Rule:
        """The request layer's rule: count under the counting policy, by the key's value."""
        value = self.value
        return Rule(self.counter, lambda _request: value, methods=None, cost=1, block=True)

    def read(self, counted: Decision) -> Decision:
        """django-ratelimit's reading of the counter: limited when ``count > limit``. The
        Decision shown (headers, the signal) is in the limit's terms."""
        count = self.count = COUNTER_LIMIT - counted.remaining
        limit = self.limit
        should_limit = count > limit
        return Decision(
            not should_limit, limit, max(0, limit - count), counted.reset_after,
            counted.reset_after if should_limit else 0.0, self.shown, self.value,
        )


def _check(
    request: HttpRequest, group: str | None, fn: Any, key: Any, rate: Any, method: Method
) -> _Check | None:
    """The counter this request is counted under, or None when it is not limited at all."""
    if group is None and fn is None:
        raise ImproperlyConfigured("get_usage must be called with either `group` or `fn` arguments")
    if not settings.ENABLED or not _setting("RATELIMIT_ENABLE", True):
        return None
    if not _method_matches(request, method):
        return None
    if group is None:
        group = _group_of(fn)
    if callable(rate):
        rate = rate(group, request)
    elif isinstance(rate, str) and "." in rate:
        rate = import_string(rate)(group, request)
    if rate is None:
        return None
    limit, seconds = split_rate(rate)
    if seconds <= 0:
        raise ImproperlyConfigured("Ratelimit period must be greater than 0")
    value = _key_value(request, group, key)
    return _Check(group, limit, seconds, _methods_part(method), value)


# -- usage -------------------------------------------------------------------------------------
def _fail_open() -> bool:
    return bool(_setting("RATELIMIT_FAIL_OPEN", settings.FAIL_OPEN))


def _deny_all(request: HttpRequest, check: _Check, increment: bool) -> Protocol[Usage]:
    """A rate of 0 (or less): every request is limited; Redis is not asked.

    ``time_left`` is django-ratelimit's (the end of its jittered window, on this server's
    clock); ``count`` is this request (1) when incrementing, else 0: nothing is stored.
    """
    now = int(time.time())
    time_left = _window_end(check.value, check.seconds, now) - now
    # As the engine's own zero rates: nothing to reset, and no wait helps (so no Retry-After).
    decision = Decision(False, check.limit, 0, 0.0, math.inf, check.shown, check.value)
    if increment:
        # Counted as the request layer counts what compat reads: under the counting policy.
        metrics.decision(check.counter.name, check.counter.algorithm, metrics.DENIED)
        yield from signalling(request, [decision], get_usage)
    return {
        "count": 1 if increment else 0,
        "limit": check.limit,
        "should_limit": True,
        "time_left": time_left,
        "decision": decision,
    }


def usage(request: HttpRequest, group: str | None, fn: Any, key: Any, rate: Any,
          method: Method, increment: bool) -> Protocol[Usage | None]:
    """The protocol of :func:`get_usage` (and of its asyncio twin).

    Decided by the request layer's one path (one script call, the outage and recovery log
    lines, the metrics, the signal) on compat's terms: a look consumes nothing
    (``increment=False``), the counter is read django-ratelimit's way, nothing is put on the
    request, and Redis failing follows ``RATELIMIT_FAIL_OPEN``: when closed, the request is
    limited (django-ratelimit's answer when its cache cannot count).
    """
    check = _check(request, group, fn, key, rate, method)
    if check is None:
        return None
    if check.limit <= 0:
        return (yield from _deny_all(request, check, increment))
    outcome = yield from deciding(
        request, [check.rule()], get_usage, peek=not increment, read=check.read, record=False,
        fail_open=_fail_open, refused_as="limited (django-ratelimit's way)")
    if outcome.unavailable:
        return {"count": 0, "limit": 0, "should_limit": True, "time_left": -1}
    if not outcome.decisions:
        return None  # failed open: not limited
    decision = outcome.decisions[0]
    # Seconds until the window ends, in django-ratelimit's terms: whole seconds after the
    # current one, 0 .. period - 1. No window yet (a look before any request): one would
    # open now and last the whole period.
    left = decision.reset_after if check.count > 0 else float(check.seconds)
    return {
        "count": check.count,
        "limit": check.limit,
        "should_limit": not decision.allowed,
        "time_left": max(0, math.ceil(left) - 1),
        "decision": decision,
    }


def limited(request: HttpRequest, group: str | None, fn: Any, key: Any, rate: Any,
            method: Method, increment: bool) -> Protocol[bool]:
    found = yield from usage(request, group, fn, key, rate, method, increment)
    return bool(found and found["should_limit"])


def get_usage(
    request: HttpRequest, group: str | None = None, fn: Any = None, key: Any = None,
    rate: Any = None, method: Method = ALL, increment: bool = False,
) -> Usage | None:
    """django-ratelimit's ``get_usage``: ``{count, limit, should_limit, time_left}`` or None.

    ``count`` is the window's count (after this request, with ``increment=True``; denied
    requests count too), ``should_limit`` is ``count > limit``, ``time_left`` the whole seconds
    until the window ends. Also carries ``decision`` (this engine's Decision, for headers).
    """
    return run(usage(request, group, fn, key, rate, method, increment))


def aget_usage(
    request: HttpRequest, group: str | None = None, fn: Any = None, key: Any = None,
    rate: Any = None, method: Method = ALL, increment: bool = False,
) -> Awaitable[Usage | None]:
    """The asyncio twin of :func:`get_usage` (not in django-ratelimit)."""
    return arun(usage(request, group, fn, key, rate, method, increment))


def is_ratelimited(
    request: HttpRequest, group: str | None = None, fn: Any = None, key: Any = None,
    rate: Any = None, method: Method = ALL, increment: bool = False,
) -> bool:
    """django-ratelimit's ``is_ratelimited``: ``get_usage(...)["should_limit"]``, or False."""
    return run(limited(request, group, fn, key, rate, method, increment))


def ais_ratelimited(
    request: HttpRequest, group: str | None = None, fn: Any = None, key: Any = None,
    rate: Any = None, method: Method = ALL, increment: bool = False,
) -> Awaitable[bool]:
    """The asyncio twin of :func:`is_ratelimited` (not in django-ratelimit)."""
    return arun(limited(request, group, fn, key, rate, method, increment))


is_ratelimited.ALL = ALL  # type: ignore[attr-defined]
is_ratelimited.UNSAFE = UNSAFE  # type: ignore[attr-defined]
get_usage.ALL = ALL  # type: ignore[attr-defined]
get_usage.UNSAFE = UNSAFE  # type: ignore[attr-defined]
ais_ratelimited.ALL = ALL  # type: ignore[attr-defined]
ais_ratelimited.UNSAFE = UNSAFE  # type: ignore[attr-defined]
aget_usage.ALL = ALL  # type: ignore[attr-defined]
aget_usage.UNSAFE = UNSAFE  # type: ignore[attr-defined]
