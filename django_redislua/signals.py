"""Signals sent by the Django layers (decorator, middleware, compat)."""

from __future__ import annotations

from django.dispatch import Signal

rate_limited = Signal()
"""Sent once per denied Decision: ``rate_limited.send(sender, request=..., decision=...)``.

``sender`` is the layer that asked: :func:`django_redislua.decorators.ratelimit`,
:class:`django_redislua.middleware.RateLimitMiddleware`, the DRF throttle class, or
:func:`django_redislua.compat.core.get_usage` (for every compat entry point). Sent for
``block=False`` denials too.
"""
