"""The request layer's answers: the 429 (``DENIED_VIEW``) and the 503, the rate-limit headers
put on a response, and what is given back once a response is made: the hits of
``count_failures`` policies unless the response is a failure, concurrency slots when it is
done. :mod:`django_redislua.request_layer` decides; this answers by what it decided.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from asgiref.sync import async_to_sync, iscoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.log import log_response
from django.utils.module_loading import import_string

from django_redislua.conf import settings
from django_redislua.connection import CLIENT_ERRORS
from django_redislua.headers import rate_limit_headers
from django_redislua.limiting.decision import Decision, RateLimited
from django_redislua.limiting.definition import PolicyDefinition
from django_redislua.limiting.engine import releasing
from django_redislua.limiting.refund import Refund, refunding
from django_redislua.problem import quota_exceeded_response
from django_redislua.protocol import Invoke, Protocol
from django_redislua.reporting import report_failure_callable, report_outage, report_refund_failed
from django_redislua.transport import run

UNAVAILABLE_RETRY_AFTER = 1  # seconds, on every 503 this app answers


# -- responses -----------------------------------------------------------------------------------
def add_headers(
    response: HttpResponseBase, decisions: Sequence[Decision], *, denied: bool = False
) -> None:
    """Rate-limit headers per ``REDISLUA["HEADERS"]``; headers already set are kept.

    ``Retry-After`` only when ``denied``: the response is a denial (this app's 429, or a 429 a
    view rendered itself for a ``block=False`` rule). A 200 has nothing to retry.
    """
    headers = response.headers
    for name, value in rate_limit_headers(decisions, retry_after=denied).items():
        headers.setdefault(name, value)


def _default_denied(request: HttpRequest, exception: RateLimited) -> HttpResponse:
    """This app's own 429: plain text, or RFC 9457 problem details (``DENIED_BODY``)."""
    if settings.DENIED_BODY == "problem":
        return quota_exceeded_response(exception)
    return HttpResponse(
        "Too Many Requests\n", status=429, content_type="text/plain; charset=utf-8"
    )


def _denied_view() -> Callable[..., Any]:
    path = settings.DENIED_VIEW
    return _default_denied if path is None else cast(Callable[..., Any], import_string(path))


def denying(request: HttpRequest, exception: RateLimited) -> Protocol[HttpResponseBase]:
    """``DENIED_VIEW(request, exception)`` (default: this app's 429, its body per
    ``DENIED_BODY``; sync or ``async def``) plus Retry-After and the rate-limit headers."""
    view = _denied_view()
    sync = async_to_sync(view) if iscoroutinefunction(view) else view
    response: HttpResponseBase = yield Invoke(sync, (request, exception), asynchronous=view)
    add_headers(response, exception.decisions, denied=True)
    return response


def denied_response(request: HttpRequest, exception: RateLimited) -> HttpResponseBase:
    return run(denying(request, exception))


# Feature tests of Django internals (docs/versions.md, "Other packages' internals").
def has_log_mark() -> bool:
    """Django's ``log_response`` skips a response whose ``_has_been_logged`` is true; Django
    has no public way to keep one response out of the ``django.request`` log."""
    return "_has_been_logged" in log_response.__code__.co_consts


def has_resource_closers() -> bool:
    """``HttpResponseBase.close()`` calls each of ``_resource_closers`` (Django's own handler
    appends the request's ``close`` there); no public method adds a closer."""
    return "_resource_closers" in HttpResponseBase.close.__code__.co_names


DJANGO_LOG_MARK = has_log_mark()
DJANGO_RESOURCE_CLOSERS = has_resource_closers()


def mark_logged(response: HttpResponseBase) -> HttpResponseBase:
    """Keep Django's request logger from writing a line for this response.

    During an outage every request is answered 503, and ``django.request`` logs each 5xx as
    an ERROR; :func:`report_outage` already says it once a minute. On a Django whose
    ``log_response`` no longer reads the mark (:data:`DJANGO_LOG_MARK`), Django logs each.
    """
    if DJANGO_LOG_MARK:
        response._has_been_logged = True  # type: ignore[attr-defined]  # read by log_response
    return response


def unavailable_response() -> HttpResponseBase:
    """FAIL_OPEN = False and the limiter cannot decide: 503 with Retry-After, never a 500."""
    return mark_logged(HttpResponse(
        "Service Unavailable: rate limiter unreachable\n", status=503,
        content_type="text/plain; charset=utf-8",
        headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER)},
    ))


# -- count_failures ------------------------------------------------------------------------------
def failed(policy: PolicyDefinition, request: Any, response: HttpResponseBase) -> bool:
    """Whether ``response`` is a failure by ``policy``'s ``count_failures``: its statuses, or
    what its callable says of ``(request, response)`` (the request the layer has: DRF's on a
    DRF view). A 5xx always is: the view raised (the middleware sees a view's exception as a
    500), or the server is failing; whether the attempt failed is unknown, and counting it is
    the safe side. So is a callable that raises (logged, once a minute)."""
    status = response.status_code
    rule = policy.count_failures
    if status >= 500 or rule is None:
        return True
    if isinstance(rule, frozenset):
        return status in rule
    try:
        return bool(rule(request, response))
    except Exception as exc:  # the callable is the project's code: any mistake of it
        report_failure_callable(policy.name, exc)
        return True


def refunding_unless_failed(request: Any, response: HttpResponseBase,
                            refunds: Sequence[Refund]) -> Protocol[None]:
    """Give back each of ``refunds`` whose policy does not count ``response`` as a failure,
    in one round trip. Redis failing is logged (the hits stay counted); the response goes
    out as it is."""
    due = [refund for refund in refunds
           if not refund.sent and not failed(refund.decision.policy, request, response)]
    if not due:
        return
    try:
        yield from refunding(due)
    except CLIENT_ERRORS as exc:
        report_refund_failed(exc)


def refund_unless_failed(request: Any, response: HttpResponseBase,
                         refunds: Sequence[Refund]) -> None:
    """:func:`refunding_unless_failed` on the sync driver (DRF's finalize_response)."""
    run(refunding_unless_failed(request, response, refunds))


# -- concurrency leases --------------------------------------------------------------------------
def releasing_all(decisions: Sequence[Decision]) -> Protocol[None]:
    """Give back every concurrency slot ``decisions`` hold; a Redis failure is logged (the
    lease expires after the policy's timeout anyway)."""
    for decision in decisions:
        if decision.lease is not None:
            try:
                yield from releasing(decision.policy, decision.key, decision)
            except CLIENT_ERRORS as exc:
                report_outage(exc)


def release_all(decisions: Sequence[Decision]) -> None:
    run(releasing_all(decisions))


def on_close(response: HttpResponseBase, callback: Callable[[], None]) -> None:
    # Django runs a response's resource closers from close(), which WSGI servers and the ASGI
    # handler call once the last chunk is sent (or the client went away). Without them
    # (DJANGO_RESOURCE_CLOSERS), the response's own close() is wrapped: the callback then
    # runs after Django's request_finished signal instead of before it.
    if DJANGO_RESOURCE_CLOSERS:
        closers: list[Callable[[], None]] = response._resource_closers  # type: ignore[attr-defined]
        closers.append(callback)
        return
    close, due = response.close, [callback]

    def closing() -> None:
        try:
            close()
        finally:
            while due:  # once, as Django's closers, however often close() is called
                due.pop()()

    response.close = closing  # type: ignore[method-assign]
