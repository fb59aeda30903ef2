"""django-redislua: Redis + Lua atomic rate limits, locks and coordination for Django."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

__all__ = ["Decision", "Policy", "RateLimited", "get_policy"]

if TYPE_CHECKING:
    from django_redislua.limiting import Decision, Policy, RateLimited, get_policy


def __getattr__(name: str) -> Any:
    # Lazy, so `import django_redislua` in settings.py does not import Django models or redis.
    if name in __all__:
        from django_redislua import limiting

        return getattr(limiting, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
