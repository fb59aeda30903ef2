"""Demo pages for locks and coordination: open a page in two tabs to see them work together."""

import os
import time
from datetime import datetime, timezone

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from django_redislua.locks import run_once, single_flight, singleton
from django_redislua.locks.inspect import scan_locks


@singleton("demo:nightly-report", timeout="30s")
def nightly_report() -> str:
    """A job that must run on one instance at a time; a second call meanwhile is skipped."""
    time.sleep(5)
    return f"report built by process {os.getpid()} at {datetime.now(timezone.utc):%H:%M:%S} UTC"


@run_once(key=lambda order_id: f"demo:pay:{order_id}", ttl="1h")
def charge(order_id: str) -> str:
    """An idempotent payment callback: the second call returns the first call's receipt."""
    time.sleep(1)
    return f"charged order {order_id} at {datetime.now(timezone.utc):%H:%M:%S.%f} UTC"


def slow_totals() -> dict[str, str]:
    time.sleep(2)  # the expensive query that a stampede would run many times
    return {"built_at": f"{datetime.now(timezone.utc):%H:%M:%S.%f} UTC", "pid": str(os.getpid())}


@require_http_methods(["GET", "POST"])
def coordination(request: HttpRequest) -> HttpResponse:
    outcome = None
    action = request.POST.get("action")
    if action == "report":
        report = nightly_report()
        outcome = report or "skipped: the report is already being built by another request"
    elif action == "pay":
        outcome = charge(request.POST.get("order", "42")[:20])
    elif action == "totals":
        totals = single_flight("demo:totals", slow_totals, ttl=15, lock_timeout=10)
        outcome = f"totals built at {totals['built_at']} by process {totals['pid']}"
    _cursor, held = scan_locks(count=100)
    return render(request, "demo/coordination.html", {"outcome": outcome, "locks": held})
