"""Shared by the management commands: Redis failing is a clean CommandError, never a traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.core.management.base import CommandError

from django_redislua.connection import CLIENT_ERRORS


@contextlib.contextmanager
def redis_errors_as_command_errors() -> Iterator[None]:
    """``Redis unreachable: ...`` (exit 1) for every client failure family in the block."""
    try:
        yield
    except CLIENT_ERRORS as exc:
        raise CommandError(f"Redis unreachable: {type(exc).__name__}: {exc}") from None
