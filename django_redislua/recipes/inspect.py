"""Live recipe instances for the admin: found with SCAN (never KEYS), read pipelined per node.

A page walks the keyspace with ``SCAN MATCH <prefix>:*`` (or ``<prefix>:<kind>:*`` for one
kind), node by node on a cluster, with a bounded amount of work: at most ``max_calls`` SCAN
calls, stopping once ``page_size`` instances are found, and a cursor to continue from. The keys
found are sorted into instances by their shape (see :mod:`django_redislua.recipes.base`), then
read with at most two pipelined round trips per node: the first reads every instance's fields,
sizes and TTL and the server's clock; the second, only when needed, counts each queue's expired
claims (against that clock) and sums the samples of small ``WindowStats`` keys. Nothing is
written. A key that is not of the shape its kind stores (a rate-limit policy that happens to be
named ``cap``, a key that expired between SCAN and the read) is left out.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from django_redislua.conf import settings
from django_redislua.connection import primary_nodes
from django_redislua.limiting.inspect import MAX_SCAN_CALLS, PAGE_SIZE, scan_primaries
from django_redislua.locks.keys import glob_escape
from django_redislua.recipes.counter import CappedCounter
from django_redislua.recipes.inventory import Inventory
from django_redislua.recipes.queue import WorkQueue
from django_redislua.recipes.vcache import VersionedCache
from django_redislua.recipes.window import WindowStats
from django_redislua.replies import text

KINDS = {
    Inventory.kind: "Stock levels",
    WorkQueue.kind: "Work queues",
    CappedCounter.kind: "Capped counters",
    VersionedCache.kind: "Versioned cache entries",
    WindowStats.kind: "Window statistics",
}
# A WindowStats key keeps five fields per bucket; its samples are summed only up to this many
# fields (100 buckets), so a page never reads more than PAGE_SIZE * this many fields.
MAX_WINDOW_FIELDS = 500
_BUCKET_FIELDS = 5
_SUMMED = range(1, MAX_WINDOW_FIELDS + 1)  # the field counts whose samples are summed


@dataclass(frozen=True)
class StockLevel:
    """One SKU of an :class:`~django_redislua.recipes.Inventory`."""

    name: str
    sku: str
    left: int
    sold: int  # units held by orders (taken and not given back)
    orders: int  # orders recorded, given back ones included
    ttl: float | None  # seconds; None when the stock has no expiry
    key: str


@dataclass(frozen=True)
class QueueState:
    """One :class:`~django_redislua.recipes.WorkQueue`."""

    name: str
    pending: int
    in_flight: int
    expired: int  # of the in-flight claims, those past their deadline (returned by the next claim)
    dead: int
    key: str


@dataclass(frozen=True)
class CounterState:
    """One subject's :class:`~django_redislua.recipes.CappedCounter`."""

    name: str
    subject: str
    value: int  # in the current period (0 once it ended)
    ttl: float | None  # seconds until the period ends
    key: str


@dataclass(frozen=True)
class CacheEntry:
    """One entry of a :class:`~django_redislua.recipes.VersionedCache`."""

    name: str
    cache_key: str
    version: int | None
    fresh_for: float  # seconds it stays fresh; <= 0: stale that long (a copy kept for others)
    building: bool  # a get_or_build caller holds the build lease now
    ttl: float | None
    key: str

    @property
    def fresh(self) -> bool:
        return self.fresh_for > 0


@dataclass(frozen=True)
class WindowState:
    """One subject's :class:`~django_redislua.recipes.WindowStats`. The window's width is not
    stored with the samples, so the page shows what the key holds: its buckets and the samples
    in them (some buckets may be older than the window until they are reused)."""

    name: str
    subject: str
    buckets: int
    samples: int | None  # None when the key is too large to sum on a page
    ttl: float | None
    key: str


@dataclass(frozen=True)
class RecipePage:
    stock: list[StockLevel] = field(default_factory=list)
    queues: list[QueueState] = field(default_factory=list)
    counters: list[CounterState] = field(default_factory=list)
    caches: list[CacheEntry] = field(default_factory=list)
    windows: list[WindowState] = field(default_factory=list)
    cursor: str = ""  # pass back to continue; "" when the scan has covered every node
    scan_calls: int = 0
    pattern: str = ""

    @property
    def count(self) -> int:
        return (len(self.stock) + len(self.queues) + len(self.counters) + len(self.caches)
                + len(self.windows))


