"""Identities (an IP, a user id, a header value) made safe to put in a Redis key.

A value from a request can be huge, binary, or contain newlines or braces (which would change
the key's cluster hash tag). Short printable values are kept as they are, so keys stay readable
in the admin; anything else becomes a fixed-length digest.
"""

from __future__ import annotations

import hashlib
import re

MAX_IDENTITY = 64
_SAFE = re.compile(rf"[!-z|~]{{1,{MAX_IDENTITY}}}")  # printable ASCII except space, { and }


def bound_identity(value: str | bytes | int) -> str:
    """``value`` if short and printable, else ``"#" + sha256(value)[:32]``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, bytes):
        try:
            text = value.decode("ascii")
        except UnicodeDecodeError:
            return "#" + hashlib.sha256(value).hexdigest()[:32]
    else:
        text = str(value)
    if _SAFE.fullmatch(text) and not text.startswith("#"):
        return text
    return "#" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]
