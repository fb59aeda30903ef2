"""Rate-limit response headers from Decisions: IETF RateLimit / RateLimit-Policy, legacy
X-RateLimit-*, and Retry-After. Shared by the decorator, the middleware and the DRF throttles.

IETF form (draft-ietf-httpapi-ratelimit-headers, structured fields)::

    RateLimit-Policy: "login";q=5;w=60
    RateLimit: "login";r=0;t=42

The header describes the policy closest to denying (the least remaining), as the draft asks for
one quota-unit view per response; every policy is listed in RateLimit-Policy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from django_redislua.conf import settings
from django_redislua.limiting.policy import Decision


def _window_seconds(decision: Decision) -> int:
    policy = decision.policy
    if policy.rate is not None and policy.algorithm in ("fixed_window", "sliding_log", "sliding_window"):
        return max(1, math.ceil(policy.rate.period))
    if policy.rate is not None:  # buckets: the time a full burst takes to refill
        return max(1, math.ceil(policy.param * policy.limit / 1_000_000))
    return max(1, math.ceil(policy.timeout or 1))


def _sf_string(name: str) -> str:
    safe = "".join(c for c in name if 0x20 <= ord(c) < 0x7F and c not in '"\\')
    return f'"{safe}"'


def retry_after_seconds(decisions: Sequence[Decision]) -> int:
    """Whole seconds to wait, rounded up so it is never earlier than the true wait."""
    wait = max((d.retry_after for d in decisions if not d.allowed), default=0.0)
    return max(1, math.ceil(wait)) if any(not d.allowed for d in decisions) else 0


def rate_limit_headers(decisions: Sequence[Decision], mode: str | None = "settings") -> dict[str, str]:
    """The headers for a response decided by ``decisions`` (empty list: no headers)."""
    if mode == "settings":
        mode = settings.HEADERS
    headers: dict[str, str] = {}
    if not decisions:
        return headers
    denied = [d for d in decisions if not d.allowed]
    if denied:
        headers["Retry-After"] = str(retry_after_seconds(decisions))
    if mode is None:
        return headers
    # The policy nearest to denying speaks for the response.
    tightest = min(denied or decisions, key=lambda d: (d.remaining, -d.reset_after))
    reset = max(0, math.ceil(tightest.reset_after))
    if mode in ("ietf", "both"):
        headers["RateLimit-Policy"] = ", ".join(
            f"{_sf_string(d.policy.name)};q={d.limit};w={_window_seconds(d)}" for d in decisions
        )
        headers["RateLimit"] = (
            f"{_sf_string(tightest.policy.name)};r={max(0, tightest.remaining)};t={reset}"
        )
    if mode in ("legacy", "both"):
        headers["X-RateLimit-Limit"] = str(tightest.limit)
        headers["X-RateLimit-Remaining"] = str(max(0, tightest.remaining))
        headers["X-RateLimit-Reset"] = str(reset)
    return headers
