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
        self.leases: list[str | None]
        self.calls: list[tuple[list[str], list[Any]]]
        if len(checks) == 1 and checks[0][2] <= checks[0][0].limit:
            # The common case (one live check), kept lean: it is on every request's path.
            policy, identity, cost = checks[0]
            _validate(policy, cost)
            gate = 0 not in soft
            key = policy.redis_key(identity)
            self.index, self.unique, self.groups = [0], [(policy, identity, cost, gate, key)], [[0]]
            self.doomed, self.gate_closed, self.leases = [False], False, [None]
            extra = self._extra(policy, 0)
            self.calls = [([key], ["peek" if peek else "hit", "" if now_us is None else now_us,
                                   policy.code, policy.limit, policy.param, cost, extra,
                                   "1" if gate else "0"])]
            return
        by_key: dict[str, int] = {}
        self.index = []  # check i -> its unique check
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
        self.leases = [None] * len(unique)
        self.calls = []
        for group in groups:
            keys: list[str] = []
            args: list[Any] = [mode, "" if now_us is None else now_us]
            for j in group:
                policy, _identity, cost, gate, key = unique[j]
                keys.append(key)
                args += (policy.code, policy.limit, policy.param, cost, self._extra(policy, j),
                         "1" if gate else "0")
            self.calls.append((keys, args))

    def _extra(self, policy: Policy, j: int) -> Any:
        """The script's "extra" argument of unique check ``j``; a concurrency check's lease id
        is also kept in ``self.leases[j]``."""
        if policy.code == "sl":
            return _nonce()
        if policy.code == "cc":
            lease = self.leases[j] = _nonce()
            return lease
        return policy.extra

    def decisions(self, replies: Sequence[Sequence[int]]) -> list[Decision]:
        if len(self.index) == 1 and self.groups:  # one live check: the lean path again
            policy, identity = self.unique[0][0], self.unique[0][1]
            reply = replies[0]
            allowed = reply[0] == 1
            lease = self.leases[0] if allowed and not self.peek else None
            return [Decision(allowed, policy.limit, reply[1], reply[2] / US, reply[3] / US,
                             policy, identity, lease)]
        unique, peek, leases = self.unique, self.peek, self.leases
        # Denials decided here (no wait can lift them) need no reply.
        out: list[Decision | None] = [
            Decision(False, u[0].limit, u[0].limit, 0.0, NEVER, u[0], u[1]) if doomed else None
            for u, doomed in zip(unique, self.doomed, strict=True)
        ]
        for group, reply in zip(self.groups, replies, strict=True):
            gates_allow = not self.gate_closed
            if gates_allow:
                for n, j in enumerate(group):
                    if reply[4 * n] != 1 and unique[j][3]:
                        gates_allow = False
                        break
            for n, j in enumerate(group):
                policy, identity, _cost, gate, _key = unique[j]
                allowed = reply[4 * n] == 1
                consumed = allowed and not peek and (gates_allow or not gate)
                out[j] = Decision(
                    allowed, policy.limit, reply[4 * n + 1], reply[4 * n + 2] / US,
                    reply[4 * n + 3] / US, policy, identity, leases[j] if consumed else None,
                )
        return [cast(Decision, out[j]) for j in self.index]


def _on_cluster(checks: Sequence[Check], client: object) -> bool:
    """Whether checks may need one call per slot. One check never does, and the isinstance
    test is not free (redis-py's asyncio cluster class is a typing Protocol)."""
    return len(checks) > 1 and isinstance(client, CLUSTER_CLIENTS)


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
    plan = _Plan(checks, peek, now_us, soft, _on_cluster(checks, client))
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
    plan = _Plan(checks, peek, now_us, soft, _on_cluster(checks, client))
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
