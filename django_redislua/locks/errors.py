"""What lock operations raise (:class:`LockError` and its kinds), how a Redis failure becomes
:class:`LockUnavailable`, and how a blocking timeout reads; shared by the lock, the semaphore
and the coordination helpers."""

from __future__ import annotations

from typing import Any, TypeVar

from django_redislua.connection import CLIENT_ERRORS
from django_redislua.limiting.rates import parse_duration
from django_redislua.protocol import Protocol

T = TypeVar("T")


class LockError(Exception):
    """Base class of lock errors."""


class LockNotOwned(LockError):
    """Release or extend by a caller that does not hold the lock (it expired, or was taken)."""


class LockNotAcquired(LockError):
    """``with Lock(...)`` (or the decorator) could not acquire within ``blocking_timeout``."""


class LeaseLost(LockNotOwned):
    """The lease ran out, or was taken, while the code it protected ran: another holder may have
    run at the same time. Raised on leaving ``with``, by ``release``/``extend``, by
    ``singleton`` and by ``run_once``; ``result`` is what the protected code returned, if it
    finished."""

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


class LockUnavailable(LockError):
    """Redis failed while locking (down, timed out, refused the credentials, no cluster node):
    never a bare redis-py error. The lock's state is unknown; the lease ends by itself."""


def lock_errors(protocol: Protocol[T]) -> Protocol[T]:
    """``protocol``, every client failure family (``connection.CLIENT_ERRORS``) raised as
    :class:`LockUnavailable`."""
    try:
        return (yield from protocol)
    except CLIENT_ERRORS as exc:
        raise LockUnavailable(f"Redis failed while locking: {exc}") from exc


def parse_wait(value: float | str | None) -> float | None:
    """A blocking timeout: None (wait as long as it takes), 0 or more seconds, or "500ms"..."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0.0
    return parse_duration(value)
