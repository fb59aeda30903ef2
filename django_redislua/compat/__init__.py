"""The django-ratelimit 4.x API on this engine: moving over is an import change.

- ``django_ratelimit.decorators`` -> ``django_redislua.compat.decorators`` (``ratelimit``)
- ``django_ratelimit.core`` -> ``django_redislua.compat.core`` (``is_ratelimited``, ``get_usage``)
- ``django_ratelimit`` -> ``django_redislua.compat`` (``ALL``, ``UNSAFE``)
- ``django_ratelimit.exceptions`` -> ``django_redislua.compat.exceptions`` (``Ratelimited``)
- ``django_ratelimit.middleware`` -> ``django_redislua.compat.middleware``

Everything is also importable from ``django_redislua.compat`` and from the module
``django_redislua.compat.ratelimit``. docs/migrating.md says what differs (429, not 403).
"""

from __future__ import annotations

# The submodule `ratelimit` is imported first: importing a submodule sets the package attribute
# of the same name, so the decorator must be bound after it to win `compat.ratelimit`.
from django_redislua.compat import ratelimit as _ratelimit_module  # noqa: F401
from django_redislua.compat.core import ALL, UNSAFE, get_usage, is_ratelimited
from django_redislua.compat.decorators import ratelimit
from django_redislua.compat.exceptions import Ratelimited

__all__ = ["ALL", "UNSAFE", "Ratelimited", "get_usage", "is_ratelimited", "ratelimit"]
