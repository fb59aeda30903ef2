"""Waiting that is woken by Redis, not by a timer: a waiter subscribes to the primitive's channel,
tries again, and sleeps until a ``released`` message arrives or until the current lease would
expire (whichever is first), bounded by its own deadline. There is no fixed-interval poll: a
waiter wakes when the state it waits on may have changed, and at no other time (except where
the transport cannot subscribe: redis-py before 8.0 on an asyncio cluster polls, see
``transport.POLL_INTERVAL``; and a lock's queued waiter, which hears only the hand-offs made to
itself, looks again at least once per claim window: see ``lock._Wait.took``).

The subscription is confirmed by the server before the retry, so a release between the failed
try and the subscription cannot be missed. The sync transport keeps a thread's pub/sub
connection from one wait to the next (subscribing and unsubscribing per wait), so waiting costs
no new connection; a lock's waiter listens on the thread's *inbox* instead (``protocol.Inbox``),
a channel of its own that stays subscribed, confirmed once for all its waits.

A caller may read the messages itself (``on_message``): a lock's release offers the lock to one
queued waiter and says so on the channel, so that waiter confirms at once and the others sleep
only until the offer would run out unconfirmed.

:func:`until` is a protocol (:mod:`django_redislua.protocol`): the same wait for both drivers.
It reads the clock through the transport (``protocol.Now``), so a scripted transport runs a
wait in virtual time (``tests/unit/test_waiting.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django_redislua.protocol import Inbox, Listen, Mailbox, Now, Protocol, Subscribe, Unsubscribe
from django_redislua.replies import text

# An attempt is a protocol returning None when it succeeded, else the seconds after which the
# state changes on its own (a lease expiring); math.inf when only a message can change it.
Attempt = Callable[[], Protocol["float | None"]]
# Reads a wake-up message: True = the wait succeeded (nothing more to do), False = not for us
# (keep sleeping), a number = not for us, but sleep at most that many seconds more, None = try
# again now.
OnMessage = Callable[[str], "bool | float | None"]

# How long to wait for the server to confirm SUBSCRIBE before trying anyway.
_SUBSCRIBE_CONFIRM = 1.0
# The longest single sleep. redis-py reads a pub/sub message without the socket timeout only
# when given a finite wait, and a lease-less state (math.inf) is re-checked this often.
LONGEST_SLEEP = 60.0


def _bounded(wait: float, deadline: float | None, now: float) -> float:
    """Seconds to sleep before the next attempt, or -1.0 when the deadline has passed."""
    if deadline is not None:
        remaining = deadline - now
        if remaining <= 0:
            return -1.0
        wait = min(wait, remaining)
    return min(max(wait, 0.0), LONGEST_SLEEP)


def _woken(verdict: bool | float | str, wake_at: float, deadline: float | None,
           now: float) -> float:
    """When to try next after a message that was not for us: unchanged, or (a number) at most
    that many seconds from now."""
    if isinstance(verdict, (bool, str)):
        return wake_at
    return min(wake_at, now + max(_bounded(verdict, deadline, now), 0.0))


# A message's type, as redis-py gives it (text, or bytes on some versions and protocols).
_TYPES = {kind: (kind, kind.encode()) for kind in ("message", "subscribe")}


def _is(message: Any, kind: str, channel: str) -> bool:
    """A pub/sub message of type ``kind`` on ``channel`` (a kept connection may still deliver
    what was sent to a channel of an earlier wait)."""
    if not isinstance(message, dict) or message.get("type") not in _TYPES[kind]:
        return False
    name = message.get("channel")
    return name is not None and text(name) == channel


def _verdict(message: Any, channel: str,
             on_message: OnMessage | None) -> bool | float | str | None:
    """"sleep" for no message; else what ``on_message`` makes of it (None: retry)."""
    if not _is(message, "message", channel):
        return "sleep"
    if on_message is None:
        return None
    data = message["data"]
    return on_message(text(data))


def seconds_left(ms: int) -> float:
    """A state's own end, from the milliseconds Redis says it has left (``PTTL``), as the
    seconds to sleep before trying again: -1 (no expiry) never, ``math.inf``; -2 (the key is
    gone: free) none, try at once; else at least a millisecond, as ``PTTL`` says 0 through a
    key's last millisecond (it expires after that), and a try sooner would find it still there
    and try again at once, spinning until it expires."""
    if ms == -1:
        return math.inf
    return 0.0 if ms < 0 else max(ms, 1) / 1000


def deadline_after(timeout: float | None) -> Protocol[float | None]:
    """The monotonic time a wait of ``timeout`` seconds (None: no limit) begun now ends at,
    read through the transport (``Now``): a scripted transport's virtual clock sets it too."""
    if timeout is None:
        return None
    now: float = yield Now()
    return now + timeout


def until(channel: str | Inbox, attempt: Attempt, deadline: float | None,
          on_message: OnMessage | None = None,
          on_inbox: Callable[[Mailbox], None] | None = None) -> Protocol[bool]:
    """Retry ``attempt`` on every wake-up until it succeeds (True) or ``deadline`` (monotonic;
    None: none) passes (False). The deadline is the caller's, taken before its first try: a
    first try that was slow (Redis paused) is part of the wait, not added to it. Subscribed for
    the whole wait (to ``channel``, or to the caller's own inbox, which ``on_inbox`` is told
    before the first attempt); unsubscribed however it ends (a kept inbox stays subscribed)."""
    box: Mailbox | None = None
    if isinstance(channel, Inbox):
        box = yield channel
        subscription, channel, confirmed = box.subscription, box.channel, box.confirmed
        if on_inbox is not None:
            on_inbox(box)
    else:
        subscription, confirmed = (yield Subscribe(channel)), False
    try:
        if not confirmed:
            now: float = yield Now()
            confirm_by = now + _SUBSCRIBE_CONFIRM
            if deadline is not None:
                confirm_by = min(confirm_by, deadline)  # never past the caller's deadline
            while not _is((yield Listen(subscription, max(confirm_by - now, 0))),
                          "subscribe", channel):
                now = yield Now()
                if now >= confirm_by:
                    break
        if box is not None and box.kept:
            box.confirmed = True  # read (or given up on: a late one is skipped as no message)
        while True:
            wait = yield from attempt()
            if wait is None:
                return True
            now = yield Now()
            sleep = _bounded(wait, deadline, now)
            if sleep < 0:
                return False
            wake_at = now + sleep
            while True:
                left = max(wake_at - now, 0.0)
                verdict = _verdict((yield Listen(subscription, left)), channel, on_message)
                if verdict is True:
                    return True
                if verdict is None:
                    break
                now = yield Now()
                wake_at = _woken(verdict, wake_at, deadline, now)
                if now >= wake_at:
                    break
    finally:
        if box is None or not box.kept:
            yield Unsubscribe(subscription, channel)
