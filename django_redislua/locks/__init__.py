"""Distributed locks and coordination on Redis: ``Lock``, ``Semaphore``, ``singleton``,
``run_once`` and ``single_flight`` (``forget_flight``). Every state change is one Lua script;
waiters are woken by pub/sub on release, never by a polling loop."""

from django_redislua.locks.coordination import singleton
from django_redislua.locks.errors import (
    LeaseLost,
    LockError,
    LockNotAcquired,
    LockNotOwned,
    LockUnavailable,
)
from django_redislua.locks.flight import (
    BuildFailed,
    aforget_flight,
    asingle_flight,
    forget_flight,
    single_flight,
)
from django_redislua.locks.lock import Lock
from django_redislua.locks.once import RunInProgress, RunOutcome, run_once
from django_redislua.locks.semaphore import Semaphore

__all__ = [
    "BuildFailed",
    "LeaseLost",
    "Lock",
    "LockError",
    "LockNotAcquired",
    "LockNotOwned",
    "LockUnavailable",
    "RunInProgress",
    "RunOutcome",
    "Semaphore",
    "aforget_flight",
    "asingle_flight",
    "forget_flight",
    "run_once",
    "single_flight",
    "singleton",
]
