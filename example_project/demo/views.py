"""One page per feature of the views layer; each decision is one EVALSHA on the Redis clock."""

from __future__ import annotations

import re
import secrets
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from django_redislua.decorators import ratelimit
from django_redislua.recipes import Inventory, QueueFull, RecipeUnavailable, Task, WorkQueue


def index(request: HttpRequest) -> HttpResponse:
    return render(request, "demo/index.html")


@ratelimit("demo", block=False)
def limited(request: HttpRequest) -> HttpResponse:
    """The "demo" policy: 5 requests a minute per IP. block=False so the page can explain the
    denial itself; it still answers 429 then, and the decorator adds Retry-After."""
    decision = request.ratelimit[0] if request.ratelimit else None  # type: ignore[attr-defined]
    status = 429 if request.limited else 200  # type: ignore[attr-defined]
    return render(request, "demo/limited.html", {"decision": decision}, status=status)


@require_http_methods(["GET", "POST"])
@ratelimit("login")
def login_form(request: HttpRequest) -> HttpResponse:
    """The "login" policy counts POSTs only (5 a minute per IP): reading the form is free."""
    submitted = request.POST.get("username") if request.method == "POST" else None
    return render(request, "demo/login.html", {"submitted": submitted})


@ratelimit("api")
def api(request: HttpRequest) -> JsonResponse:
    """A JSON endpoint on the "api" policy (GCRA, 100/m, bursts of 20)."""
    decision = request.ratelimit[0] if request.ratelimit else None  # type: ignore[attr-defined]
    return JsonResponse({
        "ok": True,
        "remaining": decision.remaining if decision else None,
        "limit": decision.limit if decision else None,
    })


@ratelimit(rate="3/10s", key="ip", algorithm="fixed_window", group="demo-burst")
@ratelimit(rate="10/m", key="ip", algorithm="sliding_log", group="demo-sustained")
def stacked(request: HttpRequest) -> HttpResponse:
    """Two policies, one script call: 3 per 10 s AND 10 per minute. A request denied by one
    consumes nothing from the other."""
    return render(request, "demo/stacked.html", {"decisions": request.ratelimit})  # type: ignore[attr-defined]


@ratelimit("search")
@ratelimit("search-v2")
def shadow(request: HttpRequest) -> HttpResponse:
    """A new, stricter limit tried in shadow mode beside the enforced one: "search-v2" (3/m)
    is decided and counted like "search", but never blocks and sends no headers."""
    return render(request, "demo/shadow.html", {
        "enforced": request.ratelimit,  # type: ignore[attr-defined]
        "shadow": getattr(request, "ratelimit_shadow", []),
    })


def metrics(request: HttpRequest) -> HttpResponse:
    """What Prometheus scrapes: this process's redislua_* metrics (prometheus_client)."""
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    except ImportError:
        return HttpResponse("prometheus_client is not installed: pip install "
                            "'django-redislua[prometheus]'\n", status=501,
                            content_type="text/plain")
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


@ratelimit("async-demo")
async def async_limited(request: HttpRequest) -> HttpResponse:
    """An ``async def`` view: decided by the asyncio Redis client, no thread hop. Its policy is
    its own ("async-demo", 5 a minute per IP), so the /limited/ page's reloads do not spend it."""
    return HttpResponse("async ok\n", content_type="text/plain")


@ratelimit("hello")
def hello(request: HttpRequest) -> HttpResponse:
    """README's quickstart view: the "hello" policy, 3 requests a minute per IP (fixed window)."""
    return HttpResponse("Hello!\n", content_type="text/plain")


# -- recipes -----------------------------------------------------------------------------------
SALE = Inventory("flash-sale", ttl="1d")
SKU = "demo-tee"
SALE_UNITS = 20
JOBS = WorkQueue("demo-jobs", max_in_flight=3, visibility_timeout="30s", max_length=50,
                 max_attempts=3)
# An order id is made per form render; anything longer or stranger is not ours.
_ORDER_ID = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
_REASONS = {
    "ok": "Bought: the order holds its units.",
    "duplicate_order": "This order was placed already: nothing more was taken (a retry is safe).",
    "insufficient": "Sold out: not enough units left for this order.",
    "refunded": "Refunded: the units went back to the stock.",
    "already_given_back": "This order was refunded already: nothing changed.",
    "unknown_order": "No order with this id took any units.",
}


def _new_order_id() -> str:
    return secrets.token_urlsafe(12)


