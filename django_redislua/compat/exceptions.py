"""``Ratelimited``: django-ratelimit's exception, also our RateLimited."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied

from django_redislua.limiting import Decision, RateLimited


class Ratelimited(RateLimited, PermissionDenied):
    """Raised by the compat decorator when ``block=True``.

    A :class:`~django_redislua.limiting.RateLimited`, so ``RateLimitMiddleware`` (or the compat
    ``RatelimitMiddleware``) answers 429 with Retry-After; still a ``PermissionDenied``, so
    existing ``handler403`` code that checks ``isinstance(exception, Ratelimited)`` keeps
    working, and without either middleware Django answers 403, as django-ratelimit does.

    Built like django-ratelimit's: ``Ratelimited()`` or ``Ratelimited("message")`` (then it
    carries no decision); the decorator passes the list of Decisions.
    """

    def __init__(self, *args: Any) -> None:
        if len(args) == 1 and _are_decisions(args[0]):
            super().__init__(args[0])
            return
        super().__init__(())
        self.args = args


def _are_decisions(value: object) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(d, Decision) for d in value)
