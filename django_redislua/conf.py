"""The live settings facade: ``REDISLUA`` merged over defaults, re-read when settings change.

The merged dict is cached and the cache is dropped on Django's ``setting_changed`` signal, so
``override_settings(REDISLUA=...)`` works in tests while the hot path pays one dict lookup.
"""

from __future__ import annotations

import functools
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    # A CACHES alias (django-redis or Django's RedisCache) or a redis://, rediss://, unix://,
    # redis+cluster:// or redis+sentinel:// URL.
    "CONNECTION": "default",
    # Extra keyword arguments for clients this app builds itself (from a URL, or beside a cache).
    "CONNECTION_OPTIONS": {},
    # Seconds. Short on purpose: a rate limiter must fail fast, then follow FAIL_OPEN.
    "SOCKET_TIMEOUT": 0.5,
    "SOCKET_CONNECT_TIMEOUT": 0.5,
    "KEY_PREFIX": "rl",
    "FAIL_OPEN": True,
    "HEADERS": "ietf",
    "TRUSTED_PROXIES": 0,
    "IPV4_MASK": 32,
    "IPV6_MASK": 64,
    "POLICIES": {},
    "MIDDLEWARE_POLICIES": [],
    "DENIED_VIEW": None,
    # The body of this app's own 429 (not of a DENIED_VIEW's): "text" ("Too Many Requests"), or
    # "problem" (RFC 9457 application/problem+json, the quota-exceeded type; see problem.py).
    "DENIED_BODY": "text",
    # Call scripts as Redis 7 Functions (FCALL) instead of EVALSHA.
    "USE_FUNCTIONS": False,
    # Seconds a waiter handed a lock has to confirm it; an unconfirmed hand-off passes on.
    "LOCK_CLAIM_WINDOW": 1.0,
    # Answer a denied policy and identity in-process until Redis would lift the denial (at most
    # 1 s): a flood from one identity costs no round trip. Never admits; see limiting/denials.py.
    "LOCAL_DENY": True,
    # Send script calls on a single server straight to a pooled connection (django_redislua/
    # lean.py), bypassing redis-py's per-command machinery; False keeps redis-py's path.
    "LEAN_CALLS": True,
    # False: the decorators, the middleware and the DRF throttles admit every request without
    # asking Redis (a kill switch, and for test settings). The Python API still decides.
    "ENABLED": True,
    # "auto": record metrics in prometheus_client and/or OpenTelemetry, whichever is installed;
    # or a list of "prometheus", "opentelemetry"; [] for none. See django_redislua/metrics.py.
    "METRICS": "auto",
    # The bearer token a Prometheus scrape sends to the /metrics view (django_redislua.urls);
    # None: staff sessions only.
    "METRICS_TOKEN": None,
}

HEADER_MODES = ("ietf", "legacy", "both", None)
DENIED_BODIES = ("text", "problem")


def valid_claim_window(value: Any) -> bool:
    """``LOCK_CLAIM_WINDOW``: a number of seconds in (0, 60]."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= 60


@functools.cache
def _merged() -> dict[str, Any]:
    user = getattr(django_settings, "REDISLUA", {})
    if not isinstance(user, dict):
        # checks.py reports this as redislua.E001; the app keeps running on defaults.
        user = {}
    return {**DEFAULTS, **user}


# Bumped whenever REDISLUA or CACHES changes: a value derived from the settings on the hot path
# (a policy's key head, a script's command head) is cached with the generation it was made in.
generation = 0


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global generation
    if setting in ("REDISLUA", "CACHES"):
        generation += 1
        _merged.cache_clear()
        for callback in _on_change:
            callback()


_on_change: list[Any] = []


def on_change(callback: Any) -> Any:
    """Register a no-argument callable run whenever REDISLUA or CACHES changes (cache resets)."""
    _on_change.append(callback)
    return callback


def on_change_first(callback: Any) -> Any:
    """:func:`on_change`, run before the others: what gives connections back to a pool (the
    transports) runs before what closes the pool's idle connections (the clients)."""
    _on_change.insert(0, callback)
    return callback


class Settings:
    """Typed, always-current view of ``settings.REDISLUA``."""

    def raw(self) -> dict[str, Any]:
        return _merged()

    @property
    def CONNECTION(self) -> str:
        return str(_merged()["CONNECTION"])

    @property
    def CONNECTION_OPTIONS(self) -> dict[str, Any]:
        return dict(_merged()["CONNECTION_OPTIONS"])

    @property
    def SOCKET_TIMEOUT(self) -> float | None:
        value = _merged()["SOCKET_TIMEOUT"]
        return None if value is None else float(value)

    @property
    def SOCKET_CONNECT_TIMEOUT(self) -> float | None:
        value = _merged()["SOCKET_CONNECT_TIMEOUT"]
        return None if value is None else float(value)

    @property
    def KEY_PREFIX(self) -> str:
        return str(_merged()["KEY_PREFIX"])

    @property
    def FAIL_OPEN(self) -> bool:
        return bool(_merged()["FAIL_OPEN"])

    @property
    def HEADERS(self) -> str | None:
        value = _merged()["HEADERS"]
        return None if value is None else str(value)

    @property
    def TRUSTED_PROXIES(self) -> int:
        return int(_merged()["TRUSTED_PROXIES"])

    @property
    def IPV4_MASK(self) -> int:
        return int(_merged()["IPV4_MASK"])

    @property
    def IPV6_MASK(self) -> int:
        return int(_merged()["IPV6_MASK"])

    @property
    def POLICIES(self) -> dict[str, dict[str, Any]]:
        return dict(_merged()["POLICIES"])

    @property
    def MIDDLEWARE_POLICIES(self) -> list[dict[str, Any]]:
        return list(_merged()["MIDDLEWARE_POLICIES"])

    @property
    def DENIED_VIEW(self) -> str | None:
        value = _merged()["DENIED_VIEW"]
        return None if value is None else str(value)

    @property
    def DENIED_BODY(self) -> str:
        # checks.py reports any other value as redislua.E028; denials keep the plain text body.
        value = _merged()["DENIED_BODY"]
        return str(value) if value in DENIED_BODIES else "text"

    @property
    def USE_FUNCTIONS(self) -> bool:
        return bool(_merged()["USE_FUNCTIONS"])

    @property
    def LOCK_CLAIM_WINDOW(self) -> float:
        value = _merged()["LOCK_CLAIM_WINDOW"]
        # checks.py reports anything else as redislua.E023; the lock keeps working on 1 s.
        return float(value) if valid_claim_window(value) else 1.0

    @property
    def LEAN_CALLS(self) -> bool:
        # checks.py reports a value that is not a bool as redislua.E024.
        return bool(_merged()["LEAN_CALLS"])

    @property
    def ENABLED(self) -> bool:
        # checks.py reports a value that is not a bool as redislua.E024.
        return bool(_merged()["ENABLED"])

    @property
    def METRICS(self) -> Any:
        # checks.py reports a value that is not "auto" or a list of backends as redislua.E025.
        return _merged()["METRICS"]

    @property
    def METRICS_TOKEN(self) -> str | None:
        # checks.py reports a value that is not a string of 16+ characters as redislua.E027.
        value = _merged()["METRICS_TOKEN"]
        return value if isinstance(value, str) and len(value) >= 16 else None

    @property
    def LOCAL_DENY(self) -> bool:
        # checks.py reports a value that is not a bool as redislua.E024.
        return bool(_merged()["LOCAL_DENY"])


settings = Settings()
