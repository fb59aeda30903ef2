"""Log lines about failures, at most one per subject a minute: an outage (or a broken policy)
must not log once per request. Shared by the request layer, the key functions and compat."""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

from django_redislua.conf import settings
from django_redislua.links import check_url

if TYPE_CHECKING:
    from django.http import HttpRequest

    from django_redislua.limiting.decision import Decision, PolicyError

logger = logging.getLogger("django_redislua")

# Seconds between two log lines about the same failure.
OUTAGE_LOG_INTERVAL = 60.0


class _Throttled:
    """At most one log line per ``subject`` per OUTAGE_LOG_INTERVAL, counting what it held back."""

    MAX_SUBJECTS = 256  # subjects come from the configuration; bound them anyway

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}

    def due(self, subject: str) -> int | None:
        """None to stay quiet, else how many lines were held back since the last one."""
        now = time.monotonic()
        with self._lock:
            last, held = self._last.get(subject, (float("-inf"), 0))
            if now - last < OUTAGE_LOG_INTERVAL:
                self._last[subject] = (last, held + 1)
                return None
            if len(self._last) >= self.MAX_SUBJECTS and subject not in self._last:
                self._last.clear()
            self._last[subject] = (now, 0)
            return held


_log_gate = _Throttled()


def report_outage(exc: BaseException, *, fail_open: bool | None = None,
                  denied_as: str = "answered 503") -> None:
    """Log that Redis failed, at most once per OUTAGE_LOG_INTERVAL per process.

    ``fail_open`` and ``denied_as`` say what the caller does about it (compat follows
    ``RATELIMIT_FAIL_OPEN`` and limits the request instead of answering 503).
    """
    global _failing
    _failing += 1
    held = _log_gate.due("outage")
    if held is None:
        return
    opened = settings.FAIL_OPEN if fail_open is None else fail_open
    what = ("Rate limiting is misconfigured" if isinstance(exc, ImproperlyConfigured)
            else "Redis is unreachable for rate limiting")
    logger.warning(
        "%s (%s: %s); FAIL_OPEN=%s so requests are %s. "
        "%d similar failures were not logged since the last warning.",
        what, type(exc).__name__, exc, opened, "allowed" if opened else denied_as, held,
    )


# Decisions that failed since rate limiting last worked (0: it works): recovery is said once.
_failing = 0


def report_recovery() -> None:
    """A decision succeeded: if an outage was reported, say once that limits apply again."""
    global _failing
    if _failing:
        failed, _failing = _failing, 0
        logger.warning("Rate limiting decides again: Redis answered after %d failed decisions; "
                       "limits apply again.", failed)


def report_broken(exc: PolicyError) -> None:
    """Log that a rule cannot be used (its check id says why), once a minute per mistake."""
    held = _log_gate.due(f"{exc.check_id}:{exc}")
    if held is None:
        return
    logger.error(
        "rate limit not applied: %s (%s; python manage.py check reports it; see %s). "
        "FAIL_OPEN=%s so requests it covers are %s. Held back %d repeats of this line.",
        exc, exc.check_id, check_url(exc.check_id), settings.FAIL_OPEN,
        "allowed" if settings.FAIL_OPEN else "answered 503", held,
    )


def report_rate_callable(exc: PolicyError, kind: str = "rate") -> None:
    """Log a rate (or timezone) callable's mistake (the message names the policy, the callable,
    what it did and what the request got), once a minute per policy and mistake, with the
    traceback of an exception it raised."""
    held = _log_gate.due(f"{kind}-callable:{exc}")
    if held is None:
        return
    logger.error("%s (%s: a %s callable's mistake; see %s). Held back %d repeats of this "
                 "line.", exc, exc.check_id, kind, check_url(exc.check_id), held,
                 exc_info=exc.__cause__ is not None)


def report_unknown_address(request: HttpRequest) -> None:
    """Log (redislua.W003, once a minute) that a request's address could not be determined."""
    held = _log_gate.due("redislua.W003")
    if held is None:
        return
    logger.warning(
        "redislua.W003: the client address of a request to %s cannot be determined "
        "(REMOTE_ADDR=%.64r, X-Forwarded-For %s, TRUSTED_PROXIES=%d); such requests share the "
        "identity 'unknown-address' (see %s). Held back %d repeats.",
        request.path[:200], request.META.get("REMOTE_ADDR"),
        "present" if request.META.get("HTTP_X_FORWARDED_FOR") else "absent",
        settings.TRUSTED_PROXIES, check_url("redislua.W003"), held,
    )


def report_refund_failed(exc: BaseException) -> None:
    """Redis failed giving back the hit of a request that did not fail (``count_failures``):
    it stays counted as a failure, the safe side. Once a minute."""
    held = _log_gate.due("refund")
    if held is None:
        return
    logger.warning(
        "Redis failed while giving back the rate-limit hit of a request that did not fail "
        "(count_failures) (%s: %s); it stays counted as a failure. %d similar failures were "
        "not logged since the last warning.", type(exc).__name__, exc, held,
    )


def report_failure_callable(name: str, exc: Exception) -> None:
    """A policy's ``count_failures`` callable raised: the request is counted as a failure.
    Once a minute per policy, with the traceback."""
    held = _log_gate.due(f"count-failures:{name}")
    if held is None:
        return
    logger.error(
        "policy %r: its count_failures callable raised %s: %s; the request is counted as a "
        "failure. Held back %d repeats of this line.", name, type(exc).__name__,
        str(exc)[:200], held, exc_info=exc,
    )


def report_shadow_denial(decision: Decision) -> None:
    name = decision.policy.name
    held = _log_gate.due(f"shadow:{name}")
    if held is None:
        return
    logger.info(
        "shadow policy %r denied a request (result shadow_denied, retry after %.3fs); the "
        "request went on, as the policy is in shadow mode. %d more shadow denials by it were "
        "not logged since the last line.", name, decision.retry_after, held,
    )
