"""The clock rate-limit decisions see: Redis's own (``TIME``), moved ahead by tests.

``shift_us`` is added to the server's TIME by the rate-limit scripts (the "now" argument
``"+N"``) and to the local denial cache's clock, so :func:`advance` (the pytest plugin's
``redislua.advance``) moves every decision this process makes into the future without
sleeping. It is 0 unless a test moved it; locks, leases and key expiry keep Redis's own time.
"""

from __future__ import annotations

shift_us = 0


def advance(seconds: float) -> None:
    """Move the decisions' clock ``seconds`` ahead (never back: state never goes back in time)."""
    global shift_us
    if not seconds >= 0:
        raise ValueError(f"advance() moves the clock forward, not by {seconds!r} seconds")
    shift_us += round(seconds * 1_000_000)


def reset() -> None:
    """Back to Redis's own clock (the plugin does this after every test)."""
    global shift_us
    shift_us = 0


def script_now(now_us: int | None) -> int | str:
    """The scripts' "now" argument: an injected time, else "" (TIME) or "+N" (TIME, shifted)."""
    if now_us is not None:
        return now_us
    return f"+{shift_us}" if shift_us else ""

