"""Distributed locks and coordination on Redis: ``Lock``, ``Semaphore``, ``singleton``,
``run_once`` and ``single_flight``. Every state change is one Lua script; waiters are woken by
pub/sub on release, never by a polling loop."""

from django_redislua.locks.lock import Lock, LockError, LockNotAcquired, LockNotOwned

__all__ = ["Lock", "LockError", "LockNotAcquired", "LockNotOwned"]
