"""API quotas (docs/quotas.md): a burst limit and a monthly calendar quota on one JSON
endpoint, decided at the rates of the caller's plan, and a usage endpoint that reads both
without spending any. The plan comes from ``?plan=`` here; a real project asks its billing."""

from django.http import HttpRequest, JsonResponse

from django_redislua.decorators import ratelimit
from django_redislua.usage import usage


def plan_of(request: HttpRequest) -> str | None:
    """REDISLUA["PLAN"]: the caller's plan ("free" or "pro"; none: the policies' own rates)."""
    return request.GET.get("plan") or None


@ratelimit("quota-burst")
@ratelimit("quota-monthly")
def quota(request: HttpRequest) -> JsonResponse:
    """10 a minute and 50 a month (free), 100 a minute and 5,000 a month (pro)."""
    return JsonResponse({"ok": True, "plan": plan_of(request)})


def quota_usage(request: HttpRequest) -> JsonResponse:
    """What the caller has used of both, reset times in the quota's timezone."""
    return JsonResponse({"usage": [u.as_dict() for u in usage(
        request, ["quota-burst", "quota-monthly"])]})
