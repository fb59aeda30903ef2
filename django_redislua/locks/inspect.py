"""Live lock state for the admin and ``manage.py redislua_locks``: read with SCAN, never KEYS.

A page is one SCAN per node plus one pipelined read of the locks it found (HMGET, PTTL and
PUBSUB NUMSUB of each lock's wake-up channel, i.e. how many callers are waiting for it).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from redis.cluster import RedisCluster

from django_redislua.conf import settings
from django_redislua.connection import get_client, primary_nodes
from django_redislua.locks.keys import inbox_prefix, keys_for, scan_pattern
from django_redislua.locks.lease import milliseconds
from django_redislua.scripts import get_script

_FIELDS = ("owner", "token", "count", "name")
_GLOB = frozenset("*?[")


@dataclass
class LockInfo:
    """One held lock, as Redis sees it now."""

    name: str  # as the application wrote it; pass it to force_release()
    owner: str  # the holder's owner token
    ttl: float | None  # seconds of lease left; None when the lock has no expiry
    fencing_token: int | None
    reentry_count: int
    # callers waiting for it: those queued (a waiter that died stays queued until its next
    # retry was due), or the subscribers of its wake-up channel when more (async waiters)
    waiters: int


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _name_glob(match: str | None) -> str:
    """A glob over the bounded lock name: ``match`` itself if it is a glob, else a substring."""
    if not match:
        return "*"
    if _GLOB & set(match):
        return match
    return f"*{match}*"


def _read(node: redis.Redis, keys: list[str]) -> list[LockInfo]:
    channels = [f"{key}:released" for key in keys]
    pipe = node.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, list(_FIELDS))
        pipe.pttl(key)
        pipe.zcard(f"{key}:queue")
    pipe.pubsub_numsub(*channels)
    replies = pipe.execute()
    waiting = {_text(channel): int(count) for channel, count in replies[-1]}
    found = []
    for index, key in enumerate(keys):
        owner, token, count, name = replies[3 * index]
        pttl = int(replies[3 * index + 1])
        queued = int(replies[3 * index + 2])
        if owner is None or pttl == -2:  # released between SCAN and the read
            continue
        found.append(LockInfo(
            name=_text(name) or key[key.index("{") + 1:key.rindex("}")],
            owner=_text(owner),
            ttl=None if pttl < 0 else pttl / 1000,
            fencing_token=None if token is None else int(token),
            reentry_count=int(count or 0),
            waiters=max(queued, waiting.get(channels[index], 0)),
        ))
    return found


def scan_locks(cursor: int = 0, match: str | None = None,
               count: int = 100) -> tuple[int, list[LockInfo]]:
    """One page of held locks: ``(next cursor, locks)``; the cursor is 0 when the scan is done.

    ``match`` filters by lock name: a glob (``report:*``) or else a substring. On a cluster the
    cursor walks the primaries one after another (it encodes node index and node cursor).
    """
    nodes = [node for _, node in primary_nodes()]
    index, node_cursor = cursor % len(nodes), cursor // len(nodes)
    node = nodes[index]
    node_cursor, keys = node.scan(node_cursor, match=scan_pattern("lock", _name_glob(match)),
                                  count=count)
    names = sorted({_text(key) for key in keys})
    locks = _read(node, names) if names else []
    if node_cursor:
        return int(node_cursor) * len(nodes) + index, locks
    if index + 1 < len(nodes):
        return index + 1, locks
    return 0, locks


def get_lock(name: str) -> LockInfo | None:
    """The lock ``name`` if it is held now, read on the node that holds it."""
    key = keys_for("lock", name).base
    client = get_client()
    if isinstance(client, RedisCluster):
        node: redis.Redis = client.get_redis_connection(client.get_node_from_key(key))
    else:
        node = client
    found = _read(node, [key])
    return found[0] if found else None


def force_release(name: str) -> bool:
    """Free the lock ``name`` whoever holds it (the first live waiter is offered it, or every
    waiter woken); True if it was held."""
    keys = keys_for("lock", name)
    script = get_script("django_redislua.lock_force_release")
    window_ms = milliseconds(settings.LOCK_CLAIM_WINDOW)
    return bool(script(keys=[keys.base, keys.sub("fence"), keys.sub("queue"), keys.sub("stale")],
                       args=[keys.channel, name, window_ms, inbox_prefix()],
                       client=get_client()))
