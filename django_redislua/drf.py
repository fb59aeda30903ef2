"""Django REST framework throttles decided by the rate-limit engine: one Redis round trip each.

``AnonRateThrottle``, ``UserRateThrottle`` and ``ScopedRateThrottle`` are configured like DRF's
classes of the same names (``DEFAULT_THROTTLE_RATES``, ``scope``/``throttle_scope``,
``NUM_PROXIES``, ``get_cache_key``, ``rate``, ``timer``) and decide as DRF's sliding history does,
but the read-check-append is one Lua script (``sliding_log``) timed by the Redis server clock, so
concurrent requests cannot all read the same history and all pass. ``PolicyThrottle`` applies
``REDISLUA["POLICIES"]`` named by ``throttle_policy`` on the view, with any algorithm.

Rates are read from ``api_settings`` on every request (DRF reloads it on ``setting_changed``), so
``override_settings(REST_FRAMEWORK=...)`` takes effect at once. Each decision is appended to
``request.ratelimit`` and its rate-limit headers are put in ``view.headers``, which DRF copies onto
the response in ``finalize_response``, allowed or throttled; ``Retry-After`` stays DRF's own, from
``wait()``. If Redis cannot be reached the request is admitted (``REDISLUA["FAIL_OPEN"]``) or
answered 503 (:class:`RateLimiterUnavailable`), never 500.

This is the only module that imports ``rest_framework``.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

# Only modules that do not import rest_framework.views: DRF reads DEFAULT_THROTTLE_CLASSES (and
# so imports this module) while rest_framework.views is still defining APIView, so importing it
# here would be a cycle that fails every start-up using the global setting.
try:
    from rest_framework.exceptions import APIException
    from rest_framework.settings import api_settings
    from rest_framework.throttling import BaseThrottle
except ModuleNotFoundError as exc:  # pragma: no cover - exercised in a subprocess without DRF
    if exc.name is None or exc.name.partition(".")[0] != "rest_framework":
        raise
    raise ImportError(
        "django_redislua.drf needs Django REST framework: pip install django-redislua[drf]"
    ) from exc

if TYPE_CHECKING:
    from rest_framework.request import Request
    from rest_framework.views import APIView

from django_redislua.conf import settings
from django_redislua.headers import rate_limit_headers
from django_redislua.keys import DRF_SCOPE_KEY, masked
from django_redislua.limiting import Decision, Policy, PolicyError, denials, parse_rate
from django_redislua.limiting.rates import RateError
from django_redislua.limiting.refund import Refund
from django_redislua.request_layer import Outcome, Rule, RuleOrError, decide, rule_for_name
from django_redislua.responses import (
    UNAVAILABLE_RETRY_AFTER,
    mark_logged,
    refund_unless_failed,
    release_all,
)

__all__ = [
    "AnonRateThrottle",
    "PolicyThrottle",
    "RateLimiterUnavailable",
    "ScopedRateThrottle",
    "SimpleRateThrottle",
    "UserRateThrottle",
]


class RateLimiterUnavailable(APIException):
    """The limiter cannot decide and ``REDISLUA["FAIL_OPEN"]`` is False: 503 + Retry-After."""

    status_code = 503
    default_detail = "Service unavailable: the rate limiter cannot be reached."
    default_code = "rate_limiter_unavailable"
    wait = UNAVAILABLE_RETRY_AFTER  # DRF's exception handler turns it into Retry-After


def _after_finalize(view: APIView, callback: Callable[[Any], object]) -> None:
    """Run ``callback(response)`` when DRF finalizes this view's response (one view per request)."""
    finalize_response = view.finalize_response

    def finalize(request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = finalize_response(request, response, *args, **kwargs)
        callback(response)
        return response

    view.finalize_response = finalize  # type: ignore[method-assign]


def _unavailable(view: APIView | None) -> RateLimiterUnavailable:
    """The 503 to raise; Django's request logger will not log it (report_outage did, once)."""
    if view is not None:
        _after_finalize(view, mark_logged)
    return RateLimiterUnavailable()


def _decided(throttle: BaseThrottle, request: Request, view: APIView | None,
             rules: list[RuleOrError], now_us: int | None = None) -> Outcome:
    """The request layer's Outcome for ``rules`` (the decorator's one path: one script call,
    the FAIL_OPEN guard, ``request.ratelimit``, the signal, sent from the throttle's class);
    its 503 raised as :class:`RateLimiterUnavailable`. The rate-limit headers of every
    Decision on ``request.ratelimit`` so far (this view's other throttles' too) are put in
    ``view.headers``; DRF sets Retry-After itself from the largest wait() of them all."""
    outcome = decide(request, rules, type(throttle), now_us=now_us)
    if outcome.unavailable:
        raise _unavailable(view)
    if view is not None and isinstance(getattr(view, "headers", None), dict):
        recorded = getattr(request, "ratelimit", ())
        view.headers.update(rate_limit_headers(recorded, retry_after=False))
    return outcome


def _wait(seconds: float) -> float | None:
    """DRF's wait(): None when no wait can help (DRF then sends no Retry-After)."""
    return None if math.isinf(seconds) else seconds


@functools.lru_cache(maxsize=512)
def scope_policy(name: str, rate: str) -> Policy:
    """The sliding_log policy a scope's throttle decides by (its name keys the Redis state).
    Its key spec says which identities its throttles make (``throttle_<scope>_<ident>``, DRF's
    cache key), for live overrides; the request layer never keys by it."""
    return Policy(name, rate=rate, algorithm="sliding_log", key=f"{DRF_SCOPE_KEY}{name}")


class ThrottleConfigError(ImproperlyConfigured):
    """A throttle's scope has no rate, or its rate is malformed; ``check_id`` reports it."""

    def __init__(self, check_id: str, message: str) -> None:
        super().__init__(message)
        self.check_id = check_id


class SimpleRateThrottle(BaseThrottle):
    """DRF's ``SimpleRateThrottle``, atomic: subclass it and override :meth:`get_cache_key`.

    ``THROTTLE_RATES = None`` (the default) reads ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``
    live; a subclass may set its own dict, or a fixed ``rate``. A ``timer`` other than
    ``time.time`` (tests do this) is sent to the script as "now" instead of the server clock.
    """

    scope: str | None = None
    THROTTLE_RATES: dict[str, str | None] | None = None
    cache_format = "throttle_%(scope)s_%(ident)s"
    timer: Callable[[], float] = time.time
    rate: str | None

    def __init__(self) -> None:
        self.key: str | None = None
        self.decision: Decision | None = None
        self.error: PolicyError | None = None
        self._configure()

    def _configure(self) -> None:
        """Read the rate. A missing or malformed one is kept as ``error`` (the system checks
        report it): DRF builds throttles per request, so raising here would answer 500."""
        try:
            if not getattr(self, "rate", None):
                self.rate = self.get_rate()
            self.num_requests, self.duration = self.parse_rate(self.rate)
        except ImproperlyConfigured as exc:
            self.rate, self.num_requests, self.duration = None, None, None
            self.error = PolicyError(getattr(exc, "check_id", "redislua.E022"), str(exc))

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        """The identity to throttle by; None = do not throttle this request."""
        raise NotImplementedError(".get_cache_key() must be overridden")

    def get_ident(self, request: Request) -> str:  # None without an address, as DRF's
        """DRF's client identity (``NUM_PROXIES`` picks the X-Forwarded-For entry), masked by
        ``IPV4_MASK``/``IPV6_MASK`` like every address this app keys by (one IPv6 client owns a
        whole /64: without the mask it could rotate through it). A missing address is DRF's
        None: every such request shares the one key ``throttle_anon_None``, never an unlimited
        one."""
        ident = super().get_ident(request)
        if not ident:
            return ident  # DRF's: every address-less request shares one key ("..._None")
        return masked(str(ident)) or str(ident)

    def get_rate(self) -> str | None:
        scope = self.scope
        if not scope:
            raise ImproperlyConfigured(
                f"You must set either `.scope` or `.rate` for '{type(self).__name__}' throttle"
            )
        rates: Mapping[str, object]
        if self.THROTTLE_RATES is None:
            rates = api_settings.DEFAULT_THROTTLE_RATES  # read live: DRF reloads it on change
        else:
            rates = self.THROTTLE_RATES
        try:
            rate = rates[scope]
        except KeyError:
            msg = f"No default throttle rate set for '{scope}' scope"
            raise ThrottleConfigError("redislua.E022", msg) from None
        if rate is not None and not isinstance(rate, str):
            raise ThrottleConfigError(
                "redislua.E020",
                f"The throttle rate of scope '{scope}' must be a string such as '100/day' or None, "
                f"not {rate!r}",
            )
        return rate

    def parse_rate(self, rate: str | None) -> tuple[int | None, float | None]:
        """``(requests, seconds)``; every rate form of the engine ("5/10s", "100/day", ...)."""
        if rate is None:
            return (None, None)
        try:
            parsed = parse_rate(rate)
        except RateError as exc:
            raise ThrottleConfigError(
                "redislua.E020",
                f"scope {self.scope!r}: throttle rate {rate!r}: {exc}",
            ) from None
        return (parsed.count, parsed.period)

    def get_policy(self) -> Policy:
        """The sliding_log policy for this scope and rate (its name keys the Redis state)."""
        assert self.rate is not None
        return scope_policy(self.scope or type(self).__name__, self.rate)

    def allow_request(self, request: Request, view: APIView) -> bool:
        self.decision = None
        if not settings.ENABLED:  # the kill switch: admit, ask nothing (get_cache_key included)
            return True
        now_us = None
        rules: list[RuleOrError]
        if self.error is not None:
            rules = [self.error]  # the request layer's guard: admit (FAIL_OPEN, logged) or 503
        else:
            if self.rate is None:
                return True
            key = self.key = self.get_cache_key(request, view)
            if key is None:
                return True
            policy = self.get_policy()
            if self.timer is not time.time:
                # A test's clock (DRF's own tests set one): it may go back to an earlier time,
                # after the test cleared the cache, where a denial this process remembers
                # would still hold.
                now_us = round(self.timer() * 1_000_000)
                denials.forget(policy.redis_key(key))
            rules = [Rule(policy, lambda _request: key, methods=None, cost=1, block=True)]
        decided = _decided(self, request, view, rules, now_us).decisions
        # One check: decided, or nothing when Redis failed and FAIL_OPEN admitted the request.
        self.decision = decided[0] if decided else None
        return self.decision is None or self.decision.allowed

    def wait(self) -> float | None:
        """Seconds until a request would be admitted: after a denial, what DRF computes.

        DRF gives None when the history holds more requests than the rate now allows (the rate
        was lowered); this gives the exact time until enough of them have aged out. 0.0 after an
        admitted request; None when Redis could not be asked (FAIL_OPEN admitted the request).
        """
        return None if self.decision is None else _wait(self.decision.retry_after)


class AnonRateThrottle(SimpleRateThrottle):
    """Anonymous requests, by client address (``get_ident``, ``NUM_PROXIES``); scope ``anon``."""

    scope = "anon"

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        if request.user and request.user.is_authenticated:
            return None  # Only throttle unauthenticated requests.
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


def _user_or_address_key(throttle: SimpleRateThrottle, request: Request) -> str:
    """DRF's key for the user and scoped throttles: the user id, else the client address."""
    if request.user and request.user.is_authenticated:
        ident: Any = request.user.pk
    else:
        ident = throttle.get_ident(request)
    return throttle.cache_format % {"scope": throttle.scope, "ident": ident}


class UserRateThrottle(SimpleRateThrottle):
    """By user id when authenticated, else by client address; scope ``user``."""

    scope = "user"

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        return _user_or_address_key(self, request)


class ScopedRateThrottle(SimpleRateThrottle):
    """Views with ``throttle_scope = "name"`` get the rate of that scope, per user or address."""

    scope_attr = "throttle_scope"

    def __init__(self) -> None:
        # The scope, hence the rate, is known only once the view calls allow_request.
        self.key = None
        self.decision = None
        self.error = None

    def allow_request(self, request: Request, view: APIView) -> bool:
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            self.decision = None
            return True
        self.rate = None
        self._configure()
        return super().allow_request(request, view)

    def get_cache_key(self, request: Request, view: APIView) -> str | None:
        return _user_or_address_key(self, request)


class PolicyThrottle(BaseThrottle):
    """Applies ``REDISLUA["POLICIES"]`` named by the view's ``throttle_policy`` (a name or a list).

    Each policy's ``key``, ``methods``, ``cost`` and callable ``rate`` apply as with the
    decorator, and its state is the same Redis key, so a policy shared by a decorated view and an
    API view is one budget. Several policies are decided by one script call, all-or-nothing. A
    concurrency slot is released when DRF finalizes the response (or lets an exception escape);
    a ``count_failures`` policy's hit is given back then, unless the finalized response is a
    failure (an exception DRF handles is its response; one it lets escape keeps the hit).
    """

    policy_attr = "throttle_policy"

    def __init__(self) -> None:
        self.decisions: list[Decision] = []
        self.blocking: list[Decision] = []

    def get_rules(self, request: Request, view: APIView) -> list[RuleOrError]:
        """The rules of the view's policies (or why one cannot be used): the decorator's rule,
        so methods, callable rate, key and cost apply alike, and the state is the same."""
        names = getattr(view, self.policy_attr, None) or ()
        if isinstance(names, str):
            names = [names]
        return [rule_for_name(name) for name in names]

    def allow_request(self, request: Request, view: APIView) -> bool:
        self.decisions, self.blocking = [], []
        if not settings.ENABLED:
            return True
        outcome = _decided(self, request, view, self.get_rules(request, view))
        self.decisions = list(outcome.made)
        if outcome.held or outcome.refunds:
            _finish_when_done(view, list(outcome.held), outcome.refunds)
        # A policy with "block": False only marks the request (request.limited); it never denies,
        # and neither does one in shadow mode.
        self.blocking = [d for rule, d in zip(outcome.rules, outcome.decisions, strict=True)
                         if rule.block]
        return not outcome.blocked

    def wait(self) -> float | None:
        waits = [d.retry_after for d in getattr(self, "blocking", ()) if not d.allowed]
        return _wait(max(waits)) if waits else None


def _finish_when_done(view: APIView, held: list[Decision], refunds: tuple[Refund, ...]) -> None:
    """As this view (one instance per request) finishes: give back ``refunds`` unless the
    response is a failure (DRF has no end-of-request hook for throttles), and release ``held``
    concurrency slots.

    DRF ends every request in ``finalize_response``, or in ``raise_uncaught_exception`` when no
    exception handler produced a response (a failure: nothing given back); both are wrapped on
    this instance only, and the first to end the request does it, once.
    """
    finished = False

    def finish(request: Request | None, response: Any) -> None:
        nonlocal finished
        if finished:
            return
        finished = True
        if refunds and response is not None:
            refund_unless_failed(request, response, refunds)  # a Redis failure is logged
        if held:
            release_all(held)  # a Redis failure is logged; the lease expires by itself

    finalize_response = view.finalize_response
    raise_uncaught_exception = view.raise_uncaught_exception

    def finalize_and_finish(request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        finalized = None
        try:
            finalized = finalize_response(request, response, *args, **kwargs)
            return finalized
        finally:
            finish(request, finalized)

    def raise_and_finish(exc: Exception) -> Any:
        try:
            raise_uncaught_exception(exc)
        finally:
            finish(None, None)

    view.finalize_response = finalize_and_finish  # type: ignore[method-assign]
    view.raise_uncaught_exception = raise_and_finish  # type: ignore[method-assign]
