"""Demo pages for locks and coordination: open a page in two tabs to see them work together."""

import os
import time
from datetime import UTC, datetime

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from django_redislua.locks import (
    LeaseLost,
    Lock,
    LockNotAcquired,
    run_once,
    single_flight,
    singleton,
)
from django_redislua.locks.inspect import scan_locks


@singleton("demo:nightly-report", timeout="30s")
def nightly_report() -> str:
    """A job that must run on one instance at a time; a second call meanwhile is skipped."""
    time.sleep(5)
    return f"report built by process {os.getpid()} at {datetime.now(UTC):%H:%M:%S} UTC"


@run_once(key=lambda order_id: f"demo:pay:{order_id}", ttl="1h")
def charge(order_id: str) -> str:
    """An idempotent payment callback: the second call returns the first call's receipt."""
    time.sleep(1)
    return f"charged order {order_id} at {datetime.now(UTC):%H:%M:%S.%f} UTC"


def slow_totals() -> dict[str, str]:
    time.sleep(2)  # the expensive query that a stampede would run many times
    return {"built_at": f"{datetime.now(UTC):%H:%M:%S.%f} UTC", "pid": str(os.getpid())}


def take_a_turn() -> str:
    """Each request holds the lock 2 s. Pressed in several tabs, the turns come in the order the
    buttons were pressed (first come, first served), each with a larger fencing token."""
    asked = time.monotonic()
    try:
        with Lock("demo:turn", timeout=10, blocking_timeout=15) as lock:
            waited = time.monotonic() - asked
            time.sleep(2)  # the protected work; a storage write would carry lock.token
            return f"turn with fencing token {lock.token}, after waiting {waited:.2f} s"
    except LockNotAcquired:
        return "no turn within 15 s"
    except LeaseLost:
        return "the lease was lost while working: another request may have had a turn too"


@require_http_methods(["GET", "POST"])
def coordination(request: HttpRequest) -> HttpResponse:
    outcome = None
    action = request.POST.get("action")
    if action == "report":
        try:
            report = nightly_report()
        except LeaseLost:
            report = "built, but the lease was lost meanwhile: another request may have too"
        outcome = report or "skipped: the report is already being built by another request"
    elif action == "pay":
        outcome = charge(request.POST.get("order", "42")[:20])
    elif action == "turn":
        outcome = take_a_turn()
    elif action == "totals":
        totals = single_flight("demo:totals", slow_totals, ttl=15, lock_timeout=10)
        outcome = f"totals built at {totals['built_at']} by process {totals['pid']}"
    _cursor, held = scan_locks(count=100)
    return render(request, "demo/coordination.html", {"outcome": outcome, "locks": held})
