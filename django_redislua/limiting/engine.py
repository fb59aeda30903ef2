"""One script call decides one or more policies: all-or-nothing, one round trip.

On a single server every check goes in one ``EVALSHA``. On a cluster, checks whose keys share a
slot go together; checks on different slots are decided slot by slot, so all-or-nothing holds
per slot only (give related policies the same identity to keep them in one slot).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import AsyncIterator, Collection, Iterator, Sequence
from typing import Any, cast

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
NEVER = math.inf  # retry_after of a denial no wait can lift (a zero rate, a cost above capacity)
SCRIPT = "django_redislua.ratelimit"
CLUSTER_CLIENTS = (RedisCluster, AsyncRedisCluster)


def _nonce() -> str:
    # 64 random bits: unique among one key's live entries; short, as sliding_log stores one per hit.
    return os.urandom(8).hex()


def _validate(policy: Policy, cost: int) -> None:
    if policy._rate_callable is not None:
        raise PolicyError(
            "redislua.E006",
            f"policy {policy.name!r} has a callable rate; resolve it with policy.with_rate()",
        )
    if cost < 1:
        raise ValueError(f"policy {policy.name!r}: cost {cost} must be at least 1")
    if policy.code == "cc" and cost != 1:
        raise ValueError(f"policy {policy.name!r}: a concurrency slot costs 1")


def _doomed(policy: Policy, cost: int) -> bool:
    """True when no wait can admit it: a zero rate, or a cost above the policy's capacity."""
    return cost > policy.limit


class _Plan:
    """One decision as data, no I/O: the script calls to make, and the Decisions from their
    replies. ``evaluate`` and ``aevaluate`` only drive it, so the two cannot drift apart.

    Checks on the same state key (one policy and identity reached by two rules) are merged into
    one: the strictest policy (least capacity), the largest cost, gating if either gates; each
    of them gets the merged Decision. Checks that cannot succeed (see :func:`_doomed`) are
    denied here without a round trip; a doomed gating check closes the gate for the others.
    """

    def __init__(
        self, checks: Sequence[Check], peek: bool, now_us: int | None, soft: Collection[int],
        cluster: bool,
    ) -> None:
        self.peek = peek
        by_key: dict[str, int] = {}
        self.index: list[int] = []  # check i -> its unique check
        unique: list[tuple[Policy, str | bytes | int, int, bool, str]] = []
        for i, (policy, identity, cost) in enumerate(checks):
            _validate(policy, cost)
            key = policy.redis_key(identity)
            gate = i not in soft
            j = by_key.get(key)
            if j is None:
                by_key[key] = len(unique)
                self.index.append(len(unique))
                unique.append((policy, identity, cost, gate, key))
                continue
            self.index.append(j)
            other, other_identity, other_cost, other_gate, _ = unique[j]
            strictest = policy if policy.limit < other.limit else other
            unique[j] = (strictest, other_identity, max(cost, other_cost), gate or other_gate, key)
        self.unique = unique
        doomed = [_doomed(policy, cost) for policy, _i, cost, _g, _k in unique]
        self.doomed = doomed
        # A gating check no wait can admit denies the request: no gating check may consume.
        self.gate_closed = any(d and u[3] for d, u in zip(doomed, unique, strict=True))
        mode = "peek" if peek else ("soft" if self.gate_closed else "hit")
        live = [j for j in range(len(unique)) if not doomed[j]]
        if cluster and len(live) > 1:
            slots: dict[int, list[int]] = {}
            for j in live:
                slots.setdefault(key_slot(unique[j][4].encode()), []).append(j)
            groups = list(slots.values())
        else:
            groups = [live] if live else []
        self.groups = groups
        self.leases: list[str | None] = [None] * len(unique)
        self.calls: list[tuple[list[str], list[Any]]] = []
        for group in groups:
            keys: list[str] = []
            args: list[Any] = [mode, "" if now_us is None else now_us]
            for j in group:
                policy, _identity, cost, gate, key = unique[j]
                code = policy.code
                if code == "sl":
                    extra: Any = _nonce()
                elif code == "cc":
                    extra = self.leases[j] = _nonce()
                else:
                    extra = policy.extra
                keys.append(key)
                args += (code, policy.limit, policy.param, cost, extra, "1" if gate else "0")
            self.calls.append((keys, args))

    def decisions(self, replies: Sequence[Sequence[int]]) -> list[Decision]:
        unique = self.unique
        out: list[Decision | None] = [None] * len(unique)
        for j, doomed in enumerate(self.doomed):
            if doomed:
                policy, identity = unique[j][0], unique[j][1]
                out[j] = Decision(False, policy.limit, policy.limit, 0.0, NEVER, policy, identity)
        for group, reply in zip(self.groups, replies, strict=True):
            gates_allow = not self.gate_closed and not any(
                reply[4 * n] != 1 and unique[j][3] for n, j in enumerate(group)
            )
            for n, j in enumerate(group):
                policy, identity, _cost, gate, _key = unique[j]
                allowed = reply[4 * n] == 1
                consumed = allowed and not self.peek and (gates_allow or not gate)
                out[j] = Decision(
                    allowed, policy.limit, reply[4 * n + 1], reply[4 * n + 2] / US,
                    reply[4 * n + 3] / US, policy, identity,
                    self.leases[j] if consumed else None,
                )
        return [cast(Decision, out[j]) for j in self.index]


def evaluate(
    checks: Sequence[Check], *, peek: bool = False, now_us: int | None = None,
    client: SyncClient | None = None, soft: Collection[int] = (),
) -> list[Decision]:
    """Decide every ``(policy, identity, cost)`` in one script call (one per cluster slot).

    ``soft`` holds the indexes of checks that do not gate: their denial does not stop the
    others from consuming, and they consume whenever they allow. The others are all-or-nothing
    among themselves. ``now_us`` is for tests.
    """
    if client is None:
        client = get_client()
    plan = _Plan(checks, peek, now_us, soft, isinstance(client, CLUSTER_CLIENTS))
    script = get_script(SCRIPT)
    return plan.decisions([script(keys, args, client=client) for keys, args in plan.calls])


async def aevaluate(
    checks: Sequence[Check], *, peek: bool = False, now_us: int | None = None,
    client: AsyncClient | None = None, soft: Collection[int] = (),
) -> list[Decision]:
    """The asyncio twin of :func:`evaluate`."""
    if client is None:
        if on_throwaway_loop():  # an async view under WSGI: see on_throwaway_loop
            return evaluate(checks, peek=peek, now_us=now_us, soft=soft)
        client = get_async_client()
    plan = _Plan(checks, peek, now_us, soft, isinstance(client, CLUSTER_CLIENTS))
    script = get_script(SCRIPT)
    return plan.decisions(
        [await script.acall(keys, args, client=client) for keys, args in plan.calls]
    )


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
