"""What a background job passes before it runs: a singleton lock, then its policies, decided
together in one script call. Framework-free: the Celery base class
(:mod:`~django_redislua.jobs.celery`) and Django's tasks (:mod:`~django_redislua.jobs.tasks`)
both ask a :class:`JobGate` and only differ in how they put a job off.

A job that may not run now is never dropped here: :meth:`JobGate.admit` says when to try again
(``Admission.retry_in``), and the framework re-sends the job for then. Redis failing follows
``FAIL_OPEN`` for the policies (open: the job runs unlimited; closed: it is put off by
``poll``); a singleton is never run without its lock, whatever ``FAIL_OPEN`` says, since two
copies at once is what it exists to prevent.
"""

from __future__ import annotations

import json
import logging
import math
import random
import secrets
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from django_redislua import metrics
from django_redislua.conf import settings
from django_redislua.connection import CLIENT_ERRORS
from django_redislua.limiting.decision import Decision, PolicyError
from django_redislua.limiting.engine import evaluate, releasing
from django_redislua.limiting.policy import Policy
from django_redislua.limiting.rates import parse_duration
from django_redislua.limiting.registry import get_policy
from django_redislua.locks.coordination import holding
from django_redislua.locks.errors import LeaseLost, LockError, LockUnavailable
from django_redislua.locks.lock import Lock
from django_redislua.protocol import Execute, Protocol
from django_redislua.reporting import report_outage, report_recovery
from django_redislua.scripts import get_script
from django_redislua.transport import run

logger = logging.getLogger("django_redislua.jobs")

# What a job's call came to, as the metric redislua_jobs_total counts it.
RAN, RATE_LIMITED, SKIPPED = "ran", "rate_limited", "skipped"

Key = str | Callable[..., str] | None
Cost = int | Callable[..., int]
# What sends a job again with these arguments (a singleton_rerun): the framework's own enqueue.
Resend = Callable[[list[Any], dict[str, Any]], None]

# How long a rerun request waits for its holder to finish: a run renews its lease for as long
# as it lasts, but a request is for "soon", not for next week.
RERUN_KEPT_MS = 24 * 3600 * 1000
# A turned-away run asks for a rerun, finds the lock free (its holder has just finished), tries
# to take it itself and finds it taken again: how many times before it gives up (logged).
_RERUN_TRIES = 3

# Every gate made (each job's, at its definition): the system checks read their policies.
_gates: weakref.WeakSet[JobGate] = weakref.WeakSet()


def known_gates() -> list[JobGate]:
    """The gates of the jobs defined so far in this process (by name), but those whose
    defining module has been unloaded since."""
    return sorted((gate for gate in _gates if gate.module is None or gate.module in sys.modules),
                  key=lambda gate: gate.name)


@dataclass
class Admission:
    """Whether a job may run now (:meth:`JobGate.admit`).

    - ``status="run"``: run it, then call :meth:`JobGate.done` with this Admission (it
      releases the singleton lock and any concurrency slot, whatever the job did).
    - ``status="limited"``: a policy denied it (or Redis failed and ``FAIL_OPEN`` is False,
      or a singleton's lock could not be asked): try again in ``retry_in`` seconds (the
      wait the policies gave, plus jitter). ``denied_by`` names the policies that denied.
    - ``status="skipped"``: another instance holds its singleton; ``held_by`` says who,
      ``lease_left`` how many seconds its lease has left (None: unknown), and
      ``rerun_queued`` whether the holder will run it once more when it finishes
      (``singleton_rerun``).
    """

    status: Literal["run", "limited", "skipped"]
    retry_in: float = 0.0
    denied_by: tuple[str, ...] = ()
    held_by: str = ""
    rerun_queued: bool = False
    lease_left: float | None = None
    lock: Lock | None = None
    held: tuple[Decision, ...] = field(default=())


