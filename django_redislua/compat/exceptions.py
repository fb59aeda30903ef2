"""``Ratelimited``: django-ratelimit's exception, also our RateLimited."""

from __future__ import annotations

from collections.abc import Sequence

from django.core.exceptions import PermissionDenied

from django_redislua.limiting import Decision, RateLimited


class Ratelimited(RateLimited, PermissionDenied):
    """Raised by the compat decorator when ``block=True``.

    A :class:`~django_redislua.limiting.RateLimited`, so ``RateLimitMiddleware`` (or the compat
    ``RatelimitMiddleware``) answers 429 with Retry-After; still a ``PermissionDenied``, so
    existing ``handler403`` code that checks ``isinstance(exception, Ratelimited)`` keeps
    working, and without either middleware Django answers 403, as django-ratelimit does.
    """

    def __init__(self, decisions: Sequence[Decision] = ()) -> None:
        super().__init__(decisions)
