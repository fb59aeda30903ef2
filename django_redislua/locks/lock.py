"""``Lock``: a fenced, owner-checked, optionally reentrant and self-renewing distributed lock.

Each operation is one script on the lock's hash {owner, wait, count, token, name}. The owner
token is 128 random bits held by the Lock object, so any thread or coroutine holding the object
may release it, and nobody else can. Fencing tokens come from ``max(last token + 1, server clock
in microseconds)``: strictly increasing for a name even after Redis lost its data.

Waiting is first come, first served. Every acquire call is a *wait* with its own id; a waiter
subscribes to its inbox (a thread's own channel, kept from wait to wait; an asyncio wait's own,
for that wait; see ``waiting``), then queues itself by arrival, naming the inbox. A full
release offers the lock to the first live waiter as a *claim*: the lock hash names that wait and
expires after the claim window (``LOCK_CLAIM_WINDOW``, 1 s), and ``granted <wait> <token>
<window ms>`` is published to that waiter's inbox alone. The heir confirms with one more call
(its lease starts then); a heir that died, is stopped or left never confirms. Every queued
waiter looks again at least once per claim window, so when the claim runs out the first one
back takes the lock. A grant belongs to one wait, never to the
Lock object, so no other acquire can use it.

Every step (acquire, wait, confirm, re-entry, withdraw, release, extend, renew) is a protocol
(:mod:`django_redislua.protocol`) written once; ``acquire`` and ``aacquire`` (and every other
pair) hand the same protocol to the sync or the asyncio driver. Every way out of a wait that
did not end with the lock in the caller's hands (a timeout, an exception, a cancellation,
KeyboardInterrupt, a reply that never arrived) withdraws it by its wait id: its queue entry,
a claim or the lock it took, a re-entry it made. That withdrawal may be sent again safely, so it
is retried until it lands (in the background after a Redis failure: the caller's wait must not
overrun its timeout by another socket timeout).

A withdrawal may never land (Redis unreachable until it gives up), so it is not what keeps a
lost re-entry from holding the lock. The Lock object keeps the ids of its holds (the acquire
call that took the lock, then each re-entry) and of its acquire calls whose replies never
arrived; every release gives back its hold by id and settles those calls with it (each gives
back what it held, and is refused if it arrives later), and so does the object's next
acquire. Once the holder has released every hold it knows of, the lock is free on the server
too; and a release sent twice, or arriving late, gives back its own hold only, never one made
since.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, cast

from asgiref.sync import iscoroutinefunction

from django_redislua import conf, metrics
from django_redislua.atransport import arun
from django_redislua.conf import settings
from django_redislua.connection import CLIENT_ERRORS
from django_redislua.limiting.rates import parse_duration
from django_redislua.locks.errors import (
    LeaseLost,
    LockNotAcquired,
    LockNotOwned,
    LockUnavailable,
    lock_errors,
    parse_wait,
)
from django_redislua.locks.keys import inbox_prefix, keys_for
from django_redislua.locks.lease import (
    Lease,
    milliseconds,
    start_renewing,
    stop_renewing,
)
from django_redislua.locks.waiting import LONGEST_SLEEP, deadline_after, seconds_left, until
from django_redislua.protocol import (
    Call,
    Execute,
    Inbox,
    Invoke,
    Mailbox,
    Now,
    Protocol,
    call_replicated,
    interrupted,
    performed,
    retried,
    undone,
    was_unsent,
)
from django_redislua.replies import text
from django_redislua.scripts import get_script
from django_redislua.transport import run

logger = logging.getLogger("django_redislua.locks")

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

ACQUIRE = "django_redislua.lock_acquire"
CONFIRM = "django_redislua.lock_confirm"
WITHDRAW = "django_redislua.lock_withdraw"
RELEASE = "django_redislua.lock_release"
_claim_window = (-1, 0)  # (settings generation, LOCK_CLAIM_WINDOW in ms): Lock._window_ms


Reply = list[Any]


class _Wait:
    """One acquire call of one Lock: its id, its deadline, and what its script calls send and
    their replies and wake-up messages mean."""

    def __init__(self, lock: Lock, deadline: float | None) -> None:
        self.lock = lock
        self.id = secrets.token_hex(8)
        self.deadline = deadline  # monotonic, the transport's Now; None: no limit
        self.sent_at = 0.0
        self.inbox = ""  # the token of the inbox a hand-off to this wait is published to
        self.granted = False  # a hand-off to this wait was heard: the next try confirms it
        # Made once subscribed (on_inbox), so that hearing the grant costs little: what the
        # grant message starts with, and the call that confirms it (lock_confirm.lua).
        self.grant = ""
        self.confirm_call: Call | None = None
        self.acked = 0  # replicas that confirmed the last call (with Lock(replicas=N))
        self.unreplicated = False  # acquired, but fewer replicas confirmed than asked for
        self.settling: list[str] = []  # the Lock's uncounted wait ids the last try sent

    def _stay_ms(self, now: float) -> int:
        """How long a queued registration lasts: until the waiter's next retry at the latest
        (it sleeps at most LONGEST_SLEEP, or until its deadline), with a second's margin."""
        left = LONGEST_SLEEP if self.deadline is None else min(self.deadline - now, LONGEST_SLEEP)
        return milliseconds(max(left, 0.0) + 1.0)

    def attempt(self, now: float | None) -> tuple[list[str], list[str | int]]:
        """Try to take (or confirm) the lock; ``now`` (the transport's clock) when subscribed,
        so the wait stays queued if the lock is held; None for a try that does not queue."""
        lock = self.lock
        self.settling = list(lock._uncounted)
        self.sent_at = time.monotonic()
        return lock._keys4, [lock.owner, self.id, lock._lease_ms, "1" if lock.reentrant else "0",
                             lock.name, 0 if now is None else self._stay_ms(now),
                             lock.keys.channel,
                             lock._window_ms(), inbox_prefix(), self.inbox, *self.settling]

    def confirm(self) -> Call:
        """The call confirming the hand-off this wait heard of (lock_confirm.lua): a claim that
        ran out meanwhile confirms nothing, and the next try is a full one again (queued anew).
        """
        assert self.confirm_call is not None  # granted only once subscribed
        self.granted = False
        self.sent_at = time.monotonic()
        return self.confirm_call

    def on_inbox(self, box: Mailbox) -> None:
        lock = self.lock
        self.inbox = box.token
        self.grant = f"granted {self.id} "
        script = get_script(CONFIRM)
        self.confirm_call = Call(script, script.command(lock._keys4[:1],
                                                        [lock.owner, self.id, lock._lease_ms]))

    def took(self, reply: Reply) -> float | None:
        """None when acquired (the Lock records it), else seconds until the next try: when the
        lock may change hands on its own (a lease or a claim running out), and at the latest
        after a claim window. A hand-off wakes only its heir, so a queued waiter looks again
        every claim window: a claim to a heir that died runs out within one, and the first
        waiter back then takes the lock."""
        acquired, value, count = reply
        if acquired:
            self.lock._held(int(value), self.sent_at, self.id)
            self.unreplicated = count == 1 and self.acked < self.lock.replicas
            return None
        value = int(value)
        left = seconds_left(value)
        return min(left, settings.LOCK_CLAIM_WINDOW)

    def on_message(self, data: str) -> bool | float | None:
        """None: try now (the lock was freed, or handed to this wait: confirm it). False: a
        grant in this wait's inbox to an earlier wait of the same inbox, nothing to do. Seconds
        (on the lock's channel, where a transport polls): it was handed to another wait; sleep
        at most until that claim would run out unconfirmed."""
        if self.grant and data.startswith(self.grant):
            self.granted = True
            return None
        word, *rest = data.split(" ")
        if word == "granted" and len(rest) == 3:
            # In this wait's own inbox: a hand-off to an earlier wait of this thread, long
            # settled. On the lock's channel: a claim for another wait.
            return False if self.inbox else int(rest[2]) / 1000
        return None

    def withdraw(self, mode: str) -> tuple[list[str], list[str | int]]:
        """Leave the queue; a hand-off made to this wait meanwhile is taken or given on."""
        lock = self.lock
        self.sent_at = time.monotonic()
        return lock._keys4, [lock.owner, self.id, lock._lease_ms, mode, lock.keys.channel,
                             lock.name, lock._window_ms(), inbox_prefix(), self.inbox]


