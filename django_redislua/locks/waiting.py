"""Waiting that is woken by Redis, not by a timer: a waiter subscribes to the primitive's channel,
tries again, and sleeps until a ``released`` message arrives or until the current lease would
expire (whichever is first), bounded by its own deadline. There is no fixed-interval poll: a
waiter wakes when the state it waits on may have changed, and at no other time.

The subscription is confirmed by the server before the retry, so a release between the failed
try and the subscription cannot be missed.

A caller may read the messages itself (``on_message``): a lock's release hands the lock to a
queued waiter and says so on the channel, so that waiter is done on reading the message, with no
further round trip, and the others know not to try.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from django_redislua.connection import get_async_client, get_client

# An attempt returns None when it succeeded, else the seconds after which the state changes on
# its own (a lease expiring); math.inf when only a message can change it.
Attempt = Callable[[], "float | None"]
AsyncAttempt = Callable[[], Awaitable["float | None"]]
# Reads a wake-up message: True = the wait succeeded (nothing more to do), False = not for us
# (keep sleeping), None = try again now.
OnMessage = Callable[[str], "bool | None"]

# How long to wait for the server to confirm SUBSCRIBE before trying anyway.
_SUBSCRIBE_CONFIRM = 1.0
# The longest single sleep. redis-py reads a pub/sub message without the socket timeout only
# when given a finite wait, and a lease-less state (math.inf) is re-checked this often.
LONGEST_SLEEP = 60.0


def _bounded(wait: float, deadline: float | None) -> float:
    """Seconds to sleep before the next attempt, or -1.0 when the deadline has passed."""
    if deadline is not None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return -1.0
        wait = min(wait, remaining)
    return min(max(wait, 0.0), LONGEST_SLEEP)


def _is(message: Any, kind: str) -> bool:
    return isinstance(message, dict) and message.get("type") in (kind, kind.encode())


def _verdict(message: Any, on_message: OnMessage | None) -> bool | str | None:
    """"sleep" for no message; else what ``on_message`` makes of it (None: retry)."""
    if not _is(message, "message"):
        return "sleep"
    if on_message is None:
        return None
    data = message["data"]
    return on_message(data.decode() if isinstance(data, bytes) else str(data))


def wait_until(channel: str, attempt: Attempt, timeout: float | None,
               on_message: OnMessage | None = None) -> bool:
    """Retry ``attempt`` on every wake-up until it succeeds (True) or ``timeout`` passes (False)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pubsub = get_client().pubsub()  # type: ignore[no-untyped-call]
    try:
        pubsub.subscribe(channel)
        confirm_by = time.monotonic() + _SUBSCRIBE_CONFIRM
        while not _is(pubsub.get_message(timeout=max(confirm_by - time.monotonic(), 0)),
                      "subscribe"):
            if time.monotonic() >= confirm_by:
                break
        while True:
            wait = attempt()
            if wait is None:
                return True
            sleep = _bounded(wait, deadline)
            if sleep < 0:
                return False
            wake_at = time.monotonic() + sleep
            while True:
                left = max(wake_at - time.monotonic(), 0.0)
                verdict = _verdict(pubsub.get_message(timeout=left), on_message)
                if verdict is True:
                    return True
                if verdict is None or time.monotonic() >= wake_at:
                    break
    finally:
        pubsub.close()


async def await_until(channel: str, attempt: AsyncAttempt, timeout: float | None,
                      on_message: OnMessage | None = None) -> bool:
    """The asyncio twin of :func:`wait_until`; cancelling it unsubscribes and leaves no state."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pubsub = get_async_client().pubsub()
    try:
        await pubsub.subscribe(channel)
        confirm_by = time.monotonic() + _SUBSCRIBE_CONFIRM
        while not _is(
            await pubsub.get_message(timeout=max(confirm_by - time.monotonic(), 0)), "subscribe"
        ):
            if time.monotonic() >= confirm_by:
                break
        while True:
            wait = await attempt()
            if wait is None:
                return True
            sleep = _bounded(wait, deadline)
            if sleep < 0:
                return False
            wake_at = time.monotonic() + sleep
            while True:
                left = max(wake_at - time.monotonic(), 0.0)
                verdict = _verdict(await pubsub.get_message(timeout=left), on_message)
                if verdict is True:
                    return True
                if verdict is None or time.monotonic() >= wake_at:
                    break
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
