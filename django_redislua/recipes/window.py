"""``WindowStats``: count, total, minimum and maximum of samples over a sliding window.

Keeping every sample (a sorted set) makes memory grow with traffic. Here the window is cut into
``buckets`` buckets, each holding count, total, minimum and maximum, used in turn: memory per
subject is fixed (five hash fields per bucket), and each add or summary is one script call.
The price is granularity: a summary covers the current bucket and the ``buckets - 1`` before
it, so it sees between ``window - window / buckets`` and ``window`` of history.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django_redislua.limiting import clock
from django_redislua.recipes.base import (
    Op,
    arun,
    delete_op,
    finite,
    key,
    microseconds,
    recipe_name,
    run,
    whole,
)

MAX_BUCKETS = 1000


class Summary(NamedTuple):
    """The samples in the window: how many (``samples``: a tuple's ``count`` is a method),
    their sum, the smallest and the largest (None when there are none)."""

    samples: int
    total: float
    minimum: float | None
    maximum: float | None


def _summary(reply: Any) -> Summary:
    count, total, low, high = reply
    return Summary(int(count), float(total), float(low) if low else None,
                   float(high) if high else None)


class WindowStats:
    """Statistics per subject over the last ``window`` (a duration), in ``buckets`` steps
    (1 to 1000; the window must be at least that many microseconds). Times are the Redis
    server's (moved by the testing helpers' ``advance()``)."""

    kind = "wstats"

    def __init__(self, name: str, window: float | str = "1m", buckets: int = 10) -> None:
        self.name = recipe_name(name)
        self.buckets = whole(buckets, "buckets", 1)
        if self.buckets > MAX_BUCKETS:
            raise ValueError(f"buckets must be at most {MAX_BUCKETS}, not {buckets}")
        window_us = microseconds(window)
        if window_us % self.buckets:
            raise ValueError(f"a window of {window_us} us does not split into {buckets} "
                             f"whole-microsecond buckets")
        self.width_us = window_us // self.buckets

    def __repr__(self) -> str:
        return f"<WindowStats {self.name}>"

    def key(self, subject: str | bytes | int) -> str:
        return key(self.kind, self.name, subject)

    def _add(self, subject: str | bytes | int, sample: float, now_us: int | None) -> Op[bool]:
        return Op("django_redislua.recipe_window_add", [self.key(subject)],
                  [clock.script_now(now_us), repr(finite(sample, "sample")), self.width_us,
                   self.buckets], bool)

    def add(self, subject: str | bytes | int, sample: float, *,
            now_us: int | None = None) -> bool:
        """Record ``sample`` (a finite number) for ``subject``. False only when the server's
        clock went back past what the bucket holds (the sample is dropped)."""
        return run(self._add(subject, sample, now_us))

    async def aadd(self, subject: str | bytes | int, sample: float, *,
                   now_us: int | None = None) -> bool:
        return await arun(self._add(subject, sample, now_us))

    def _summary(self, subject: str | bytes | int, now_us: int | None) -> Op[Summary]:
        return Op("django_redislua.recipe_window_summary", [self.key(subject)],
                  [clock.script_now(now_us), self.width_us, self.buckets], _summary)

    def summary(self, subject: str | bytes | int, *, now_us: int | None = None) -> Summary:
        """``(count, total, minimum, maximum)`` of ``subject``'s samples in the window."""
        return run(self._summary(subject, now_us))

    async def asummary(self, subject: str | bytes | int, *,
                       now_us: int | None = None) -> Summary:
        return await arun(self._summary(subject, now_us))

    def reset(self, subject: str | bytes | int) -> bool:
        """Forget ``subject``'s samples; True if there were any."""
        return run(delete_op([self.key(subject)]))

    async def areset(self, subject: str | bytes | int) -> bool:
        return await arun(delete_op([self.key(subject)]))
