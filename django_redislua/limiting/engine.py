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

from django_redislua.connection import AsyncClient, SyncClient, get_async_client, get_client
from django_redislua.limiting.policy import Decision, Policy, PolicyError, RateLimited
from django_redislua.scripts import get_script

Check = tuple[Policy, str | bytes | int, int]
US = 1_000_000.0


def _nonce() -> str:
    return os.urandom(12).hex()


def _prepare(
    checks: Sequence[Check], peek: bool, now_us: int | None
) -> tuple[list[str], list[Any], list[str | None]]:
    keys: list[str] = []
    args: list[Any] = ["peek" if peek else "hit", "" if now_us is None else now_us]
    leases: list[str | None] = []
    for policy, identity, cost in checks:
        if policy.is_dynamic:
            raise PolicyError(
                "redislua.E006",
                f"policy {policy.name!r} has a callable rate; resolve it with policy.with_rate()",
            )
        if cost < 1 or cost > policy.limit:
            raise ValueError(
                f"policy {policy.name!r}: cost {cost} must be between 1 and the limit {policy.limit}"
            )
        if policy.code == "cc" and cost != 1:
            raise ValueError(f"policy {policy.name!r}: a concurrency slot costs 1")
        extra = _nonce() if policy.code in ("sl", "cc") else ""
        leases.append(extra if policy.code == "cc" else None)
        keys.append(policy.redis_key(identity))
        args += (policy.code, policy.limit, policy.param, cost, extra)
    return keys, args, leases


def _decisions(
    checks: Sequence[Check], reply: Sequence[int], leases: Sequence[str | None], peek: bool
) -> list[Decision]:
    allowed_all = all(reply[4 * i] for i in range(len(checks)))
    result = []
    for i, (policy, identity, _cost) in enumerate(checks):
        allowed, remaining, reset, retry = reply[4 * i : 4 * i + 4]
        result.append(
            Decision(
                bool(allowed), policy.limit, remaining, reset / US, retry / US, policy, identity,
                leases[i] if allowed_all and not peek else None,
            )
        )
    return result


def _groups(client: Any, checks: Sequence[Check]) -> list[list[int]]:
    """Indexes of checks grouped so each group is one script call."""
    from redis.cluster import RedisCluster

    if not isinstance(client, RedisCluster) and not _is_async_cluster(client):
        return [list(range(len(checks)))]
    from redis.crc import key_slot

    slots: dict[int, list[int]] = {}
    for i, (policy, identity, _cost) in enumerate(checks):
        slots.setdefault(key_slot(policy.redis_key(identity).encode()), []).append(i)
    return list(slots.values())


def _is_async_cluster(client: Any) -> bool:
    from redis.asyncio.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def evaluate(
    checks: Sequence[Check], *, peek: bool = False, now_us: int | None = None,
    client: SyncClient | None = None,
) -> list[Decision]:
    """Decide every ``(policy, identity, cost)`` in one script call. ``now_us`` is for tests."""
    client = client or get_client()
    script = get_script("django_redislua.ratelimit")
    groups = _groups(client, checks)
    if len(groups) == 1:
        keys, args, leases = _prepare(checks, peek, now_us)
        return _decisions(checks, script(keys, args, client=client), leases, peek)
    out: list[Decision | None] = [None] * len(checks)
    for group in groups:
        part = [checks[i] for i in group]
        keys, args, leases = _prepare(part, peek, now_us)
        for i, decision in zip(group, _decisions(part, script(keys, args, client=client), leases, peek)):
            out[i] = decision
    return [d for d in out if d is not None]


async def aevaluate(
    checks: Sequence[Check], *, peek: bool = False, now_us: int | None = None,
    client: AsyncClient | None = None,
) -> list[Decision]:
    """The asyncio twin of :func:`evaluate`."""
    client = client or get_async_client()
    script = get_script("django_redislua.ratelimit")
    groups = _groups(client, checks)
    out: list[Decision | None] = [None] * len(checks)
    for group in groups:
        part = [checks[i] for i in group]
        keys, args, leases = _prepare(part, peek, now_us)
        reply = await script.acall(keys, args, client=client)
        for i, decision in zip(group, _decisions(part, reply, leases, peek)):
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
