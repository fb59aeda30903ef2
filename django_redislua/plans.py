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
from typing import Any

from django.http import HttpRequest

from django_redislua.conf import settings
from django_redislua.limiting.definition import PolicyDefinition, resolve_callable
from django_redislua.limiting.errors import PolicyError
from django_redislua.reporting import report_rate_callable

__all__ = ["plan_of", "planned"]

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
