"""Redis key names of locks and the other coordination primitives.

Every key of one lock (the lock hash, its fencing counter) and its wake-up channel share one hash
tag built from ``bound_identity(name)``, so each script touches a single cluster slot, and every
key starts with ``REDISLUA["KEY_PREFIX"]``::

    rl:lock:{report:daily}            hash {owner, count, token, name}; expires with the lease
    rl:lock:{report:daily}:fence      fencing counter (never expires)
    rl:lock:{report:daily}:queue      waiters a release may hand the lock to (sorted set)
    rl:lock:{report:daily}:released   pub/sub channel (not a key) that wakes waiters
    rl:inbox:<token>                  a waiting thread's own channel (not a key): hand-offs
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django_redislua import conf
from django_redislua.conf import settings
from django_redislua.limiting.identity import bound_identity

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis SCAN MATCH pattern."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


@dataclass(frozen=True)
class Keys:
    """The keys (and wake-up channel) of one named primitive."""

    base: str  # "<prefix>:<kind>:{<bounded name>}", itself the main key
    channel: str

    def sub(self, suffix: str) -> str:
        return f"{self.base}:{suffix}"


def keys_for(kind: str, name: str) -> Keys:
    """Keys of the primitive ``kind`` ("lock", "sem", "once", "flight") called ``name``."""
    base = f"{settings.KEY_PREFIX}:{kind}:{{{bound_identity(name)}}}"
    return Keys(base=base, channel=f"{base}:released")


_inbox_prefix = (-1, "")


def inbox_prefix() -> str:
    """The start of every waiter's inbox channel (``<prefix>:inbox:<token>``, not a key): a
    lock's hand-off is published to its heir's inbox alone (see ``transport.Inbox``). Every
    acquire and release sends it: made once per settings generation."""
    global _inbox_prefix
    if _inbox_prefix[0] != conf.generation:
        _inbox_prefix = (conf.generation, f"{settings.KEY_PREFIX}:inbox:")
    return _inbox_prefix[1]


def scan_pattern(kind: str, name_glob: str = "*") -> str:
    """SCAN MATCH pattern of the main keys of ``kind`` whose bounded name matches ``name_glob``."""
    return f"{glob_escape(settings.KEY_PREFIX)}:{kind}:{{{name_glob}}}"
