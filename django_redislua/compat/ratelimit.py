"""``django_redislua.compat.ratelimit``: the whole compat API in one module (see the package)."""

from __future__ import annotations

from django_redislua.compat.core import ALL, UNSAFE, get_usage, is_ratelimited
from django_redislua.compat.decorators import ratelimit
from django_redislua.compat.exceptions import Ratelimited

__all__ = ["ALL", "UNSAFE", "Ratelimited", "get_usage", "is_ratelimited", "ratelimit"]