class Lock:
    """A distributed lock named ``name`` whose lease lasts ``timeout`` (seconds or "30s")."""

    def __init__(
        self,
        name: str,
        timeout: float | str,
        blocking: bool = True,
        blocking_timeout: float | str | None = None,
        reentrant: bool = False,
        auto_renew: bool = False,
        on_lost: Callable[[Lock], object] | None = None,
        replicas: int = 0,
        replica_timeout: float | str = 0.1,
    ) -> None:
        self.name = name
        self.timeout = parse_duration(timeout)
        self.blocking = blocking
        self.blocking_timeout = parse_wait(blocking_timeout)
        self.reentrant = reentrant
        self.auto_renew = auto_renew
        self.on_lost = on_lost
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ValueError(f"Lock replicas must be an integer >= 0, not {replicas!r}")
        self.replicas = replicas
        self.replica_timeout = parse_duration(replica_timeout)
        self.owner = secrets.token_hex(16)
        self.token: int | None = None
        """The fencing token of the current (or last) acquisition."""
        self.keys = keys_for("lock", name)
        self._keys4 = [self.keys.base, self.keys.sub("fence"), self.keys.sub("queue"),
                       self.keys.sub("stale")]
        self._lease_ms = milliseconds(self.timeout)
        self._lease = Lease(self.keys.base, self.owner, 0.0, 0.0)
        # The wait ids of the holds this object knows it has: the acquire call that took the
        # lock, then each re-entry, latest last (released latest first).
        self._holds: list[str] = []
        # Wait ids that may hold the lock on the server though this object does not count them:
        # acquire calls whose replies never arrived (until their give-back is seen to land),
        # and holds whose release's reply never arrived. The next release or acquire settles
        # them: each is given back if it holds, and refused if it arrives later
        # (lock_release.lua, lock_acquire.lua).
        self._uncounted: set[str] = set()
        self._lost = False
        self._renewer: object | None = None

    def __repr__(self) -> str:
        return f"<Lock {self.name!r} timeout={self.timeout}s token={self.token}>"

    def copy(self) -> Lock:
        """A new Lock of the same name and options, with its own owner token."""
        return Lock(self.name, self.timeout, self.blocking, self.blocking_timeout,
                    self.reentrant, self.auto_renew, self.on_lost, self.replicas,
                    self.replica_timeout)

    @property
    def _depth(self) -> int:
        """How many holds this object knows it has (the first acquisition and re-entries)."""
        return len(self._holds)

    @property
    def lost(self) -> bool:
        """True when this object believes it holds the lock but its lease has (or may have) run
        out: renewal failed until the lease's end, Redis said it is someone else's, or the lease
        passed on this process's clock (a pause, no renewal). False again after a release or a
        new acquisition."""
        return self._lost or (self._depth > 0 and self._lease.expired)

    # -- what the replies mean ------------------------------------------------------------------

    @staticmethod
    def _window_ms() -> int:
        """LOCK_CLAIM_WINDOW in ms: every acquire and release sends it, so it is derived once
        per settings generation."""
        global _claim_window
        if _claim_window[0] != conf.generation:
            _claim_window = (conf.generation, milliseconds(settings.LOCK_CLAIM_WINDOW))
        return _claim_window[1]

    def _held(self, token: int, sent_at: float, wait_id: str) -> None:
        """Record the hold ``wait_id`` acquired: a re-entry keeps the token, a new
        acquisition has a new one (the holds of the last one, if any, are gone). The same
        wait's call sent again (a confirm whose reply was lost) is still one hold."""
        if token != self.token:
            self._holds = []
        self.token, self._lost = token, False
        if wait_id not in self._holds:
            self._holds.append(wait_id)
        self._lease.deadline = sent_at + self.timeout

    def _release_call(self, mode: str, token: int | None, hold: str, uncounted: list[str]
                      ) -> tuple[list[str], list[str | int]]:
        return self._keys4, [self.owner, mode, self.keys.channel, self.name, self._window_ms(),
                             "" if token is None else token, hold, inbox_prefix(), *uncounted]

    def _released(self, left: int, believed_held: bool, unconfirmed: bool = False) -> None:
        """Record a release's reply (the holds left on the server, or -1: not ours); raises
        when the lock was not ours any more, unless the release undid an ``unconfirmed``
        acquisition (see :meth:`_acquiring`)."""
        if left > 0:
            return
        self._holds = []  # freed, or not ours: no hold of this object is left on the server
        if left < 0 and not unconfirmed:
            raise self._not_owned("release", believed_held)

    def _not_owned(self, action: str, believed_held: bool) -> LockNotOwned:
        if believed_held:
            if not self._lost:  # the renewer had not found it lost: count it here
                metrics.lock_lost()
            self._lost = True
            return LeaseLost(f"cannot {action} lock {self.name!r}: its lease ran out or it was "
                             f"taken while this owner held it (token {self.token})")
        return LockNotOwned(f"cannot {action} lock {self.name!r}: not held by this owner "
                            f"(it expired, was force-released, or is held by someone else)")

    def _renewal_lost(self) -> None:
        """Called by the renewer when the lease ran out unrenewed or was taken."""
        if not self._lost:
            metrics.lock_lost()
        self._lost = True
        logger.error("lock %r (token %s): lease lost while held; another holder may run now",
                     self.name, self.token)
        if self.on_lost is not None:
            self.on_lost(self)

    def _replica_ms(self) -> int:
        """WAIT's timeout: ``replica_timeout``, kept below the socket timeout (WAIT blocks the
        connection, and a read that times out would lose the script's reply)."""
        socket_timeout = settings.SOCKET_TIMEOUT
        seconds = self.replica_timeout if socket_timeout is None else min(
            self.replica_timeout, socket_timeout * 0.8)
        return milliseconds(seconds)

    def _unreplicated(self) -> LockUnavailable:
        return LockUnavailable(
            f"lock {self.name!r} was acquired, but fewer than {self.replicas} replica(s) "
            f"confirmed it within {self.replica_timeout}s; it was released again")

    # -- the protocols ---------------------------------------------------------------------------

    def _call(self, wait: _Wait, name: str, keys: list[str], args: list[str | int]
              ) -> Protocol[Reply]:
        """One script call of ``wait``; with ``replicas``, followed by WAIT on its connection."""
        script = get_script(name)
        return (yield from self._calling(wait, Call(script, script.command(keys, args))))

    def _calling(self, wait: _Wait, call: Call) -> Protocol[Reply]:
        if not self.replicas:
            reply: Reply = yield call
            return reply
        reply, wait.acked = yield from call_replicated(call.script, call.command, self.replicas,
                                                       self._replica_ms())
        return reply

    def _attempt(self, wait: _Wait, queued: bool) -> Protocol[float | None]:
        if wait.granted:
            return wait.took((yield from self._calling(wait, wait.confirm())))
        keys, args = wait.attempt((yield Now()) if queued else None)
        reply = yield from self._call(wait, ACQUIRE, keys, args)
        self._uncounted.difference_update(wait.settling)  # settled by that call
        return wait.took(reply)

    def _withdrawing(self, wait: _Wait, mode: str) -> Protocol[bool]:
        """Leave the queue ("take": a hand-off made to this wait is taken; "give": whatever the
        wait holds is given back); True when the wait ends holding the lock."""
        keys, args = wait.withdraw(mode)
        return wait.took((yield from self._call(wait, WITHDRAW, keys, args))) is None

    def _giving_back(self, wait: _Wait) -> Protocol[None]:
        """The undo of an interrupted acquire: everything ``wait`` may hold, given back by its
        wait id; sent again until it lands, or until a lease it took would have run out
        unrenewed. One that never lands is settled by the next release (``_uncounted``)."""
        if (yield from retried(lambda: self._withdrawing(wait, "give"),
                               time.monotonic() + self.timeout + settings.LOCK_CLAIM_WINDOW)
                ) is not None:
            self._uncounted.discard(wait.id)

    def _acquiring(self, blocking: bool | None, blocking_timeout: float | str | None
                   ) -> Protocol[bool]:
        """Take the lock, counted by outcome in the metrics: acquired, timeout (the wait ran
        out, or a non-blocking try found it held) or unavailable (:class:`LockUnavailable`)."""
        started = time.monotonic()
        try:
            held = yield from lock_errors(self._acquire(blocking, blocking_timeout))
        except LockUnavailable:
            metrics.lock_acquired(metrics.UNAVAILABLE, None)
            raise
        metrics.lock_acquired(metrics.ACQUIRED if held else metrics.TIMEOUT,
                              time.monotonic() - started)
        return held

    def _acquire(self, blocking: bool | None, blocking_timeout: float | str | None
                 ) -> Protocol[bool]:
        blocking = self.blocking if blocking is None else blocking
        limit = self.blocking_timeout if blocking_timeout is None else parse_wait(blocking_timeout)
        wait = _Wait(self, (yield from deadline_after(limit)))
        try:
            held = (yield from self._attempt(wait, False)) is None or (blocking and (
                (yield from until(Inbox(self.keys.channel, inbox_prefix()),
                                  lambda: self._attempt(wait, True), wait.deadline,
                                  wait.on_message,
                                  wait.on_inbox))
                or (yield from self._withdrawing(wait, "take"))))
        except BaseException as exc:
            if not was_unsent(exc):  # its call may have reached Redis, and taken the lock there
                self._uncounted.add(wait.id)
            yield from undone(exc, self._giving_back(wait), f"redislua-withdraw:{self.name}")
            raise
        if not held:
            return False
        if wait.unreplicated:
            yield from self._releasing(unconfirmed=True)
            raise self._unreplicated()
        if self.auto_renew and self._holds and self._renewer is None:
            self._renewer = yield from start_renewing(self._lease, self.timeout,
                                                      self._renewal_lost, self.name)
        return True

    def _releasing(self, unconfirmed: bool = False) -> Protocol[None]:
        """Give back one hold (the last re-entry held, or the lock), by its wait id, and settle
        the acquire calls whose replies never arrived (see the module docstring). Finding the
        lock no longer ours raises, unless this undoes an ``unconfirmed`` acquisition (fewer
        replicas confirmed it than asked): then the caller never had it, and nothing was lost.
        Interrupted (a cancellation) before the reply came, the same release is sent again: by
        owner, token and hold, a second one changes nothing. Whatever happens, the caller no
        longer counts the hold: when the outcome stays unknown (Redis failed), the next release
        settles it, and after the last hold the renewer stops, so the lease ends by itself
        instead of living as long as the process."""
        believed_held = bool(self._holds)
        hold = self._holds.pop() if self._holds else ""
        uncounted = list(self._uncounted)
        keys, args = self._release_call("one" if self.reentrant else "all", self.token, hold,
                                        uncounted)
        script = get_script(RELEASE)
        try:
            try:
                left = int((yield Call(script, script.command(keys, args))))
            except BaseException as exc:
                if not interrupted(exc):
                    raise
                again = yield from retried(
                    lambda: performed(Call(script, script.command(keys, args))),
                    time.monotonic() + self.timeout)
                if again is None:
                    if hold:
                        self._uncounted.add(hold)
                else:
                    self._uncounted.difference_update(uncounted)
                    if int(again) <= 0:
                        self._holds = []
                raise
            self._uncounted.difference_update(uncounted)
            self._released(left, believed_held, unconfirmed)
        except CLIENT_ERRORS:
            if hold:
                self._uncounted.add(hold)  # given back or not: the next release settles it
            raise
        finally:
            if not self._holds:
                renewer, self._renewer = self._renewer, None
                if renewer is not None:
                    yield from stop_renewing(renewer)

    def _extending(self, additional_time: float | str, replace_ttl: bool) -> Protocol[None]:
        if not (yield from self._lease.extending(parse_duration(additional_time),
                                                 replace=replace_ttl)):
            raise self._not_owned("extend", self._depth > 0)

    def _locked(self) -> Protocol[bool]:
        return bool((yield Execute(("EXISTS", self.keys.base))))

    def _owned(self) -> Protocol[bool]:
        owner, claim = yield Execute(("HMGET", self.keys.base, "owner", "claim"))
        return owner is not None and claim is None and text(owner) == self.owner

    def _leaving(self, body_failed: bool) -> Protocol[None]:
        """Leave ``with``: release; LockNotOwned only when the body itself succeeded (its end
        ran unprotected: the caller must know)."""
        try:
            yield from lock_errors(self._releasing())
        except LockNotOwned:
            if not body_failed:
                raise

    def _entering(self) -> Protocol[Lock]:
        if not (yield from self._acquiring(None, None)):
            raise LockNotAcquired(f"lock {self.name!r} not acquired within "
                                  f"{self.blocking_timeout}s")
        return self

    def _holding(self, body: Invoke) -> Protocol[Any]:
        """Run ``body`` holding the lock (``with`` as one protocol, for the decorator)."""
        yield from self._entering()
        try:
            result = yield body
        except BaseException:
            yield from self._leaving(True)
            raise
        yield from self._leaving(False)
        return result

    # -- sync and asyncio: each a line that hands the protocol to a driver ------------------------

    def acquire(self, blocking: bool | None = None,
                blocking_timeout: float | str | None = None) -> bool:
        """Take the lock; True when held. Waits (woken on release) unless non-blocking."""
        return run(self._acquiring(blocking, blocking_timeout))

    def aacquire(self, blocking: bool | None = None,
                 blocking_timeout: float | str | None = None) -> Awaitable[bool]:
        """The asyncio twin of :meth:`acquire`. Cancelled at any point, it leaves nothing held
        and nobody queued."""
        return arun(self._acquiring(blocking, blocking_timeout))

    def release(self) -> None:
        """Release one hold (the last re-entry frees it and offers it to the next waiter);
        owner-checked: LockNotOwned (LeaseLost if this object held it) when not ours."""
        run(lock_errors(self._releasing()))

    def arelease(self) -> Awaitable[None]:
        """The asyncio twin of :meth:`release`."""
        return arun(lock_errors(self._releasing()))

    def extend(self, additional_time: float | str, replace_ttl: bool = False) -> None:
        """Add ``additional_time`` to the lease (or make it the lease); owner-checked."""
        run(lock_errors(self._extending(additional_time, replace_ttl)))

    def aextend(self, additional_time: float | str, replace_ttl: bool = False
                ) -> Awaitable[None]:
        """The asyncio twin of :meth:`extend`."""
        return arun(lock_errors(self._extending(additional_time, replace_ttl)))

    def locked(self) -> bool:
        """Whether anyone holds the lock now (an unconfirmed hand-off counts)."""
        return run(lock_errors(self._locked()))

    def alocked(self) -> Awaitable[bool]:
        return arun(lock_errors(self._locked()))

    def owned(self) -> bool:
        """Whether this Lock object's owner holds the lock now."""
        return run(lock_errors(self._owned()))

    def aowned(self) -> Awaitable[bool]:
        return arun(lock_errors(self._owned()))

    def __enter__(self) -> Lock:
        return run(self._entering())

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        run(self._leaving(exc is not None))

    def __aenter__(self) -> Awaitable[Lock]:
        return arun(self._entering())

    def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                  tb: TracebackType | None) -> Awaitable[None]:
        return arun(self._leaving(exc is not None))

    # -- decorator -----------------------------------------------------------------------------

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        """Decorate a function (sync or async): each call runs holding a fresh copy of the lock."""
        if iscoroutinefunction(func):
            async_func = cast(Callable[P, Awaitable[Any]], func)

            @functools.wraps(func)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                body = Invoke(functools.partial(async_func, *args, **kwargs))
                return await arun(self.copy()._holding(body))

            return cast(Callable[P, R], run_async)

        @functools.wraps(func)
        def run_sync(*args: P.args, **kwargs: P.kwargs) -> R:
            return cast(R, run(self.copy()._holding(Invoke(functools.partial(func, *args,
                                                                             **kwargs)))))

        return run_sync


