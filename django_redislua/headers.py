"""Rate-limit response headers from Decisions: IETF RateLimit / RateLimit-Policy, legacy
X-RateLimit-*, and Retry-After. Shared by the decorator, the middleware and the DRF throttles.

IETF form (draft-ietf-httpapi-ratelimit-headers-10, Structured Field Lists of Items, one item
per policy, the item a String naming the policy)::

    RateLimit-Policy: "login";q=5;w=60, "api";q=20;w=12
    RateLimit: "login";r=0;t=42, "api";r=19;t=1

``q`` is the quota (the Decision's ``limit``), ``w`` the window in seconds (omitted for
concurrency policies, which have no window), ``r`` what remains and ``t`` the whole seconds
until the quota is full again. The legacy ``X-RateLimit-Limit/Remaining/Reset`` headers can
describe one policy only: the one closest to denying (least remaining) speaks for the response.
``X-RateLimit-Reset`` is in seconds from now, not an epoch time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from django_redislua.conf import settings
from django_redislua.limiting.policy import WINDOW_ALGORITHMS, Decision


def _window_seconds(decision: Decision) -> int | None:
    policy = decision.policy
    if policy.rate is None:  # concurrency: a count of requests in flight, not a rate
        return None
    if policy.algorithm in WINDOW_ALGORITHMS:
        return max(1, math.ceil(policy.rate.period))
    # Buckets: the time an empty bucket takes to refill to its capacity.
    return max(1, math.ceil(policy.interval_us * policy.limit / 1_000_000))


def _sf_string(name: str) -> str:
    """A Structured Field String: printable ASCII, with backslash and quote escaped."""
    printable = "".join(c for c in name if 0x20 <= ord(c) < 0x7F)
    return '"' + printable.replace("\\", "\\\\").replace('"', '\\"') + '"'


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
    denied = [d for d in decisions if not d.allowed]
    wait = retry_after_seconds(decisions)
    if denied and retry_after and wait is not None:
        headers["Retry-After"] = str(wait)
    if mode is None:
        return headers
    if mode in ("ietf", "both"):
        items = []
        for d in decisions:
            window = _window_seconds(d)
            items.append(f"{_sf_string(d.policy.name)};q={d.limit}"
                         + ("" if window is None else f";w={window}"))
        headers["RateLimit-Policy"] = ", ".join(items)
        headers["RateLimit"] = ", ".join(
            f"{_sf_string(d.policy.name)};r={max(0, d.remaining)}"
            f";t={max(0, math.ceil(d.reset_after))}"
            for d in decisions
        )
    if mode in ("legacy", "both"):
        # The policy nearest to denying speaks for the response.
        tightest = min(denied or decisions, key=lambda d: (d.remaining, -d.reset_after))
        headers["X-RateLimit-Limit"] = str(tightest.limit)
        headers["X-RateLimit-Remaining"] = str(max(0, tightest.remaining))
        headers["X-RateLimit-Reset"] = str(max(0, math.ceil(tightest.reset_after)))
    return headers
