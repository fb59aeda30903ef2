"""The local denial cache: a flood from one identity answered without a round trip.

When Redis denies a policy and identity for cost ``c`` with ``retry_after`` r, no request of
that policy and identity with a cost of ``c`` or more can be admitted before ``r`` has passed
on the server (every algorithm's answer is monotonic in cost, and other requests only take
more). So this process answers such requests itself until ``sent + min(r, 1 s)``, ``sent``
being when the denied request was sent (before the server decided: never later than Redis
would lift the denial). Then it asks Redis again.

It answers the same cost ``c`` (a flood repeats one request), and for a fixed window any larger
cost too: there the wait does not depend on the cost. For the other algorithms a larger cost
waits longer than ``r`` by an amount only the server's state tells, so it goes to Redis: a local
answer must carry the ``Retry-After`` Redis would give.

- It only denies, never admits: it cannot let through what Redis would refuse.
- A local answer carries Redis's word: ``retry_after`` and ``reset_after`` count down to the
  moments Redis gave; ``remaining`` is what it reported (for a cost of 1, or a fixed window,
  it cannot change before the denial lifts; a bucket may refill part of a larger cost
  meanwhile). A request this process gets admitted, with a smaller cost, drops the entry.
- The 1 s bound how long a reset elsewhere (the admin, ``redislua_reset``, another
  process's ``policy.reset``) goes unseen: one second. A reset in this process forgets the
  entry at once.
- Concurrency policies are never cached: a release frees a slot at any moment.
- Bounded: at most ``MAX_ENTRIES`` identities; a full cache drops expired entries, and starts
  over if that is not enough (entries are only a shortcut, never state).

``REDISLUA["LOCAL_DENY"] = False`` turns it off.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django_redislua.conf import on_change, settings
from django_redislua.limiting import clock as decision_clock
from django_redislua.limiting.decision import RATE, Decision

if TYPE_CHECKING:
    from django_redislua.limiting.definition import PolicyDefinition

# A denial is answered locally for 1 s at most: a reset elsewhere waits no longer.
HORIZON_US = 1_000_000
US = 1_000_000
MAX_ENTRIES = 10_000

# state key -> (cost, sent, answer until, lifted at, remaining, reset at, the policy's
# parameters), times in integer microseconds on the clock of the request that was denied (see
# clock()): a request on another clock (a test's or a DRF timer's injected time against this
# process's) falls outside [sent, until) and asks Redis. The parameters (limit, param,
# extra) tie a denial to the rate that made it: a rate changed since (settings, a rate
# callable) asks Redis again. Last, the live override that denied (decision.BLOCK or RATE), if
# one did, and the limit the denial was decided with (a changed rate's, or the policy's).
Entry = tuple[int, int, int, int, int, int, tuple[int, int, str], str | None, int]
_entries: dict[str, Entry] = {}


def answer(key: str, cost: int, now: int, policy: PolicyDefinition,
           identity: str | bytes | int) -> Decision | None:
    """The local denial for ``cost`` at ``now``, or None to ask Redis."""
    entry = _entries.get(key)
    if (entry is None or not entry[1] <= now < entry[2]
            or (cost != entry[0] and (cost < entry[0] or policy.code != "fw"))
            or entry[6] != (policy.limit, policy.param, policy.extra)):
        return None
    _cost, _sent, _until, lifted, remaining, reset_at, _params, override, limit = entry
    return Decision(False, limit, remaining, max(0, reset_at - now) / US,
                    (lifted - now) / US, policy, identity, None, True, override)


def learn(key: str, cost: int, sent: int, policy: PolicyDefinition, reply: Sequence[int],
          consumed: bool, by: str | None = None) -> None:
    """What Redis answered a hit of ``cost`` on ``key`` (its reply: allowed, remaining,
    reset_after us, retry_after us), for a request sent at ``sent``: a denial is remembered;
    a hit that consumed changed the state, so a denial known for a larger cost (with the quota
    it reported) is dropped. ``by``: the live override that decided, if one did."""
    if consumed:
        _entries.pop(key, None)
    elif not reply[0] & 1 and reply[3] >= 0:  # (-1: no wait admits it; Redis is asked again)
        _record(key, cost, sent, policy, reply, by)
    elif by is not None:  # admitted by an override, nothing consumed: the denial is over
        _entries.pop(key, None)


def _record(key: str, cost: int, sent: int, policy: PolicyDefinition, reply: Sequence[int],
            by: str | None) -> None:
    if policy.code == "cc" or not settings.LOCAL_DENY:
        return
    if len(_entries) >= MAX_ENTRIES:
        _make_room(sent)
    retry = reply[3]
    # A changed rate's denial is its own only while the override lasts (reply[5]).
    horizon = min(HORIZON_US, reply[5]) if by == RATE else HORIZON_US
    _entries[key] = (cost, sent, sent + min(retry, horizon), sent + retry, reply[1],
                     sent + reply[2], (policy.limit, policy.param, policy.extra), by,
                     reply[4] if by == RATE else policy.limit)


def _make_room(now: int) -> None:
    for key in [key for key, entry in list(_entries.items()) if not entry[1] <= now < entry[2]]:
        _entries.pop(key, None)
    if len(_entries) >= MAX_ENTRIES * 9 // 10:
        _entries.clear()


def forget(key: str | None = None) -> None:
    """Drop the entry of one state key (it was reset here), or every entry."""
    if key is None:
        _entries.clear()
    else:
        _entries.pop(key, None)


def clock(now_us: int | None) -> int:
    """The cache's clock in microseconds: this process's wall clock (moved as far ahead as the
    decisions' clock, see :mod:`clock`), or a test's injected server time.

    The wall clock, not the monotonic one: a denial lasts until a moment on the server's
    clock, which a suspended machine's monotonic clock would place too late (it stops while
    suspended). A step of the wall clock cannot stretch a local answer: an entry answers only
    inside [sent, sent + 1 s), so a step back or forward past it asks Redis again. A calendar
    quota's decision reads its period from this same reading (one clock read a decision)."""
    if now_us is None:
        return time.time_ns() // 1000 + decision_clock.shift_us
    return now_us


@on_change
def _settings_changed() -> None:
    _entries.clear()