class JobGate:
    """The limits of one job (a Celery task, a Django task, any function run in the
    background): ``policies`` (names in ``REDISLUA["POLICIES"]`` or :class:`Policy`
    objects, all-or-nothing: a denial by one consumes nothing from the others), decided
    for the identity ``key`` (default: the job's name, one budget for every call; a string;
    or a callable given the job's arguments) at ``cost``; and ``singleton``, the name of a
    lock (True: the job's name; or a callable given the arguments) held while it runs,
    renewed, expiring ``singleton_timeout`` after a crashed holder's last renewal. With
    ``singleton_rerun``, a run turned away by the singleton is not lost: the holder runs the
    job once more when it finishes, with the latest turned-away arguments (JSON), through the
    ``resend`` given to :meth:`done`. ``module`` names the module defining the job, if any
    (see :func:`known_gates`).

    A concurrency policy's denial is tried again after at most ``poll``: its own wait is
    when the oldest slot's lease would end, usually long after the job holding it is done.
    """

    def __init__(self, name: str, *, policies: str | Policy | Sequence[str | Policy] = (),
                 key: Key = None, cost: Cost = 1, singleton: bool | Key = None,
                 singleton_timeout: float | str = "10m", poll: float | str = "1s",
                 jitter: float | str = "1s", module: str | None = None,
                 singleton_rerun: bool = False) -> None:
        self.name = name
        # The module that defines the job: the system checks pass over a job whose module is
        # gone (unloaded), as a page of tested docs or a test's throwaway task is.
        self.module = module
        self.policy_names = (policies,) if isinstance(policies, (str, Policy)) else tuple(
            policies)
        self.key, self.cost = key, cost
        self.singleton = name if singleton is True else (singleton or None)
        self.singleton_timeout = parse_duration(singleton_timeout)
        self.rerun = singleton_rerun
        self.poll = parse_duration(poll)
        self.jitter = parse_duration(jitter)
        # What a framework made over this gate, if it keeps one (limited_task: the Django
        # Task, whose backend the system checks ask about).
        self.task: Any = None
        _gates.add(self)

    # -- what the job's arguments make ----------------------------------------------------------

    def policies(self) -> list[Policy]:
        """The policies, read from the settings now (an override or a settings change counts).
        A policy whose rate (or timezone) is a callable of a request cannot limit a job:
        PolicyError."""
        found = [p if isinstance(p, Policy) else get_policy(p) for p in self.policy_names]
        for policy in found:
            if policy.is_dynamic or policy._zone_callable is not None:
                what = "rate" if policy.is_dynamic else "timezone"
                raise PolicyError(
                    "redislua.E031", f"job {self.name!r}: policy {policy.name!r} takes its {what} "
                    f"from a request; a background job has none (give it a fixed {what})")
        return found

    def identity(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
        return (self.name if self.key is None else
                self.key(*args, **kwargs) if callable(self.key) else self.key)

    def lock_name(self, args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
        name = self.singleton
        return name(*args, **kwargs) if callable(name) else name

    # -- admitting ----------------------------------------------------------------------------

    def admit(self, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
              ) -> Admission:
        """Whether the job may run now with these arguments (see :class:`Admission`). At
        most two round trips: the singleton lock, then every policy in one script call.
        ``ENABLED=False`` (the kill switch) admits without asking the policies; a singleton
        still holds."""
        kwargs = kwargs or {}
        lock = None
        lock_name = self.lock_name(args, kwargs)
        if lock_name is not None:
            lock = Lock(lock_name, self.singleton_timeout, blocking=False, auto_renew=True)
            try:
                skipped = self._lock(lock, args, kwargs)
            except LockError as exc:
                logger.warning("job %s: its singleton lock %r could not be asked (%s); "
                               "put off by %.1fs", self.name, lock_name, exc, self.poll)
                return self._limited(self.poll, ())
            if skipped is not None:
                return skipped
        try:
            admission = self._decide(args, kwargs)
        except BaseException:
            if lock is not None:
                _release(self.name, lock)
            raise
        if admission.status != "run":
            if lock is not None:
                _release(self.name, lock)
            return admission
        admission.lock = lock
        return admission

    def _lock(self, lock: Lock, args: Sequence[Any], kwargs: dict[str, Any]
              ) -> Admission | None:
        """Take the singleton: None when taken, else the skipped Admission (the rerun asked
        for, with ``singleton_rerun``)."""
        queued = False
        for _ in range(_RERUN_TRIES if self.rerun else 1):
            if lock.acquire():
                return None
            if not self.rerun:
                break
            queued = self._ask_rerun(lock, args, kwargs)
            if queued:
                break
            # The holder finished between our try and our request: take it ourselves.
        else:
            logger.warning("job %s: its singleton %r changed hands %d times while this run "
                           "asked for a rerun; skipped, no rerun asked", self.name, lock.name,
                           _RERUN_TRIES)
        held_by, left = run(holding(lock))
        logger.info("job %s skipped: singleton %r: %s%s", self.name, lock.name, held_by,
                    "; it runs once more when the holder finishes" if queued else "")
        metrics.job(self.name, SKIPPED)
        return Admission("skipped", held_by=held_by, rerun_queued=queued, lease_left=left)

    def _ask_rerun(self, lock: Lock, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
        """Leave the holder a rerun request with these arguments, in the same step as seeing
        it still holds the lock (singleton_queue.lua); False when the lock is free now."""
        try:
            request = json.dumps({"args": list(args), "kwargs": kwargs,
                                  "token": secrets.token_hex(8)})
        except TypeError as exc:
            raise TypeError(f"job {self.name}: singleton_rerun keeps the arguments of a run "
                            f"turned away as JSON, and these are not: {exc}") from None
        try:
            queued = get_script("django_redislua.singleton_queue")(
                keys=[lock.keys.base, lock.keys.sub("rerun")], args=[request, RERUN_KEPT_MS])
        except CLIENT_ERRORS as exc:
            # Whether the request was stored is unknown: the run is put off (admit), never
            # reported as queued when it may not be.
            raise LockUnavailable(f"job {self.name}: a rerun could not be asked for: "
                                  f"{exc}") from exc
        return bool(queued)

    def _decide(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Admission:
        if not self.policy_names or not settings.ENABLED:  # the kill switch: limits off, not
            metrics.job(self.name, RAN)                    # locks; no policy even looked up
            return Admission("run")
        policies = self.policies()
        identity = self.identity(args, kwargs)
        cost = self.cost(*args, **kwargs) if callable(self.cost) else self.cost
        checks = [(policy, identity, cost) for policy in policies]
        soft = frozenset(i for i, p in enumerate(policies) if p.shadow)
        try:
            decisions = evaluate(checks, soft=soft if len(checks) > 1 else ())
        except CLIENT_ERRORS as exc:
            report_outage(exc, denied_as=f"put off by {self.poll:g}s")
            if settings.FAIL_OPEN:
                metrics.job(self.name, RAN)
                return Admission("run")
            return self._limited(self.poll, ())
        report_recovery()
        denied = [d for d in decisions if not d.allowed and not d.policy.shadow]
        held = tuple(d for d in decisions if d.lease is not None)
        never = [d.policy for d in denied if math.isinf(d.retry_after)]
        if never:  # no wait lifts it: an error to fix, not a job to put off forever
            raise PolicyError("redislua.E010", f"job {self.name!r}: cost {cost} is above the "
                              f"capacity of {never[0].name!r} ({never[0].limit}): it could "
                              f"never run")
        if not denied:
            metrics.job(self.name, RAN)
            return Admission("run", held=held)
        wait = max(min(d.retry_after, self.poll) if d.policy.algorithm == "concurrency"
                   else d.retry_after for d in denied)
        return self._limited(wait, tuple(d.policy.name for d in denied))

    def _jittered(self, wait: float) -> float:
        # Jobs put off together come back spread out, not all at the same instant (a tenth of
        # the wait, at most ``jitter``): they would mostly be turned away again.
        return wait + random.uniform(0, min(self.jitter, wait / 10))

    def _limited(self, wait: float, denied_by: tuple[str, ...]) -> Admission:
        retry_in = self._jittered(wait)
        metrics.job(self.name, RATE_LIMITED)
        logger.info("job %s rate-limited%s: put off by %.2fs", self.name,
                    f" by {', '.join(denied_by)}" if denied_by else "", retry_in)
        return Admission("limited", retry_in=retry_in, denied_by=denied_by)

    def after_lease(self, skipped: Admission) -> Admission:
        """A skipped run as one put off until the singleton's lease ends (a redelivered task
        whose own dead process may hold it): then it is asked again."""
        wait = self.poll if skipped.lease_left is None else max(skipped.lease_left, 0.001)
        retry_in = self._jittered(wait)
        logger.info("job %s: redelivered while its singleton is held (%s): put off by %.2fs, "
                    "until that lease ends", self.name, skipped.held_by, retry_in)
        return Admission("limited", retry_in=retry_in, held_by=skipped.held_by)

    def done(self, admission: Admission, resend: Resend | None = None) -> None:
        """The job ran (or failed): give back its concurrency slots and its singleton lock.
        A lease lost while it ran is logged (and counted by the lock), not raised: the job's
        own outcome stands. With ``singleton_rerun``, a run turned away meanwhile is sent again
        through ``resend(args, kwargs)`` (without ``resend``, its request waits for the next
        run's end)."""
        try:
            for decision in admission.held:
                run(releasing(decision.policy, decision.key, decision))
        except CLIENT_ERRORS as exc:
            logger.warning("job %s: a concurrency slot could not be given back (%s); it frees "
                           "itself when its lease ends", self.name, exc)
        finally:
            if admission.lock is not None:
                _release(self.name, admission.lock)
                if self.rerun and resend is not None:
                    self._rerun(admission.lock, resend)

    def _rerun(self, lock: Lock, resend: Resend) -> None:
        """Send again the run turned away while this one held the lock, if any. The request
        is read after the release (one made later finds the lock free and runs itself) and
        claimed before it is sent: a rerun that finishes at once must not find it again. If
        it was replaced meanwhile, the newer one belongs to whoever holds the lock now. If
        it cannot be sent (or whether it was claimed is unknown), it is put back: a rerun
        twice rather than none."""
        key = lock.keys.sub("rerun")
        try:
            request = cast(bytes | None, run(_get(key)))
        except CLIENT_ERRORS as exc:
            logger.warning("job %s: its rerun request could not be read (%s); the next run's "
                           "end reads it", self.name, exc)
            return
        if request is None:
            return
        try:
            claimed = get_script("django_redislua.singleton_dequeue")(keys=[key],
                                                                      args=[request])
        except CLIENT_ERRORS as exc:
            self._put_back(key, request, f"its claim failed ({exc})")
            return
        if not claimed:
            return
        asked = json.loads(request)
        try:
            resend(list(asked["args"]), dict(asked["kwargs"]))
        except Exception as exc:  # the framework's enqueue (a broker, a database) failed
            self._put_back(key, request, f"it could not be sent ({type(exc).__name__}: {exc})")
            return
        logger.info("job %s: run once more, as a run turned away meanwhile asked", self.name)

    def _put_back(self, key: str, request: bytes, why: str) -> None:
        """A rerun request this run could not send, left for the next run's end (unless a
        newer one is there: SET NX)."""
        try:
            run(_set_if_absent(key, request, RERUN_KEPT_MS))
        except CLIENT_ERRORS as exc:
            logger.error("job %s: a run turned away meanwhile asked to run once more, but %s "
                         "and the request could not be put back (%s): it is lost", self.name,
                         why, exc)
            return
        logger.warning("job %s: a rerun is left for the next run's end: %s", self.name, why)


def _get(key: str) -> Protocol[Any]:
    """``GET key``: an idempotent read, sent again if its reply is lost."""
    return (yield Execute(("GET", key)))


def _set_if_absent(key: str, value: bytes, ttl_ms: int) -> Protocol[Any]:
    """``SET key value NX PX ttl``: sent again if its reply is lost, it changes nothing more."""
    return (yield Execute(("SET", key, value, "NX", "PX", ttl_ms)))


def _release(name: str, lock: Lock) -> None:
    try:
        lock.release()
    except LeaseLost:
        logger.error("job %s: its singleton lease %r ran out or was taken while it ran; another "
                     "instance may have run it at the same time", name, lock.name)
    except LockError as exc:
        logger.warning("job %s: its singleton lock %r could not be released (%s); it frees "
                       "itself when its lease ends", name, lock.name, exc)
