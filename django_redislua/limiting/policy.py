"""Policy: a named limit (:class:`~django_redislua.limiting.definition.PolicyDefinition`) that
decides for one identity in one round trip, through the engine. No Django request in here.

The engine, the denial cache and :class:`Decision` read the definition; only this class knows
the engine, so the two do not import each other.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING

from django_redislua.atransport import arun
from django_redislua.limiting import engine
from django_redislua.limiting.decision import Decision, PolicyError, RateLimited
from django_redislua.limiting.definition import PolicyDefinition
from django_redislua.transport import run

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

__all__ = ["Decision", "Policy", "PolicyError", "RateLimited"]


class Policy(PolicyDefinition):
    """A named limit. ``hit``/``peek``/``reset`` decide for one identity in one round trip.

    ``rate`` is ``"N/period"``; it may also be a callable ``(request) -> str | None`` or its
    dotted path, which the Django layers resolve per request with :meth:`with_rate`.
    """

    # -- deciding (one round trip each) -------------------------------------------------------
    def hit(self, key: str | bytes | int, cost: int | None = None) -> Decision:
        return engine.decide(self, key, self.cost if cost is None else cost)

    def peek(self, key: str | bytes | int) -> Decision:
        return engine.decide(self, key, self.cost, peek=True)

    def reset(self, key: str | bytes | int) -> bool:
        """Forget ``key``'s state; False when there was none."""
        return run(engine.resetting(self, key))

    def release(self, key: str | bytes | int, decision: Decision) -> None:
        """Give back a concurrency slot taken by ``decision``."""
        run(engine.releasing(self, key, decision))

    def ahit(self, key: str | bytes | int, cost: int | None = None) -> Awaitable[Decision]:
        return engine.adecide(self, key, self.cost if cost is None else cost)

    def apeek(self, key: str | bytes | int) -> Awaitable[Decision]:
        return engine.adecide(self, key, self.cost, peek=True)

    def areset(self, key: str | bytes | int) -> Awaitable[bool]:
        return arun(engine.resetting(self, key))

    def arelease(self, key: str | bytes | int, decision: Decision) -> Awaitable[None]:
        return arun(engine.releasing(self, key, decision))

    def slot(self, key: str | bytes | int) -> AbstractContextManager[Decision]:
        """``with policy.slot(key):`` holds a concurrency slot; RateLimited if none is free."""
        return engine.slot(self, key)

    def aslot(self, key: str | bytes | int) -> engine.Slot:
        return engine.aslot(self, key)
