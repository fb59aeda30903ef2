"""A Celery task base class: REDISLUA policies across every worker, and singleton tasks.

::

    from celery import shared_task
    from django_redislua.jobs.celery import RedisluaTask

    @shared_task(base=RedisluaTask, policies=["partner-api"])
    def call_partner(order_id): ...

    @shared_task(base=RedisluaTask, singleton=True, singleton_timeout="10m")
    def nightly_sync(): ...

The options are the task's attributes (Celery passes a decorator's extra keywords to the task
class): ``policies``, ``limit_key``, ``limit_cost``, ``limit_poll``, ``limit_jitter``,
``limit_max_wait``, ``singleton``, ``singleton_timeout``, ``singleton_rerun``;
:class:`~django_redislua.jobs.gate.JobGate` says what each means.

In a worker, a task its policies deny is sent again, with the same id, arguments and options,
for when it can run (``countdown``: the policies' wait plus jitter), and this delivery ends:
it holds no pool process while it waits, its ``retries`` are not counted (Celery's
``max_retries`` is for failures, never for limits), its state is ``RATE_LIMITED`` until the
new delivery runs. A task whose singleton another worker holds is ``SKIPPED`` (with
``singleton_rerun``, the holder sends the task once more when it finishes). Both end the
delivery with Celery's ``Ignore``: no result is stored over the state, no failure is counted,
no callback runs. Called outside a worker (``task()``, ``apply()``, eager mode), a denied task
raises :class:`JobLimited` and a skipped
one returns None, as ``@singleton`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore

from django_redislua.jobs.gate import Admission, Cost, JobGate, Key
from django_redislua.limiting.policy import Policy
from django_redislua.limiting.rates import parse_duration

__all__ = ["RATE_LIMITED", "SKIPPED", "JobLimited", "RedisluaTask"]

logger = logging.getLogger("django_redislua.jobs")

# The task states this base class stores (Celery allows custom states; neither is "ready").
RATE_LIMITED = "RATE_LIMITED"
SKIPPED = "SKIPPED"


class JobLimited(Exception):
    """A task called outside a worker was denied by its policies: try again in ``retry_in``
    seconds. Picklable (its arguments are its fields): an eager result carries it."""

    def __init__(self, message: str, retry_in: float, denied_by: tuple[str, ...] = ()) -> None:
        super().__init__(message, retry_in, tuple(denied_by))
        self.retry_in = retry_in
        self.denied_by = tuple(denied_by)

    def __str__(self) -> str:
        return str(self.args[0])

    @classmethod
    def of(cls, name: str, admission: Admission) -> JobLimited:
        why = ", ".join(admission.denied_by) or "Redis being unavailable"
        return cls(f"task {name} is rate-limited by {why}: try again in "
                   f"{admission.retry_in:.2f}s", admission.retry_in, admission.denied_by)


class RedisluaTask(Task):  # type: ignore[misc]  # celery ships no types
    """Celery's Task, with REDISLUA policies and a singleton lock decided before it runs."""

    policies: ClassVar[str | Policy | Sequence[str | Policy]] = ()
    limit_key: ClassVar[Key] = None
    limit_cost: ClassVar[Cost] = 1
    limit_poll: ClassVar[float | str] = "1s"
    limit_jitter: ClassVar[float | str] = "1s"
    singleton: ClassVar[bool | Key] = None
    singleton_timeout: ClassVar[float | str] = "10m"
    singleton_rerun: ClassVar[bool] = False
    # The longest countdown a put-off task is sent with: a broker with a visibility timeout
    # (Redis, SQS: an hour by default) delivers a countdown task held longer than that a second
    # time. A longer wait is taken in steps, the policies asked again after each.
    limit_max_wait: ClassVar[float | str] = "30m"

    _gate: JobGate | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery makes a class per task, its name and options given: the gate is made now, so
        # the system checks see its policies (redislua.E021, E031) before it first runs.
        super().__init_subclass__(**kwargs)
        cls._gate = _gate_of(cls) if vars(cls).get("name") else None

    def redislua_gate(self) -> JobGate:
        """This task's :class:`JobGate`, made from its options."""
        gate = type(self)._gate
        if gate is None or gate.name != self.name:  # a task class made some other way
            gate = type(self)._gate = _gate_of(type(self), self.name)
        return gate

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        gate = self.redislua_gate()
        admission = gate.admit(args, kwargs)
        request = self.request
        in_worker = not (request.called_directly or request.is_eager)
        if admission.status == "run":
            try:
                return super().__call__(*args, **kwargs)
            finally:
                # A run turned away meanwhile (singleton_rerun) is sent as a task of its own;
                # outside a worker its request waits for a worker's run to end.
                gate.done(admission, self._resend if in_worker else None)
        if admission.status == "skipped":
            if not in_worker:
                return None
            if (request.delivery_info or {}).get("redelivered"):
                # This very delivery ran before and its process died (acks_late): the lease
                # that turns it away may be its own, left by the dead process. Skipped, it
                # would be acked and lost; it is put off until that lease ends instead.
                self._put_off(gate.after_lease(admission), args, kwargs)
                raise Ignore()
            self._store(SKIPPED, {"held_by": admission.held_by,
                                  "rerun_queued": admission.rerun_queued})
            raise Ignore()
        if not in_worker:
            raise JobLimited.of(self.name, admission)
        self._put_off(admission, args, kwargs)
        raise Ignore()

    def _resend(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        self.apply_async(args=args, kwargs=kwargs)

    def _put_off(self, admission: Admission, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        """Send this task again for when it can run: the same id, arguments and options
        (Celery's own retry path), its retries unchanged."""
        request = self.request
        countdown = min(admission.retry_in, parse_duration(self.limit_max_wait))
        # Stored first: the new delivery, if it runs at once, stores its own state after.
        meta: dict[str, Any] = {"retry_in": round(admission.retry_in, 3),
                                "denied_by": list(admission.denied_by)}
        if admission.held_by:  # put off by a singleton's lease (a redelivery)
            meta["held_by"] = admission.held_by
        self._store(RATE_LIMITED, meta)
        again = self.signature_from_request(request, args, kwargs, countdown=countdown,
                                            retries=request.retries)
        again.apply_async()

    def _store(self, state: str, meta: dict[str, Any]) -> None:
        """Show ``state`` in the result backend, unless results are ignored."""
        request = self.request
        # The call's own ignore_result wins over the task's (as Celery reads it); Context's
        # class default is not a call's choice, so only one set on this request counts.
        asked = vars(request).get("ignore_result")
        if (self.ignore_result if asked is None else asked):
            return
        try:
            self.update_state(task_id=request.id, state=state, meta=meta)
        except Exception as exc:  # the backend's own failure must not lose the task
            logger.warning("task %s[%s]: state %s not stored (%s)", self.name, request.id,
                           state, exc)


def _gate_of(cls: type[RedisluaTask], name: str | None = None) -> JobGate:
    key, cost, singleton = (_plain(cls, attr) for attr in ("limit_key", "limit_cost",
                                                           "singleton"))
    return JobGate(name or cls.name, policies=cls.policies, key=key, cost=cost,
                   singleton=singleton, singleton_timeout=cls.singleton_timeout,
                   poll=cls.limit_poll, jitter=cls.limit_jitter, module=cls.__module__,
                   singleton_rerun=cls.singleton_rerun)


def _plain(cls: type, attr: str) -> Any:
    """A class attribute as it was given: a function set on a class reads back as a method."""
    for klass in cls.__mro__:
        if attr in vars(klass):
            value = vars(klass)[attr]
            return value.__func__ if isinstance(value, staticmethod) else value
    return None
