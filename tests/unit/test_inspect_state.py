"""The admin's reading of a policy's stored state (django_redislua/limiting/inspect.py), with no
Redis: a value no script writes is shown as it is, never as fields of the policy's."""

from __future__ import annotations

import struct

import pytest

from django_redislua.limiting.inspect import unpack_state

# A value another writer left under a state key (an operator's SET, another app sharing the key
# prefix): text of every length a form has, and doubles no time or count can be.
FOREIGN = {
    "7 bytes": b"foreign",
    "12 bytes": b"hello world!",
    "14 bytes": b"hello world 12",
    "16 bytes": b"hello world 1234",
    "24 bytes": b"hello world, 24 bytes in",
    "700 bytes": b"x" * 700,
    "NaN": struct.pack("<dd", float("nan"), 0.0),
    "infinity": struct.pack("<dd", float("inf"), 1.0),
    "huge": struct.pack("<ddd", -1e300, 1e300, 1.0),
}


@pytest.mark.parametrize("code", ["fw", "sw", "tb", "lb", "gc", "sl"])
@pytest.mark.parametrize("value", list(FOREIGN.values()), ids=list(FOREIGN))
def test_the_admin_shows_a_foreign_value_as_it_is(code: str, value: bytes) -> None:
    """What the scripts read as no state, the admin's key page does not show as fields of
    theirs (a window started in the year 300,000): it shows the value itself."""
    assert unpack_state(code, value) is None
