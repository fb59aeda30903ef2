"""One script call decides one or more policies: all-or-nothing, one round trip.

On a single server every check goes in one ``EVALSHA``. On a cluster, checks whose keys share a
slot go together; checks on different slots are decided slot by slot, so all-or-nothing holds
per slot only (give related policies the same identity to keep them in one slot).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.crc import key_slot

from django_redislua.connection import (
    AsyncClient,
    SyncClient,
    get_async_client,
    get_client,
    on_throwaway_loop,
)
from django_redislua.limiting.policy import Decision, Policy, PolicyError, RateLimited
from django_redislua.scripts import get_script

Check = tuple[Policy, str | bytes | int, int]
US = 1_000_000.0
SCRIPT = "django_redislua.ratelimit"
CLUSTER_CLIENTS = (RedisCluster, AsyncRedisCluster)


def _nonce() -> str:
    # 64 random bits: unique among one key's live entries; short, as sliding_log stores one per hit.
    return os.urandom(8).hex()


def _prepare(
    checks: Sequence[Check], peek: bool, now_us: int | None
) -> tuple[list[str], list[Any], list[str | None]]:
    """KEYS, ARGV and lease ids (for concurrency checks) of one script call."""
    keys: list[str] = []
    args: list[Any] = ["peek" if peek else "hit", "" if now_us is None else now_us]
    leases: list[str | None] = []
    for policy, identity, cost in checks:
        if policy._rate_callable is not None:
            raise PolicyError(
                "redislua.E006",
                f"policy {policy.name!r} has a callable rate; resolve it with policy.with_rate()",
            )
        limit = policy.limit
        if not 1 <= cost <= limit:
            raise ValueError(
                f"policy {policy.name!r}: cost {cost} must be between 1 and the limit {limit}"
            )
        code = policy.code
        lease = None
        if code == "sl":
            extra = _nonce()
        elif code == "cc":
            if cost != 1:
                raise ValueError(f"policy {policy.name!r}: a concurrency slot costs 1")
            extra = lease = _nonce()
        else:
            extra = ""
        leases.append(lease)
        keys.append(policy.redis_key(identity))
        args += (code, limit, policy.param, cost, extra)
    if len(keys) > 1 and len(set(keys)) != len(keys):
        # The script decides every key on the state before any write: a key twice would be
        # counted once.
        raise ValueError("the same policy and identity appear twice in one evaluate()")
    return keys, args, leases


def _decisions(
    checks: Sequence[Check], reply: Sequence[int], leases: Sequence[str | None], peek: bool
) -> list[Decision]:
    if len(checks) == 1:  # the common case, kept lean
        policy, identity, _cost = checks[0]
        allowed = reply[0] == 1
        lease = leases[0] if allowed and not peek else None
        return [Decision(allowed, policy.limit, reply[1], reply[2] / US, reply[3] / US, policy,
                         identity, lease)]
    committed = not peek and all(reply[0::4])
    return [
        Decision(
            reply[4 * i] == 1, policy.limit, reply[4 * i + 1], reply[4 * i + 2] / US,
            reply[4 * i + 3] / US, policy, identity, leases[i] if committed else None,
        )
        for i, (policy, identity, _cost) in enumerate(checks)
    ]


def _slot_groups(checks: Sequence[Check]) -> list[list[int]]:
    """Indexes of checks grouped by cluster slot: each group is one script call on one node."""
    slots: dict[int, list[int]] = {}
    for i, (policy, identity, _cost) in enumerate(checks):
        slots.setdefault(key_slot(policy.redis_key(identity).encode()), []).append(i)
    return list(slots.values())


def evaluate(
    checks: Sequence[Check], *, peek: bool = False, now_us: int | None = None,
    client: SyncClient | None = None,
) -> list[Decision]:
    """Decide every ``(policy, identity, cost)`` in one script call. ``now_us`` is for tests."""
    if client is None:
        client = get_client()
    script = get_script(SCRIPT)
    if len(checks) == 1 or not isinstance(client, CLUSTER_CLIENTS):
        keys, args, leases = _prepare(checks, peek, now_us)
        return _decisions(checks, script(keys, args, client=client), leases, peek)
    out: list[Decision | None] = [None] * len(checks)
    for group in _slot_groups(checks):
        part = [checks[i] for i in group]
        keys, args, leases = _prepare(part, peek, now_us)
        reply = script(keys, args, client=client)
        for i, decision in zip(group, _decisions(part, reply, leases, peek), strict=True):
            out[i] = decision
    return [d for d in out if d is not None]


async def aevaluate(
    checks: Sequence[Check], *, peek: bool = False, now_us: int | None = None,
    client: AsyncClient | None = None,
) -> list[Decision]:
    """The asyncio twin of :func:`evaluate`."""
    if client is None:
        if on_throwaway_loop():  # an async view under WSGI: see on_throwaway_loop
            return evaluate(checks, peek=peek, now_us=now_us)
        client = get_async_client()
    script = get_script(SCRIPT)
    if len(checks) == 1 or not isinstance(client, CLUSTER_CLIENTS):
        keys, args, leases = _prepare(checks, peek, now_us)
        return _decisions(checks, await script.acall(keys, args, client=client), leases, peek)
    out: list[Decision | None] = [None] * len(checks)
    for group in _slot_groups(checks):
        part = [checks[i] for i in group]
        keys, args, leases = _prepare(part, peek, now_us)
        reply = await script.acall(keys, args, client=client)
        for i, decision in zip(group, _decisions(part, reply, leases, peek), strict=True):
            out[i] = decision
    return [d for d in out if d is not None]


@contextlib.contextmanager
def slot(policy: Policy, identity: str | bytes | int) -> Iterator[Decision]:
    decision = policy.hit(identity)
    if not decision.allowed:
        raise RateLimited([decision])
    try:
        yield decision
    finally:
        policy.release(identity, decision)


@contextlib.asynccontextmanager
async def aslot(policy: Policy, identity: str | bytes | int) -> AsyncIterator[Decision]:
    decision = await policy.ahit(identity)
    if not decision.allowed:
        raise RateLimited([decision])
    try:
        yield decision
    finally:
        await policy.arelease(identity, decision)
