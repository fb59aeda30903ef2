"""Plans: the rates a request is decided at, by the plan its identity is on.

``REDISLUA["PLANS"]`` maps a plan's name to the rates of the policies it changes (a rate, or
None for unlimited); ``REDISLUA["PLAN"]`` is the callable ``(request) -> plan name`` (or its
dotted path) that picks a request's plan, called once per request. A policy a plan names is
decided at that plan's rate; on a plan that does not name it (or for a request on no plan,
None), at its own. What a plan's rate is kept beside each identity's state with the plan's
name, so the admin shows both (see limiting/definition.py, ``on_plan``).

Never a way around a limit: a PLAN callable that raises or returns an unknown plan is logged
(redislua.E034, once a minute) and the request is decided at the policies' own rates.
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any

from django.http import HttpRequest

from django_redislua.conf import settings
from django_redislua.limiting.definition import PolicyDefinition
from django_redislua.limiting.errors import PolicyError
from django_redislua.limiting.options import resolve_callable
from django_redislua.limiting.registry import build_policy
from django_redislua.reporting import report_rate_callable

__all__ = ["plan_of", "plan_problems", "planned"]

_UNSET = object()
_ATTRIBUTE = "_redislua_plan"  # the request's plan, once its PLAN callable was asked


@functools.cache
def _plan_callable(spec: Any) -> Any:
    return resolve_callable(spec, "redislua.E034", "REDISLUA['PLAN']")


def plan_of(request: HttpRequest) -> str | None:
    """The plan ``request`` is on: what ``REDISLUA["PLAN"]`` returns for it (asked once per
    request), None without a PLAN or when it returns None, an unknown plan or raises (both
    logged as redislua.E034)."""
    known = getattr(request, _ATTRIBUTE, _UNSET)
    if known is not _UNSET:
        return known  # type: ignore[return-value]
    plan: str | None = None
    spec = settings.PLAN
    if spec is not None:
        try:
            found = _plan_callable(spec)(request)
        except PolicyError as exc:  # the dotted path does not import: the check says so too
            report_rate_callable(exc, "plan")
        except Exception as exc:  # the callable is the user's code: any mistake of it
            error = PolicyError(
                "redislua.E034", f"REDISLUA['PLAN'] raised {type(exc).__name__}: "
                f"{str(exc)[:200]}; the request is decided at the policies' own rates")
            error.__cause__ = exc  # logged with its traceback
            report_rate_callable(error, "plan")
        else:
            if found is None or (isinstance(found, str) and found in settings.PLANS):
                plan = found
            else:
                report_rate_callable(PolicyError(
                    "redislua.E034", f"REDISLUA['PLAN'] returned {found!r:.60}, which is no "
                    f"plan of REDISLUA['PLANS'] ({', '.join(sorted(settings.PLANS))}); the "
                    "request is decided at the policies' own rates"), "plan")
    # A request object that takes no attribute is asked again next time.
    with contextlib.suppress(AttributeError):
        setattr(request, _ATTRIBUTE, plan)
    return plan


def planned(policy: PolicyDefinition, request: HttpRequest) -> PolicyDefinition | None:
    """``policy`` (one a plan names) at the rate of ``request``'s plan, or at its own when the
    plan does not name it; None when the plan makes it unlimited."""
    plan = plan_of(request)
    assert policy.plans is not None
    if plan is not None and plan in policy.plans:
        rate = policy.plans[plan]
        if rate is None:
            return None
    else:
        rate = str(policy.rate_spec)
    return policy.on_plan(plan or "", rate)


_PLAN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,24}")


def plan_problems(config: dict[str, Any]) -> list[str]:
    """What the system check says of ``REDISLUA``'s PLANS and PLAN (redislua.E034): PLANS a
    dict of plans (names of at most 24 letters, digits, ``_.-``), each a dict of policies of
    POLICIES to a rate each can take (or None); PLAN a callable or the dotted path of one,
    given exactly when PLANS is."""
    plans, spec = config.get("PLANS", {}), config.get("PLAN")
    if not isinstance(plans, dict):
        return [f"REDISLUA['PLANS'] must be a dict of plans, not {type(plans).__name__}."]
    messages: list[str] = []
    if bool(plans) != (spec is not None):
        given, missing = ("PLANS", "PLAN") if plans else ("PLAN", "PLANS")
        messages.append(f"REDISLUA['{given}'] is set but not REDISLUA['{missing}']: no request "
                        "would be decided on a plan.")
    if spec is not None:
        try:
            resolve_callable(spec, "redislua.E034", "REDISLUA['PLAN']")
        except PolicyError as exc:
            messages.append(str(exc))
    policies = config.get("POLICIES", {})
    policies = policies if isinstance(policies, dict) else {}
    for plan, rates in plans.items():
        if not isinstance(plan, str) or not _PLAN_NAME.fullmatch(plan):
            messages.append(f"plan name {plan!r:.40} must be 1 to 24 letters, digits, '_', '.' "
                            "or '-'.")
        elif not isinstance(rates, dict):
            messages.append(f"plan {plan!r} must be a dict of policy names to rates, not "
                            f"{type(rates).__name__}.")
        else:
            for name, rate in rates.items():
                messages += _plan_rate(plan, name, rate, policies)
    return messages


def _plan_rate(plan: str, name: Any, rate: Any, policies: dict[str, Any]) -> list[str]:
    where = f"plan {plan!r}: policy {name!r:.60}"
    if name not in policies:
        return [f"{where} is not in REDISLUA['POLICIES']."]
    try:
        policy = build_policy(name, policies[name])
    except PolicyError:
        return []  # the policies' own check reports it
    if policy._rate_callable is not None or policy.algorithm == "concurrency":
        what = "takes its rate from a callable" if policy._rate_callable else "counts slots"
        return [f"{where} {what}: a plan gives a rate to a policy with a rate of its own."]
    if rate is None:
        return []
    try:
        if not isinstance(rate, str):
            raise PolicyError("redislua.E034", f"a rate is a string such as '1000/month', not "
                                               f"{type(rate).__name__}")
        policy.with_rate(rate)
    except PolicyError as exc:
        return [f"{where}: {exc}"]
    return []
