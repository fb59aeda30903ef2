"""Reading Redis replies alike whatever the client's ``decode_responses`` (str or bytes)."""

from __future__ import annotations

from typing import Any


def text(value: Any) -> str:
    """A reply as text: bytes decoded as UTF-8, an undecodable byte replaced rather than raised
    (a key scanned on a shared server may be anyone's), anything else through ``str()``."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