# An instance: (kind, name, subject); a queue has no subject ("").
Instance = tuple[str, str, str]


@functools.lru_cache(maxsize=8)
def _shapes(key_prefix: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    prefix = re.escape(key_prefix)
    kinds = "|".join(kind for kind in KINDS if kind != WorkQueue.kind)
    subject = re.compile(rf"^{prefix}:(?P<kind>{kinds}):(?P<name>[^{{}}\s]+):"
                         rf"\{{(?P<subject>[^{{}}\s]+)\}}$")
    queue = re.compile(rf"^{prefix}:{WorkQueue.kind}:\{{(?P<name>[^{{}}\s]+)\}}:sequence$")
    return subject, queue


def parse_key(key: str) -> Instance | None:
    """The recipe instance a key stands for, or None. One key stands for each instance, so an
    instance is listed once however its keys fall across pages: the stock key for an inventory's
    SKU (not ``:orders`` or ``:buyers``), the entry for a cache key (not ``:building``), and
    for a queue its id ``:sequence``, the one key it keeps from its first put until cleared
    (its list of pending ids is gone whenever nothing is pending)."""
    subject, queue = _shapes(settings.KEY_PREFIX)
    match = subject.match(key)
    if match is not None:
        return match["kind"], match["name"], match["subject"]
    match = queue.match(key)
    if match is not None:
        return WorkQueue.kind, match["name"], ""
    return None


def match_pattern(kind: str | None = None) -> str:
    """The SCAN MATCH glob: every key under the prefix, or one kind's."""
    prefix = glob_escape(settings.KEY_PREFIX)
    if kind is None:
        return f"{prefix}:*"
    if kind not in KINDS:
        raise ValueError(f"unknown recipe kind {kind!r}")
    if kind == WorkQueue.kind:
        return f"{prefix}:{kind}:{{*}}:sequence"
    return f"{prefix}:{kind}:*"


def scan_recipes(cursor: str = "", *, kind: str | None = None, page_size: int = PAGE_SIZE,
                 max_calls: int = MAX_SCAN_CALLS) -> RecipePage:
    """One page of live recipe instances, from ``cursor`` ("" = the start).

    At most ``max_calls`` SCAN calls are made; the page may hold fewer than ``page_size``
    instances (or a few more: SCAN's COUNT is a hint) and still have a cursor to continue from.
    Raises ValueError for a bad cursor or kind.
    """
    pattern = match_pattern(kind)
    nodes = primary_nodes()
    found: dict[int, dict[Instance, None]] = {}

    def take(index: int, key: str) -> bool:
        instance = parse_key(key)
        on_node = found.setdefault(index, {})
        if instance is None or instance in on_node:
            return False
        on_node[instance] = None
        return True

    next_cursor, calls = scan_primaries(nodes, cursor, pattern, page_size, max_calls, take)
    page = RecipePage(cursor=next_cursor, scan_calls=calls, pattern=pattern)
    for node_index, instances in found.items():
        if instances:
            _read(nodes[node_index][1], list(instances), page)
    page.stock.sort(key=lambda row: (row.name, row.sku))
    page.queues.sort(key=lambda row: row.name)
    page.counters.sort(key=lambda row: (row.name, row.subject))
    page.caches.sort(key=lambda row: (row.name, row.cache_key))
    page.windows.sort(key=lambda row: (row.name, row.subject))
    return page


def _key(instance: Instance) -> str:
    kind, name, subject = instance
    if kind == WorkQueue.kind:
        return f"{settings.KEY_PREFIX}:{kind}:{{{name}}}"
    return f"{settings.KEY_PREFIX}:{kind}:{name}:{{{subject}}}"


def _ttl(pttl: Any) -> float | None:
    return pttl / 1000 if isinstance(pttl, int) and pttl >= 0 else None


def _gone(pttl: Any) -> bool:
    return not isinstance(pttl, int) or pttl == -2


def _int(value: Any) -> int | None:
    """A reply as an integer, or None for a missing field, an error or a non-integer."""
    if value is None or isinstance(value, Exception):
        return None
    try:
        return int(value)
    except ValueError:
        try:
            return int(float(value))
        except (ValueError, OverflowError):
            return None


# What the first pipeline asks per kind; the replies are read back in the same order.
def _first_commands(pipe: Any, kind: str, key: str) -> None:
    if kind == Inventory.kind:
        pipe.hmget(key, ["left", "sold"])
        pipe.hlen(f"{key}:orders")
        pipe.pttl(key)
    elif kind == WorkQueue.kind:
        pipe.llen(key)
        pipe.zcard(f"{key}:in_flight")
        pipe.hlen(f"{key}:dead")
        pipe.exists(f"{key}:sequence")
    elif kind == CappedCounter.kind:
        pipe.hmget(key, ["n", "until"])
        pipe.pttl(key)
    elif kind == VersionedCache.kind:
        pipe.hmget(key, ["version", "fresh_until"])
        pipe.exists(f"{key}:building")
        pipe.pttl(key)
    else:
        pipe.hlen(key)
        pipe.pttl(key)


_FIRST_REPLIES = {Inventory.kind: 3, WorkQueue.kind: 4, CappedCounter.kind: 2,
                  VersionedCache.kind: 3, WindowStats.kind: 2}


def _read(node: redis.Redis, instances: Sequence[Instance], page: RecipePage) -> None:
    """Read the ``instances`` found on ``node`` into ``page``: two pipelined round trips."""
    pipe = node.pipeline(transaction=False)
    pipe.time()
    for instance in instances:
        _first_commands(pipe, instance[0], _key(instance))
    replies: Iterator[Any] = iter(pipe.execute(raise_on_error=False))
    clock = next(replies)
    if isinstance(clock, Exception):
        raise clock
    now_us = int(clock[0]) * 1_000_000 + int(clock[1])
    first = [[next(replies) for _ in range(_FIRST_REPLIES[kind])] for kind, *_ in instances]

    second = node.pipeline(transaction=False)
    for instance, got in zip(instances, first, strict=True):
        key = _key(instance)
        if instance[0] == WorkQueue.kind:
            second.zcount(f"{key}:in_flight", "-inf", now_us // 1000)
        elif instance[0] == WindowStats.kind and (_int(got[0]) or 0) in _SUMMED:
            second.hgetall(key)
    later = iter(second.execute(raise_on_error=False) if len(second) else [])

    for instance, got in zip(instances, first, strict=True):
        kind, name, subject = instance
        key = _key(instance)
        if kind == Inventory.kind:
            (left, sold), orders, pttl = _pair(got[0]), got[1], got[2]
            if left is None or _gone(pttl):
                continue
            page.stock.append(StockLevel(name, subject, left, sold or 0, _int(orders) or 0,
                                         _ttl(pttl), key))
        elif kind == WorkQueue.kind:
            pending, in_flight, dead, exists = (_int(reply) for reply in got)
            expired = _int(next(later))
            if None in (pending, in_flight, dead, expired) or not exists:
                continue  # not a queue's keys, or cleared since SCAN saw it
            page.queues.append(QueueState(name, pending or 0, in_flight or 0, expired or 0,
                                          dead or 0, key))
        elif kind == CappedCounter.kind:
            (value, until), pttl = _pair(got[0]), got[1]
            if value is None or until is None or _gone(pttl):
                continue
            page.counters.append(CounterState(name, subject, value if until > now_us else 0,
                                              _ttl(pttl), key))
        elif kind == VersionedCache.kind:
            (version, fresh_until), building, pttl = _pair(got[0]), got[1], got[2]
            if fresh_until is None or _gone(pttl):
                continue
            page.caches.append(CacheEntry(name, subject, version,
                                          (fresh_until * 1000 - now_us) / 1_000_000,
                                          bool(_int(building)), _ttl(pttl), key))
        else:
            fields, pttl = _int(got[0]), got[1]
            held = next(later) if fields in _SUMMED else None
            if not fields or _gone(pttl):
                continue
            samples = _samples(held) if isinstance(held, dict) else None
            page.windows.append(WindowState(name, subject, fields // _BUCKET_FIELDS, samples,
                                            _ttl(pttl), key))


def _pair(reply: Any) -> tuple[int | None, int | None]:
    if not isinstance(reply, list) or len(reply) != 2:
        return None, None
    return _int(reply[0]), _int(reply[1])


def _samples(fields: dict[Any, Any]) -> int | None:
    """The samples a WindowStats key holds: the sum of its buckets' ``n<slot>`` counts."""
    total = 0
    for name, value in fields.items():
        if text(name).startswith("n"):
            count = _int(value)
            if count is None:
                return None
            total += count
    return total
