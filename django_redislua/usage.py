"""What a request's identity has used of each policy: for an "API usage" page or a ``/usage``
endpoint, read in one call (a peek of every policy at once: one round trip, one per cluster
node), consuming nothing.

Each policy is read as the request would be decided: its key, its rate callable, the plan the
request is on (``REDISLUA["PLANS"]``), its timezone callable, live overrides. A policy whose key
says the request is not limited, or whose plan makes it unlimited, is left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest

from django_redislua.conf import settings
from django_redislua.headers import window_seconds
from django_redislua.limiting import engine
from django_redislua.limiting.calendar import now_us
from django_redislua.limiting.decision import Decision, PolicyError
from django_redislua.limiting.definition import CALENDAR
from django_redislua.limiting.engine import Check
from django_redislua.limiting.registry import get_policy
from django_redislua.plans import plan_of
from django_redislua.reporting import report_broken
from django_redislua.request_layer import Rule, rule_for_policy

__all__ = ["Usage", "ausage", "usage"]


@dataclass(frozen=True)
class Usage:
    """One policy's use by one identity, as its next request would meet it."""

    policy: str
    algorithm: str
    limit: int  # the quota (the plan's, a live override's) or a concurrency policy's slots
    used: int
    remaining: int
    # When the quota is whole again (aware: UTC, a calendar quota's in its timezone); None: it is
    reset_at: datetime | None
    window: int | None  # seconds (a calendar quota's: its current period); None: concurrency
    plan: str | None  # the plan the request is on, when a plan names this policy
    period: str | None = None  # a calendar quota's: "hour", "day", "week" or "month"
    timezone: str | None = None  # a calendar quota's periods' zone

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the reset time as ISO 8601 (a calendar quota's in its own timezone)."""
        return {
            "policy": self.policy, "algorithm": self.algorithm, "limit": self.limit,
            "used": self.used, "remaining": self.remaining,
            "reset_at": None if self.reset_at is None else self.reset_at.isoformat(),
            "window": self.window, "plan": self.plan, "period": self.period,
            "timezone": self.timezone,
        }


def _checks(request: HttpRequest, names: Iterable[str] | None) -> list[tuple[Rule, Check]]:
    found: list[tuple[Rule, Check]] = []
    for name in (settings.POLICIES if names is None else names):
        try:
            rule = rule_for_policy(get_policy(name), methods=None)  # any method's usage
            check = rule.check(request)
        except PolicyError as exc:
            report_broken(exc)  # a usage page shows the policies that work
            continue
        if check is not None:
            found.append((rule, check))
    return found


def _usage(request: HttpRequest, rule: Rule, decision: Decision) -> Usage:
    policy = decision.policy
    now = now_us() / 1_000_000
    reset_at = None
    if decision.reset_after > 0:
        # A calendar quota's reset is its period's end, a whole second: said in its timezone.
        calendar = policy.algorithm == CALENDAR
        at = now + decision.reset_after
        reset_at = datetime.fromtimestamp(round(at) if calendar else at, UTC)
        if calendar:
            reset_at = reset_at.astimezone(policy.calendar_zone())
    remaining = max(0, decision.remaining)
    calendar_period = policy.rate.calendar if policy.algorithm == CALENDAR and policy.rate else None
    return Usage(
        policy=policy.name, algorithm=policy.algorithm, limit=decision.limit,
        used=max(0, decision.limit - remaining), remaining=remaining, reset_at=reset_at,
        window=window_seconds(decision),
        plan=plan_of(request) if rule.policy.plans is not None else None,
        period=calendar_period,
        timezone=str(policy.calendar_zone()) if calendar_period is not None else None,
    )


def usage(request: HttpRequest, policies: Sequence[str] | None = None) -> list[Usage]:
    """The request's identity's use of each policy of ``REDISLUA["POLICIES"]`` (or of
    ``policies``, names), in one call that consumes nothing. Redis failing raises its error
    (a usage page has nothing to show)."""
    pairs = _checks(request, policies)
    if not pairs:
        return []
    decisions = engine.evaluate([check for _rule, check in pairs], peek=True)
    return [_usage(request, rule, d) for (rule, _check), d in zip(pairs, decisions, strict=True)]


async def ausage(request: HttpRequest, policies: Sequence[str] | None = None) -> list[Usage]:
    """The asyncio twin of :func:`usage`."""
    pairs = _checks(request, policies)
    if not pairs:
        return []
    decisions = await engine.aevaluate([check for _rule, check in pairs], peek=True)
    return [_usage(request, rule, d) for (rule, _check), d in zip(pairs, decisions, strict=True)]