@require_http_methods(["GET", "POST"])
@ratelimit("flash-sale", block=False)
def flash_sale(request: HttpRequest) -> HttpResponse:
    """An Inventory of 20 units behind the "flash-sale" policy (5 POSTs a minute per IP). Each
    form render carries a fresh order id, so a double submit or a retry of the same form takes
    once: the take is one script that records the order id with the units it took."""
    context: dict[str, Any] = {"units": SALE_UNITS, "sku": SKU}
    status = 200
    try:
        # Opened on the first visit (and again once the sale's keys expire): if_absent leaves
        # a sale already selling as it is, however many visits race here.
        SALE.set(SKU, SALE_UNITS, if_absent=True)
        if request.method == "POST":
            status, result = _sale_action(request)
            context.update(result)
        context["left"] = SALE.level(SKU)
    except RecipeUnavailable as exc:
        context["error"] = f"Redis is unavailable: {exc}"
        status = 503
    context["order_id"] = _new_order_id()
    return render(request, "demo/flash_sale.html", context, status=status)


def _sale_action(request: HttpRequest) -> tuple[int, dict[str, Any]]:
    if request.limited:  # type: ignore[attr-defined]
        decision = request.ratelimit[0]  # type: ignore[attr-defined]
        return 429, {"reason": "rate_limited",
                     "message": f"Too many orders from your address: try again in "
                                f"{decision.retry_after:.0f} s. Nothing was taken."}
    action = request.POST.get("action", "buy")
    if action == "restart":
        SALE.clear(SKU)
        SALE.set(SKU, SALE_UNITS)
        return 200, {"reason": "restarted",
                     "message": f"The sale starts again: {SALE_UNITS} units."}
    order_id = request.POST.get("order_id", "")
    if not _ORDER_ID.match(order_id):
        return 400, {"reason": "bad_order_id", "message": "That is not an order id of this form."}
    if action == "refund":
        taken = SALE.give_back(SKU, order_id)
        reason = "refunded" if taken.ok else taken.reason
    else:
        try:
            qty = int(request.POST.get("qty", "1"))
        except ValueError:
            qty = 0
        if not 1 <= qty <= 3:
            return 400, {"reason": "bad_qty", "message": "Buy 1 to 3 units."}
        taken = SALE.take(SKU, qty, order_id=order_id)
        reason = taken.reason
    return 200, {"reason": reason, "ok": taken.ok, "message": _REASONS[reason],
                 "placed": order_id if action == "buy" and taken.ok else None}


@require_http_methods(["GET", "POST"])
def queue(request: HttpRequest) -> HttpResponse:
    """A WorkQueue: put tasks, claim one (it is yours for 30 s), ack or release it. At most 3
    tasks are claimed at once; a claim left alone past 30 s returns its task to the queue."""
    context: dict[str, Any] = {}
    status = 200
    try:
        if request.method == "POST":
            status, result = _queue_action(request)
            context.update(result)
        context["stats"] = JOBS.stats()
    except RecipeUnavailable as exc:
        context["message"] = f"Redis is unavailable: {exc}"
        status = 503
    return render(request, "demo/queue.html", context, status=status)


def _queue_action(request: HttpRequest) -> tuple[int, dict[str, Any]]:
    action = request.POST.get("action", "")
    if action == "put":
        payload = request.POST.get("payload", "").strip()[:200] or "send the newsletter"
        try:
            task_id = JOBS.put({"job": payload})
        except QueueFull:
            return 200, {"message": "The queue is full (50 tasks): nothing was added."}
        return 200, {"message": f"Put task {task_id}."}
    if action == "claim":
        task = JOBS.claim()
        if task is None:
            return 200, {"message": "Nothing to claim: no task is pending, or 3 are claimed."}
        return 200, {"message": f"Claimed task {task.id} (attempt {task.attempts}).",
                     "task": task}
    if action in ("ack", "release"):
        task_id, token = request.POST.get("task_id", ""), request.POST.get("token", "")
        if not task_id.isdigit() or not _TOKEN.match(token):
            return 400, {"message": "That is not a claim of this queue."}
        claim = Task(id=task_id, payload=None, token=token, attempts=0, deadline=0.0)
        done = JOBS.ack(claim) if action == "ack" else JOBS.release(claim)
        if not done:
            text = (f"Nothing changed: this claim no longer holds task {task_id} (acked or "
                    f"released already, or it expired and the task went back to the queue).")
        else:
            text = (f"Task {task_id} is done." if action == "ack" else
                    f"Task {task_id} went back to the queue.")
        return 200, {"message": text, "done": done}
    return 400, {"message": "Put, claim, ack or release."}
