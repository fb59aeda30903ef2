"""Pure-Python reference models of the seven rate-limit algorithms.

Each model mirrors the integer-microsecond semantics of its Lua fragment in
``django_redislua/redislua/lib/`` and keeps its state in a dict per key, so the property tests can
drive the same random sequence through a model and through real Redis and compare every field.

A model's ``check(key, now, cost)`` looks without changing anything and returns a ``Pending``:
``allowed`` for this policy alone, ``commit()`` to consume (returns the TTL the key needs, in
microseconds), and ``report(committed)`` -> ``(remaining, reset_after_us, retry_after_us)``.
``evaluate`` combines several checks all-or-nothing, as ``ratelimit.lua`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Pending:
    allowed: bool
    commit: Callable[[], int]
    report: Callable[[bool], tuple[int, int, int]]


@dataclass(frozen=True)
class Outcome:
    allowed: bool
    remaining: int
    reset_after_us: int
    retry_after_us: int


class Model:
    """State per key; ``check`` never mutates it, ``Pending.commit`` does."""

    def __init__(self, limit: int, param: int, q: int = 1) -> None:
        self.limit = limit
        self.param = param
        self.q = q  # the buckets' interval is param / q microseconds
        self.state: dict[str, Any] = {}

    def check(self, key: str, now: int, cost: int, lease: str = "") -> Pending:
        raise NotImplementedError


class FixedWindow(Model):
    def check(self, key: str, now: int, cost: int, lease: str = "") -> Pending:
        limit, period = self.limit, self.param
        start, count = self.state.get(key, (None, 0))
        if start is None or now >= start + period:  # a clock gone back stays in the window
            start, count = now, 0
        allowed = count + cost <= limit
        end = start + period

        def commit() -> int:
            self.state[key] = (start, count + cost)
            return end - now

        def report(committed: bool) -> tuple[int, int, int]:
            used = count + cost if committed else count
            return limit - used, end - now if used > 0 else 0, 0 if allowed else end - now

        return Pending(allowed, commit, report)


class SlidingLog(Model):
    def check(self, key: str, now: int, cost: int, lease: str = "") -> Pending:
        limit, period = self.limit, self.param
        entries: list[int] = self.state.get(key, [])
        horizon = now - period
        live = sorted(s for s in entries if s > horizon)
        count = len(live)
        allowed = count + cost <= limit

        def commit() -> int:
            self.state[key] = sorted(live + [now] * cost)
            return period

        def report(committed: bool) -> tuple[int, int, int]:
            used = count + cost if committed else count
            if committed:
                reset = period
            elif count > 0:
                reset = max(entries) + period - now
            else:
                reset = 0
            retry = 0 if allowed else live[count + cost - limit - 1] + period - now
            return limit - used, reset, retry

        return Pending(allowed, commit, report)


class SlidingWindow(Model):
    def check(self, key: str, now: int, cost: int, lease: str = "") -> Pending:
        limit, period = self.limit, self.param
        window = now - now % period
        stored, cur, prev = self.state.get(key, (None, 0, 0))
        if stored is not None and stored > window:  # the clock went back: the newest window
            window = stored
        if stored == window:
            pass
        elif stored == window - period:
            prev, cur = cur, 0
        else:
            prev, cur = 0, 0
        elapsed = max(0, now - window)
        weighted = prev * (period - elapsed)
        allowed = weighted + (cur + cost) * period <= limit * period

        def commit() -> int:
            self.state[key] = (window, cur + cost, prev)
            return 2 * period - elapsed

        def report(committed: bool) -> tuple[int, int, int]:
            c = cur + cost if committed else cur
            remaining = max(0, limit * period - weighted - c * period) // period
            reset = 2 * period - elapsed if c > 0 else (period - elapsed if prev > 0 else 0)
            retry = 0
            if not allowed:
                room = (limit - cur - cost) * period
                if room >= 0:
                    retry = period - room // prev - elapsed
                else:
                    wait_in_next = max(0, period - (limit - cost) * period // cur) if cur else 0
                    retry = period - elapsed + wait_in_next
            return remaining, reset, retry

        return Pending(allowed, commit, report)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class TokenBucket(Model):
    """Interval P / Q us exactly: times in units of 1/Q us (``self.q``)."""

    def check(self, key: str, now: int, cost: int, lease: str = "") -> Pending:
        capacity, p, q = self.limit, self.param, self.q
        taken, a, b = self.state.get(key, (0, now, 0))  # tokens taken, not yet refilled
        elapsed = (now - a) * q - b
        if elapsed > 0:
            refill = elapsed // p
            if refill >= taken:
                taken, a, b = 0, now, 0
            else:
                nb = b + refill * p
                taken, a, b = taken - refill, a + nb // q, nb % q
        tokens = capacity - taken
        allowed = tokens >= cost

        def until(k: int) -> int:
            scaled = (a - now) * q + b + k * p
            return 0 if scaled <= 0 else _cdiv(scaled, q)

        def full_in(t: int) -> int:
            return 0 if t >= capacity else until(capacity - t)

        def commit() -> int:
            self.state[key] = (capacity - tokens + cost, a, b)
            return full_in(tokens - cost)

        def report(committed: bool) -> tuple[int, int, int]:
            left = tokens - cost if committed else tokens
            retry = 0 if allowed else until(cost - tokens)
            return max(0, left), full_in(left), retry

        return Pending(allowed, commit, report)


class LeakyBucket(Model):
    """Water in units of 1/Q us; each request pours P of them."""

    def check(self, key: str, now: int, cost: int, lease: str = "") -> Pending:
        capacity, p, q = self.limit, self.param, self.q
        level, at = self.state.get(key, (0, now))
        if now > at:
            level, at = max(0, level - (now - at) * q), now
        lag = at - now  # the clock went back: draining resumes at `at`
        size = capacity * p
        allowed = level + cost * p <= size

        def commit() -> int:
            self.state[key] = (level + cost * p, at)
            return _cdiv(level + cost * p, q) + lag

        def report(committed: bool) -> tuple[int, int, int]:
            lvl = level + cost * p if committed else level
            retry = 0 if allowed else _cdiv(lvl + cost * p - size, q) + lag
            return (size - lvl) // p, _cdiv(lvl, q) + lag, retry

        return Pending(allowed, commit, report)


class Gcra(Model):
    """TAT = a + b / Q us; compared in units of 1/Q us."""

    def check(self, key: str, now: int, cost: int, lease: str = "") -> Pending:
        burst, p, q = self.limit, self.param, self.q
        a, b = self.state.get(key, (now, 0))
        if a < now:
            a, b = now, 0
        lead = (a - now) * q + b
        step, tolerance = cost * p, burst * p
        allowed = lead + step <= tolerance

        def commit() -> int:
            nb = b + step
            self.state[key] = (a + nb // q, nb % q)
            return _cdiv(lead + step, q)

        def report(committed: bool) -> tuple[int, int, int]:
            t = lead + step if committed else lead
            retry = 0 if allowed else _cdiv(lead + step - tolerance, q)
            return (tolerance - t) // p, _cdiv(t, q), retry

        return Pending(allowed, commit, report)


class Concurrency(Model):
    """Leases: ``{lease id: expiry}``; ``release`` drops one, as ``Policy.release`` does."""

    def check(self, key: str, now: int, cost: int, lease: str = "") -> Pending:
        limit, timeout = self.limit, self.param
        leases: dict[str, int] = self.state.get(key, {})
        live = sorted(e for e in leases.values() if e > now)
        held = len(live)
        allowed = held + cost <= limit

        def commit() -> int:
            kept = {k: e for k, e in leases.items() if e > now}
            kept[lease] = now + timeout
            self.state[key] = kept
            return max(kept.values()) - now

        def report(committed: bool) -> tuple[int, int, int]:
            used = held + cost if committed else held
            reset = 0
            if used > 0:
                reset = max(self.state[key].values()) - now
            retry = 0 if allowed else live[0] - now
            return limit - used, reset, retry

        return Pending(allowed, commit, report)

    def release(self, key: str, lease: str) -> None:
        leases = self.state.get(key, {})
        leases.pop(lease, None)
        if not leases:
            self.state.pop(key, None)  # Redis deletes an emptied sorted set


MODELS: dict[str, type[Model]] = {
    "fixed_window": FixedWindow,
    "sliding_log": SlidingLog,
    "sliding_window": SlidingWindow,
    "token_bucket": TokenBucket,
    "leaky_bucket": LeakyBucket,
    "gcra": Gcra,
    "concurrency": Concurrency,
}


def evaluate(
    checks: Sequence[tuple[Model, str, int, str]], now: int, peek: bool = False,
    soft: frozenset[int] = frozenset(),
) -> tuple[list[Outcome], list[int | None]]:
    """``(model, key, cost, lease)``: the gating ones (not in ``soft``) all-or-nothing among
    themselves, each soft one on its own. Outcomes, and the TTL (us) each committed key needs
    (None where nothing was written)."""
    pending = [model.check(key, now, cost, lease) for model, key, cost, lease in checks]
    gates = not peek and all(p.allowed for i, p in enumerate(pending) if i not in soft)
    commits = [
        not peek and p.allowed and (i in soft or gates) for i, p in enumerate(pending)
    ]
    ttls: list[int | None] = [
        p.commit() if c else None for p, c in zip(pending, commits, strict=True)
    ]
    outcomes = []
    for p, commit in zip(pending, commits, strict=True):
        remaining, reset, retry = p.report(commit)
        outcomes.append(Outcome(p.allowed, max(0, remaining), max(0, reset), max(0, retry)))
    return outcomes, ttls
