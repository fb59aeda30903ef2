"""``CappedCounter``: a counter that never passes its cap, one period at a time.

The classic race: ``GET``, compare with the cap, ``INCRBY``; two requests both read 999 and
both count the 1000th download. Here the compare and the add are one script.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django_redislua.limiting import clock
from django_redislua.recipes.base import (
    Op,
    arun,
    delete_op,
    key,
    microseconds,
    recipe_name,
    run,
    whole,
)


class Count(NamedTuple):
    """What :meth:`CappedCounter.add` did: the counter's ``value`` after the call and whether
    the amount was ``accepted``."""

    value: int
    accepted: bool


class CappedCounter:
    """A counter per subject, never above ``cap``; it starts at 0 with its first add and lives
    ``ttl`` (a duration: seconds or ``"1d"``), then starts again from 0.

    ``add`` adds when the sum stays within the cap, else changes nothing. The period runs on
    the Redis server's clock (moved by the testing helpers' ``advance()``).
    """

    kind = "cap"

    def __init__(self, name: str, cap: int, ttl: float | str) -> None:
        self.name = recipe_name(name)
        self.cap = whole(cap, "cap")
        self.period_us = microseconds(ttl)

    def __repr__(self) -> str:
        return f"<CappedCounter {self.name} cap={self.cap}>"

    def key(self, subject: str | bytes | int) -> str:
        return key(self.kind, self.name, subject)

    def _add(self, subject: str | bytes | int, amount: int, now_us: int | None) -> Op[Count]:
        whole(amount, "amount", 1)
        return Op("django_redislua.recipe_counter_add", [self.key(subject)],
                  [clock.script_now(now_us), amount, self.cap, self.period_us], _count)

    def add(self, subject: str | bytes | int, amount: int = 1, *,
            now_us: int | None = None) -> Count:
        """Add ``amount`` (>= 1) to ``subject``'s counter unless that passes the cap: one
        script call. ``now_us`` injects the time (tests)."""
        return run(self._add(subject, amount, now_us))

    async def aadd(self, subject: str | bytes | int, amount: int = 1, *,
                   now_us: int | None = None) -> Count:
        return await arun(self._add(subject, amount, now_us))

    def _value(self, subject: str | bytes | int, now_us: int | None) -> Op[int]:
        return Op("django_redislua.recipe_counter_get", [self.key(subject)],
                  [clock.script_now(now_us)], int)

    def value(self, subject: str | bytes | int, *, now_us: int | None = None) -> int:
        """``subject``'s count in the current period (0 when none runs)."""
        return run(self._value(subject, now_us))

    async def avalue(self, subject: str | bytes | int, *, now_us: int | None = None) -> int:
        return await arun(self._value(subject, now_us))

    def reset(self, subject: str | bytes | int) -> bool:
        """Forget ``subject``'s counter (the next add starts a new period); True if it existed."""
        return run(delete_op([self.key(subject)]))

    async def areset(self, subject: str | bytes | int) -> bool:
        return await arun(delete_op([self.key(subject)]))


def _count(reply: Any) -> Count:
    return Count(int(reply[0]), bool(reply[1]))
