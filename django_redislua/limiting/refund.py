"""Refunds: what an admitted hit took, given back (``count_failures`` policies).

A policy with ``count_failures`` counts only the requests that failed (a login's wrong
password). The request is decided before the view as by any policy (one script call that
consumes, and refuses once the budget is spent), so concurrent attempts can never exceed the
budget; once the response says the request did not fail, the Django layers give the hit back
here: one more script call (``ratelimit_refund.lua``) for all of a request's refunds. A
request refused consumed nothing, a failure keeps its hit: neither costs a round trip.

A :class:`Refund` is one Decision that consumed and when its reply came (this process's
clock, moved by the testing helpers' ``advance()`` like the decisions' own). It is sent at
most once: marked before it is sent, so a refund whose reply was lost (Redis failing, a
timeout) is not sent again. A refund lost leaves one more failure counted, the safe side;
a refund sent twice would give back twice.

The script finds the hit by what its Decision said (its ``reset_after``) and the time this
process measured since (a lower bound of the server's): see the script's header for each
algorithm, and what "exactly" means there. No request in here: the Django layers decide
which responses are failures (``request_layer.failed``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from django_redislua.drivers import drive
from django_redislua.limiting import clock, denials
from django_redislua.limiting.decision import RATE, Decision
from django_redislua.protocol import Protocol, call_groups
from django_redislua.scripts import get_script
from django_redislua.transport import current, transport_for

SCRIPT = "django_redislua.ratelimit_refund"


def local_us() -> int:
    """This process's clock for refunds (us): monotonic, moved as far ahead as the decisions'
    clock (:func:`clock.advance`), so the time between a hit and its refund is what the
    decisions' clock saw pass."""
    return time.monotonic_ns() // 1000 + clock.shift_us


class Refund:
    """One admitted hit of a ``count_failures`` policy, which its request's response may give
    back: ``decision`` (what it consumed, its reset_after) and ``received``, when its reply
    came (:func:`local_us`, or the time a test injected). ``sent``: given back already (or
    tried), never again."""

    __slots__ = ("decision", "received", "sent")

    def __init__(self, decision: Decision, received: int | None = None) -> None:
        self.decision = decision
        self.received = local_us() if received is None else received
        self.sent = False

    def __repr__(self) -> str:
        d = self.decision
        return f"<Refund {d.policy.name} {d.key!r} cost={d.consumed}{' sent' if self.sent else ''}>"

    def arguments(self, now_us: int | None) -> tuple[list[str], list[Any]]:
        """The script's KEYS and ARGV (see ratelimit_refund.lua); ``now_us``: a test's time,
        which ``received`` is then on too."""
        d = self.decision
        policy = d.policy
        elapsed = (local_us() if now_us is None else now_us) - self.received
        state, overrides = policy.redis_keys(d.key)
        return [state, overrides], [
            clock.script_now(now_us), policy.code, policy.limit, policy.param,
            policy.calendar_bounds(now_us) if policy.code == "ca" else policy.extra,
            policy.name, d.consumed, d.limit, "r" if d.override == RATE else "",
            round(d.reset_after * 1_000_000), max(0, elapsed),
        ]


def refunds_of(decisions: Iterable[Decision], received: int | None = None
               ) -> tuple[Refund, ...]:
    """A Refund for each Decision that consumed from a ``count_failures`` policy: once per
    Decision (two rules on one policy and identity share one, merged), shadow and
    ``block=False`` ones too. Empty, and free, for every other policy."""
    found: dict[int, Refund] = {}
    for decision in decisions:
        if (decision.consumed and decision.policy.count_failures is not None
                and id(decision) not in found):
            found[id(decision)] = Refund(decision, received)
    return tuple(found.values())


def refunding(refunds: Sequence[Refund], now_us: int | None = None) -> Protocol[list[bool]]:
    """Give back every refund not sent yet, in one round trip (one script call each, sent
    together: one per node on a cluster). Per refund, True when the script gave something
    back (False: sent before, or nothing left to give back: see the script). A failure is
    raised (Redis failing: the caller logs it); the refunds it was sending stay marked sent."""
    due = [refund for refund in refunds if not refund.sent]
    if not due:
        return [False] * len(refunds)
    for refund in due:
        refund.sent = True  # before sending: a reply lost never sends it again
    script = get_script(SCRIPT)
    commands = [script.command(*refund.arguments(now_us)) for refund in due]
    replies = yield from call_groups(script, commands)
    given = {id(refund): bool(reply) for refund, reply in zip(due, replies, strict=True)}
    for refund in due:
        if given[id(refund)]:
            # A denial this process remembers for the identity may be lifted now.
            denials.forget(refund.decision.policy.redis_key(refund.decision.key))
    return [given.get(id(refund), False) for refund in refunds]


def give_back(refunds: Sequence[Refund], *, now_us: int | None = None,
              client: Any = None) -> list[bool]:
    """:func:`refunding` on the sync driver; ``client`` a redis-py client (or any object with
    ``execute_command``) instead of the app's, ``now_us`` a test's time."""
    transport = current() if client is None else transport_for(client)
    return drive(refunding(refunds, now_us), transport)
