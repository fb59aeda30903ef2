"""What a rate decision says (:class:`Decision`), what a denied request raises
(:class:`RateLimited`), and what a misconfigured policy raises (:class:`PolicyError`, from
:mod:`~django_redislua.limiting.errors`). No I/O: every layer may use these."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from django_redislua.limiting.errors import PolicyError as PolicyError

if TYPE_CHECKING:
    from django_redislua.limiting.definition import PolicyDefinition


# What a live override (django_redislua.overrides) did to a Decision: it was refused (BLOCK) or
# admitted (ALLOW) without its policy deciding, or its policy decided at another rate (RATE).
BLOCK, ALLOW, RATE = "block", "allow", "rate"


class Decision(NamedTuple):
    """What Redis decided for one policy and one identity. Immutable; a named tuple because
    one is built for every decision, at a third of a frozen dataclass's cost."""

    allowed: bool
    limit: int
    remaining: int
    reset_after: float
    retry_after: float
    policy: PolicyDefinition
    key: str | bytes | int = ""
    lease: str | None = None
    local: bool = False  # answered by this process's denial cache, without a round trip
    override: str | None = None  # BLOCK, ALLOW or RATE: a live override's doing
    # What this hit took from the policy's state (its cost), 0 when it took nothing (a denial,
    # a peek, a live override's block or allow, a gating rule denied by another): what a
    # count_failures policy gives back for a request that did not fail (limiting/refund.py).
    consumed: int = 0

    def __bool__(self) -> bool:
        return self.allowed

    @property
    def shadow(self) -> bool:
        """The policy is in shadow mode: the Django layers never block on this Decision."""
        return self.policy.shadow


# ``all(map(allowed_of, decisions))``: whether every one allowed, without a Python frame per
# Decision (the request layer asks it of every response).
allowed_of = operator.attrgetter("allowed")


class RateLimited(Exception):
    """Raised when a request is denied; carries every Decision made for it."""

    def __init__(self, decisions: Sequence[Decision]) -> None:
        self.decisions = list(decisions)
        denied = [d for d in self.decisions if not d.allowed]
        names = ", ".join(d.policy.name for d in denied) or "?"
        super().__init__(f"rate limited by {names}; retry after {self.retry_after:.3f}s")

    @property
    def retry_after(self) -> float:
        return max((d.retry_after for d in self.decisions if not d.allowed), default=0.0)
