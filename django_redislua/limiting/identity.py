"""Identities (an IP, a user id, a header value) made safe to put in a Redis key.

A value from a request can be huge, binary, or contain newlines or braces (which would change
the key's cluster hash tag). Short printable values are kept as they are, so keys stay readable
in the admin; anything else becomes a fixed-length digest.
"""

from __future__ import annotations

import base64
import hashlib
import re

MAX_IDENTITY = 64
# A digest: "#" and 128 bits of SHA-256 in base64url (22 characters; 32 hex digits before, which
# cost a key 16 more bytes in Redis).
_DIGEST = re.compile(r"#[A-Za-z0-9_-]{22}")


# The identity of every request that lacks the value a ``get:``, ``post:`` or ``header:`` key
# reads (no such field, an empty one, a JSON null): they share one quota, so leaving a field
# out is never a way around a limit (django-ratelimit keys them all as ""). A kept identity
# never starts with "#" (such values become digests), and only this object is kept as
# "#absent": a request that sends the text "#absent" gets a digest, not the shared identity.
class _Absent(str):
    __slots__ = ()


ABSENT_TEXT = "#absent"
ABSENT: str = _Absent(ABSENT_TEXT)


def _digest(data: bytes) -> str:
    return "#" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()[:16]).decode()[:22]


def is_bound(value: str) -> bool:
    """True when ``value`` is an identity's key form: kept as it is, a digest, or the shared
    identity of absent values (:data:`ABSENT`)."""
    return (bound_identity(value) == value or _DIGEST.fullmatch(value) is not None
            or value == ABSENT_TEXT)


def bound_identity(value: str | bytes | int) -> str:
    """``value`` if short and printable, else a digest: ``"#"`` + 128 bits of its SHA-256 in
    base64url.

    Kept: 1-64 printable ASCII characters, no space, ``{`` or ``}``, not starting with ``#``
    (the digest marker: a kept value can never look like a digest). String methods rather than
    a regex, and one function: this runs on every decision.
    """
    if isinstance(value, str):
        text = value
    elif isinstance(value, bytes):
        try:
            text = value.decode("ascii")
        except UnicodeDecodeError:
            return _digest(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    else:
        text = str(value)
    if (0 < len(text) <= MAX_IDENTITY and text.isascii() and text.isprintable()
            and text[0] != "#" and " " not in text and "{" not in text and "}" not in text):
        return text
    if text.__class__ is _Absent:
        return ABSENT_TEXT
    return _digest(text.encode("utf-8", "surrogatepass"))
