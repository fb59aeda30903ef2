"""Django's tasks (``django.tasks``, Django 6.0+; the ``django-tasks`` backport before it) with
REDISLUA policies and singletons, whatever backend runs them.

::

    from django_redislua.jobs.tasks import limited_task

    @limited_task(policies=["partner-api"], priority=10)
    def call_partner(order_id): ...

    call_partner.enqueue(17)

``limited_task`` takes the options of :class:`~django_redislua.jobs.gate.JobGate`
(``policies``, ``limit_key``, ``limit_cost``, ``limit_poll``, ``limit_jitter``, ``singleton``,
``singleton_timeout``, ``singleton_rerun``) and passes the rest to Django's ``@task``. When the
worker runs it:

- admitted, the function runs (its slot and lock are given back whatever it does) and its
  return value is the task's;
- denied, it is enqueued again with the same arguments for when it can run (``run_after``:
  the backend must support deferred tasks) and this run returns
  ``{"redislua": "rate_limited", "retry_in": s, "denied_by": [...], "rescheduled_as": id}``:
  the id of the task result that will run it;
- skipped (another run holds its singleton), it returns
  ``{"redislua": "skipped", "held_by": "...", "rerun_queued": bool}`` (with
  ``singleton_rerun``, the holder enqueues it once more when it finishes).

Django's tasks have no state for "put off", so the run that put it off finishes successfully
with that record; nothing is dropped and nothing counts as a failure.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction
from django.utils import timezone

from django_redislua.jobs.gate import Cost, JobGate, Key
from django_redislua.limiting.policy import Policy

try:
    from django.tasks import task as _task  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task as _task  # type: ignore[import-not-found,no-redef,unused-ignore]

__all__ = ["limited_task"]

# The gates of every task limited_task made (each gate's ``task``): the system checks ask each
# task's backend whether it can run a task later (redislua.E032). Weak: a test's task goes.
_made: weakref.WeakSet[JobGate] = weakref.WeakSet()


def limited_tasks() -> list[tuple[Any, JobGate]]:
    """The tasks made so far whose module is still loaded, with their gates."""
    return [(gate.task, gate) for gate in list(_made)
            if gate.module is None or gate.module in sys.modules]


def limited_task(*, policies: str | Policy | Sequence[str | Policy] = (),
                 limit_key: Key = None,
                 limit_cost: Cost = 1, limit_poll: float | str = "1s",
                 limit_jitter: float | str = "1s", singleton: bool | Key = None,
                 singleton_timeout: float | str = "10m", singleton_rerun: bool = False,
                 **options: Any
                 ) -> Callable[[Callable[..., Any]], Any]:
    """Django's ``@task(**options)`` over a function first admitted by its policies and
    singleton (see the module's doc)."""

    def decorate(func: Callable[..., Any]) -> Any:
        gate = JobGate(f"{func.__module__}.{func.__qualname__}", policies=policies,
                       key=limit_key, cost=limit_cost, singleton=singleton,
                       singleton_timeout=singleton_timeout, poll=limit_poll,
                       jitter=limit_jitter, module=func.__module__,
                       singleton_rerun=singleton_rerun)
        body = async_to_sync(func) if iscoroutinefunction(func) else func
        with_context = bool(options.get("takes_context"))
        made: list[Any] = []  # the Task, once made: a denied run enqueues it again

        @functools.wraps(func)
        def admitted(*args: Any, **kwargs: Any) -> Any:
            own = args[1:] if with_context else args  # the context is not the job's argument
            admission = gate.admit(own, kwargs)
            if admission.status == "run":
                try:
                    return body(*args, **kwargs)
                finally:
                    gate.done(admission, lambda again, named: made[0].enqueue(*again, **named))
            if admission.status == "skipped":
                return {"redislua": "skipped", "held_by": admission.held_by,
                        "rerun_queued": admission.rerun_queued}
            later = made[0].using(
                run_after=timezone.now() + timedelta(seconds=admission.retry_in)
            ).enqueue(*own, **kwargs)
            return {"redislua": "rate_limited", "retry_in": round(admission.retry_in, 3),
                    "denied_by": list(admission.denied_by), "rescheduled_as": str(later.id)}

        made.append(_task(**options)(admitted))
        gate.task = made[0]
        _made.add(gate)
        return made[0]

    return decorate
