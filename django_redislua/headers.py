"""Rate-limit response headers from Decisions: IETF RateLimit / RateLimit-Policy, legacy
X-RateLimit-*, and Retry-After. Shared by the decorator, the middleware and the DRF throttles.

IETF form (draft-ietf-httpapi-ratelimit-headers-11: Structured Field Lists of Items, one item
per policy, the item a String naming the policy)::

    RateLimit-Policy: "login";q=5;w=60, "api";q=20;w=12, "export";q=2;qu="concurrent-requests"
    RateLimit: "login";r=0;t=42, "api";r=19;t=1, "export";r=1

``q`` is the quota (the Decision's ``limit``) and ``w`` the window in seconds, so that ``q``
per ``w`` is the policy's sustained rate (a calendar quota's ``w`` is its current period: this
month's length); ``r`` is what remains and ``t`` the effective window (see
:func:`effective_window`: a calendar quota's reset, the period's end). A concurrency policy
counts requests in flight: its unit is ``qu="concurrent-requests"`` (draft -11 section 3.1.2;
the default unit, "requests", is never written) and it has no time window, so neither ``w``
nor ``t`` is sent (the draft's own example of a quota without a time window, section 4.2,
sends no ``t``). The legacy
``X-RateLimit-Limit/Remaining/Reset`` headers can describe one policy only: the one closest to
denying (least remaining) speaks for the response. ``X-RateLimit-Reset`` is in seconds from
now, not an epoch time.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from django_redislua.conf import settings
from django_redislua.limiting.calendar import period_seconds
from django_redislua.limiting.decision import Decision, allowed_of
from django_redislua.limiting.definition import CALENDAR, WINDOW_ALGORITHMS, PolicyDefinition

# draft-ietf-httpapi-ratelimit-headers-11, section 3.1.2: the quota unit of a concurrency limit.
CONCURRENT_REQUESTS = "concurrent-requests"


def window_seconds(decision: Decision) -> int | None:
    """The ``w`` parameter: the policy's window in whole seconds (rounded up); None for a
    concurrency policy."""
    return _window_of(decision.policy)


def _window_of(policy: PolicyDefinition) -> int | None:
    if policy.rate is None:  # concurrency: a count of requests in flight, not a rate
        return None
    if policy.rate.calendar is not None and policy.algorithm == CALENDAR:
        # A calendar quota's window is its period now: a month of 28 to 31 days, a day of 23
        # to 25 hours across a DST change.
        return max(1, period_seconds(policy.calendar_bounds()))
    if policy.algorithm in WINDOW_ALGORITHMS:
        return max(1, math.ceil(policy.rate.period))
    # Buckets: the time an empty bucket takes to refill to its capacity.
    return max(1, math.ceil(policy.interval_us * policy.limit / 1_000_000))


def effective_window(decision: Decision) -> int | None:
    """The ``t`` parameter: whole seconds (rounded up) within which ``r`` is all the client
    should spend (draft -11 section 4.1.2); None for a concurrency policy, which has no window.

    Allowed: until the policy's state is full again (``reset_after``: the end of a fixed
    window, the last hit of a log or a window ageing out, a bucket refilled). Denied: until the
    same request would be admitted (``retry_after``), because a response carrying Retry-After
    "SHOULD NOT reference a point in time earlier than the end of the effective window"
    (section 6), and the full reset can come long after the request fits again. A denial no
    wait can lift (a zero rate, a cost above capacity) keeps ``reset_after``: it sends no
    Retry-After.
    """
    if decision.policy.rate is None:
        return None
    seconds = decision.reset_after
    if not decision.allowed and not math.isinf(decision.retry_after):
        seconds = decision.retry_after
    return max(0, math.ceil(seconds))


def policy_label(name: str) -> str:
    """The policy's name as the headers carry it: printable ASCII only (what a Structured
    Field String may hold), so a problem body names policies exactly as the headers do."""
    return "".join(c for c in name if 0x20 <= ord(c) < 0x7F)


@functools.lru_cache(maxsize=1024)  # a policy's name, on every response it decides
def _sf_string(name: str) -> str:
    """A Structured Field String: printable ASCII, with backslash and quote escaped."""
    return '"' + policy_label(name).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _policy_item(decision: Decision) -> str:
    """The decision's item of ``RateLimit-Policy``: the same on every response of its policy
    and quota (remembered), but a calendar quota's, whose window is the current period."""
    policy = decision.policy
    if policy.algorithm == CALENDAR:
        return _item(policy.name, decision.limit, _window_of(policy))
    return _kept_item(policy, decision.limit)


@functools.lru_cache(maxsize=1024)  # by policy object and quota: on every response it decides
def _kept_item(policy: PolicyDefinition, limit: int) -> str:
    return _item(policy.name, limit, _window_of(policy))


def _item(name: str, limit: int, window: int | None) -> str:
    if window is None:
        return f'{_sf_string(name)};q={limit};qu="{CONCURRENT_REQUESTS}"'
    return f"{_sf_string(name)};q={limit};w={window}"


def retry_after_seconds(decisions: Sequence[Decision]) -> int | None:
    """Whole seconds to wait, rounded up so it is never earlier than the true wait; 0 when
    nothing was denied; None when no wait can help (a zero rate, a cost above capacity)."""
    waits = [d.retry_after for d in decisions if not d.allowed]
    if not waits:
        return 0
    longest = max(waits)
    if math.isinf(longest):
        return None
    return max(1, math.ceil(longest))


def rate_limit_headers(
    decisions: Sequence[Decision], mode: str | None = "settings", *, retry_after: bool = True
) -> dict[str, str]:
    """The headers for a response decided by ``decisions`` (empty list: no headers).

    ``mode`` is ``"ietf"``, ``"legacy"``, ``"both"`` or None; by default ``REDISLUA["HEADERS"]``.
    With ``retry_after``, ``Retry-After`` is set whenever a decision denied, whatever the mode,
    unless no wait can help (then it is left out rather than promising a retry that fails).
    """
    if mode == "settings":
        mode = settings.HEADERS
    headers: dict[str, str] = {}
    if not decisions:
        return headers
    denied = [] if all(map(allowed_of, decisions)) else [d for d in decisions if not d.allowed]
    if denied and retry_after:
        wait = retry_after_seconds(decisions)
        if wait is not None:
            headers["Retry-After"] = str(wait)
    if mode is None:
        return headers
    if mode in ("ietf", "both"):
        policies, limits = [], []
        for d in decisions:
            policies.append(_policy_item(d))
            t = effective_window(d)
            limits.append(f"{_sf_string(d.policy.name)};r={max(0, d.remaining)}"
                          + ("" if t is None else f";t={t}"))
        headers["RateLimit-Policy"] = ", ".join(policies)
        headers["RateLimit"] = ", ".join(limits)
    if mode in ("legacy", "both"):
        # The policy nearest to denying speaks for the response.
        tightest = min(denied or decisions, key=lambda d: (d.remaining, -d.reset_after))
        headers["X-RateLimit-Limit"] = str(tightest.limit)
        headers["X-RateLimit-Remaining"] = str(max(0, tightest.remaining))
        headers["X-RateLimit-Reset"] = str(max(0, math.ceil(tightest.reset_after)))
    return headers
