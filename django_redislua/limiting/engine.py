"""One script call decides one or more policies: all-or-nothing, one round trip.

On a single server every check goes in one ``EVALSHA``. On a cluster, checks whose keys share a
slot go together; checks on different slots are decided one call per slot, the calls pipelined
(every node's share is written before any reply is read: one round trip per node, overlapped).
All-or-nothing holds per slot only (give related policies the same identity to keep them in one
slot).

Written once for both drivers: one check is a :class:`_One` (a :class:`~django_redislua.drivers.
Step`: the hot path runs it without a generator), several are the protocol :func:`evaluation`.
Each holds what its replies mean, what its failures mean (metered, and a concurrency lease a
lost reply may have taken given back) and the metrics; ``decide``/``adecide`` and
``evaluate``/``aevaluate`` only hand them to a driver.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from collections.abc import Collection, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, cast

import redis
from redis.crc import key_slot

from django_redislua import conf, metrics
from django_redislua.atransport import acurrent, arun, async_transport_for
from django_redislua.connection import CLIENT_ERRORS
from django_redislua.drivers import adrive, adrive_step, drive, drive_step, stepped
from django_redislua.limiting import clock, denials
from django_redislua.limiting.decision import (
    ALLOW,
    BLOCK,
    RATE,
    Decision,
    PolicyError,
    RateLimited,
)
from django_redislua.protocol import Clustered, Execute, Protocol, call_groups, retried, undone
from django_redislua.scripts import Script, get_script
from django_redislua.transport import current, run, transport_for

if TYPE_CHECKING:
    from django_redislua.limiting.definition import PolicyDefinition

Check = tuple["PolicyDefinition", str | bytes | int, int]
US = 1_000_000.0
NEVER = math.inf  # retry_after of a denial no wait can lift (a zero rate, a cost above capacity)
SCRIPT = "django_redislua.ratelimit"
# A single check goes to its algorithm's own flat script (ratelimit_fw.lua): no function in it.
SCRIPT_ONE = {code: f"{SCRIPT}_{code}"
              for code in ("fw", "sl", "sw", "tb", "lb", "gc", "cc", "ca")}


def _nonce() -> str:
    # 64 random bits: a concurrency lease's id, unique among one key's live leases.
    return os.urandom(8).hex()


def _validate(policy: PolicyDefinition, cost: int) -> None:
    if policy._rate_callable is not None:
        raise PolicyError(
            "redislua.E006",
            f"policy {policy.name!r} has a callable rate; resolve it with policy.with_rate()",
        )
    if policy._zone_callable is not None:
        policy.calendar_zone()  # raises: resolve it with policy.in_zone()
    if cost < 1:
        raise ValueError(f"policy {policy.name!r}: cost {cost} must be at least 1")
    if policy.code == "cc" and cost != 1:
        raise ValueError(f"policy {policy.name!r}: a concurrency slot costs 1")


def _doomed(policy: PolicyDefinition, cost: int) -> bool:
    """True when no wait can admit it: a zero rate, or a cost above the policy's capacity."""
    return cost > policy.limit


def _denied(policy: PolicyDefinition, identity: str | bytes | int) -> Decision:
    """The denial of a check no wait can admit (see :func:`_doomed`)."""
    return Decision(False, policy.limit, policy.limit, 0.0, NEVER, policy, identity)


def _extra(policy: PolicyDefinition, now_us: int) -> Any:
    """The script's per-policy "extra" argument: a fresh id for a concurrency lease, the
    boundaries of the calendar periods around ``now_us`` (the decision's reading of
    :func:`denials.clock`: a test's time, or this process's clock as far ahead as the
    decisions' clock), the bucket's interval denominator, or "" (the window algorithms)."""
    code = policy.code
    if code == "cc":
        return _nonce()
    if code == "ca":
        return policy.calendar_bounds(now_us)
    return policy.extra


def _lease_given_back(failure: BaseException, key: str, lease: str,
                      policy: PolicyDefinition) -> Protocol[None]:
    """A concurrency hit whose reply never came may hold a slot nobody will release: it is
    given back by its lease id (a second ZREM changes nothing)."""
    giving_back = retried(lambda: _removed(key, lease), time.monotonic() + (policy.timeout or 0))
    yield from undone(failure, giving_back, f"redislua-slot:{policy.name}")


def _removed(key: str, lease: str) -> Protocol[None]:
    yield Execute(("ZREM", key, lease))


class _One:
    """One check as data, no I/O: the lean common case (a single policy on a request), a
    :class:`~django_redislua.drivers.Step`.

    ``decided`` is set when no round trip is needed (a doomed check, or a denial this process
    already knows, see :mod:`denials`); otherwise ``script`` run with ``command`` decides, and
    :meth:`result` turns its reply into the Decision, :meth:`failed` says what a failure means.
    """

    __slots__ = ("command", "cost", "decided", "extra", "identity", "key", "peek", "policy",
                 "script", "sent", "sinks", "started")

    def __init__(self, policy: PolicyDefinition, identity: str | bytes | int, cost: int, peek: bool,
                 now_us: int | None, sinks: tuple[metrics.Sink, ...] = ()) -> None:
        self.policy, self.identity, self.cost, self.peek = policy, identity, cost, peek
        self.decided: Decision | None = None
        self.sinks = sinks
        self.started = time.perf_counter() if sinks else 0.0
        # This runs on every decision, mostly with caches cold: one test for the rare cases.
        if (cost < 1 or cost > policy.limit or policy._rate_callable is not None
                or (policy.code == "cc" and cost != 1) or policy._zone_callable is not None):
            _validate(policy, cost)  # raises for a caller's mistake; else the check is doomed
            self.decided = self._metered(_denied(policy, identity))
            return
        key, overrides = policy.redis_keys(identity)
        self.key = key
        self.sent = sent = denials.clock(now_us)
        if not peek:
            known = denials.answer(key, cost, sent, policy, identity)
            if known is not None:
                self.decided = self._metered(known)
                return
        # _extra inline: a calendar quota's period kept on the policy costs a fixed window's
        # attribute read (issue 38: its allowed path no slower than a fixed window's).
        code = policy.code
        if code == "ca":
            kept = policy._calendar_kept
            extra = kept[2] if kept[0] <= sent < kept[1] else policy.calendar_bounds(sent)
        else:
            extra = _nonce() if code == "cc" else policy.extra
        self.extra = extra
        call = policy._single_call
        if call[0] != conf.generation:
            call = _single_call(policy)
        self.script = call[1]
        if policy.keeps_rate:  # a rate callable's rate: kept beside the state when consumed
            self.command = (*call[2], key, overrides, policy.rate_key(key[key.rindex("{") + 1:-1]),
                            "peek" if peek else "hit", clock.script_now(now_us), policy.code,
                            policy.limit, policy.param, cost, extra, "1", policy.name,
                            policy.rate_record)
            return
        self.command = (*call[2], key, overrides, "peek" if peek else "hit",
                        clock.script_now(now_us), policy.code, policy.limit, policy.param, cost,
                        extra, "1", policy.name)

    def _metered(self, decision: Decision) -> Decision:
        if self.sinks:
            _metered((decision,), time.perf_counter() - self.started, self.sinks)
        return decision

    def result(self, reply: Sequence[int]) -> Decision:
        policy = self.policy
        flag = reply[0]
        if flag > 1:  # a live override answered, or changed the rate
            return self._metered(_overridden(self, reply))
        allowed = flag == 1
        if not self.peek:
            denials.learn(self.key, self.cost, self.sent, policy, reply, consumed=allowed)
        return self._metered(_decision(
            (allowed, policy.limit, reply[1], reply[2] / US, reply[3] / US, policy, self.identity,
             self.extra if allowed and policy.code == "cc" and not self.peek else None, False,
             None, self.cost if allowed and not self.peek else 0)))

    def failed(self, failure: BaseException) -> Protocol[Decision]:
        """Timed as a failure (a socket timeout takes time too); a concurrency lease the lost
        call may have taken is given back; then the failure is raised."""
        if self.sinks and isinstance(failure, CLIENT_ERRORS):
            _timed_failure([(self.policy, self.identity, self.cost)], failure,
                           time.perf_counter() - self.started, self.sinks)
        if self.policy.code == "cc" and not self.peek:
            yield from _lease_given_back(failure, self.key, self.extra, self.policy)
        raise failure


# Decision's fields as one tuple, without the Python-level __new__ a named tuple calls.
_decision = functools.partial(tuple.__new__, Decision)


def overridden_by(flag: int) -> str | None:
    """What a reply's first integer says of a live override (see lib/override.lua): None, or
    :data:`~django_redislua.overrides.BLOCK`, ``ALLOW`` or ``RATE``."""
    if flag < 2:
        return None
    if flag >= 4:
        return RATE
    return ALLOW if flag & 1 else BLOCK


def _overridden(one: _One, reply: Sequence[int]) -> Decision:
    """The Decision of a single check a live override answered (a block or an allow: nothing
    consumed) or decided at another rate (the reply's fifth integer is that rate's limit)."""
    policy, flag = one.policy, reply[0]
    allowed, override = flag & 1 == 1, overridden_by(flag)
    consumed = allowed and override == RATE
    if not one.peek:
        denials.learn(one.key, one.cost, one.sent, policy, reply, consumed=consumed, by=override)
    lease = one.extra if consumed and policy.code == "cc" and not one.peek else None
    return Decision(allowed, reply[4] if override == RATE else policy.limit, reply[1],
                    reply[2] / US, _retry(reply[3]), policy, one.identity, lease, False, override,
                    one.cost if consumed and not one.peek else 0)


def _retry(retry_us: int) -> float:
    """retry_after in seconds; -1 from a script: no wait admits it (a cost above a changed
    rate's capacity)."""
    return NEVER if retry_us < 0 else retry_us / US


def _single_call(policy: PolicyDefinition) -> tuple[int, Script, tuple[Any, ...]]:
    """The script a single check of ``policy`` runs (its algorithm's own, see SCRIPT_ONE) and
    the command up to the keys (``("EVALSHA", sha, 2)``), cached on the policy with the settings
    generation (the head follows USE_FUNCTIONS). Only what the algorithm code and the settings
    decide: a policy derived with another rate (``with_rate``) copies the cache, and reads its
    own limit and period; one that keeps its rate (a rate callable's) builds its own, with one
    key more."""
    generation = conf.generation  # read first: a change while building makes it stale
    script = get_script(SCRIPT_ONE[policy.code])
    keys = 3 if policy.keeps_rate else 2  # with the key keeping a rate callable's rate
    call = policy._single_call = (generation, script, (*script.head(), keys))
    return call


class _Plan:
    """Several checks as data, no I/O: the script calls to make, and the Decisions from their
    replies.

    Checks on the same state key (one policy and identity reached by two rules) are merged into
    one: the strictest policy (least capacity), the largest cost, gating if either gates; each
    of them gets the merged Decision. Checks decided here, without a round trip (doomed ones,
    see :func:`_doomed`, and denials this process already knows, see :mod:`denials`), are
    denials; a gating one closes the gate for the others.
    """

    def __init__(
        self, checks: Sequence[Check], peek: bool, now_us: int | None, soft: Collection[int],
        cluster: bool,
    ) -> None:
        self.peek = peek
        self.sent = denials.clock(now_us)
        by_key: dict[str, int] = {}
        self.index: list[int] = []  # check i -> its unique check
        unique: list[tuple[PolicyDefinition, str | bytes | int, int, bool, str]] = []
        overrides: dict[str, str] = {}  # state key -> its identity's override hash
        for i, (policy, identity, cost) in enumerate(checks):
            _validate(policy, cost)
            key, overrides[key] = policy.redis_keys(identity)
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
        self.known: list[Decision | None] = [
            _denied(policy, identity) if _doomed(policy, cost)
            else None if peek else denials.answer(key, cost, self.sent, policy, identity)
            for policy, identity, cost, _gate, key in unique
        ]
        # A gating check denied already denies the request: no gating check may consume.
        self.gate_closed = any(
            known is not None and u[3] for known, u in zip(self.known, unique, strict=True))
        mode = "peek" if peek else ("soft" if self.gate_closed else "hit")
        live = [j for j in range(len(unique)) if self.known[j] is None]
        if cluster and len(live) > 1:
            slots: dict[int, list[int]] = {}
            for j in live:
                slots.setdefault(key_slot(unique[j][4].encode()), []).append(j)
            groups = list(slots.values())
        else:
            groups = [live] if live else []
        self.groups = groups
        self.extras: list[Any] = [None] * len(unique)
        self.calls: list[tuple[list[str], list[Any]]] = []
        for group in groups:
            keys: list[str] = []
            args: list[Any] = [mode, clock.script_now(now_us)]
            rate_keys: list[str] = []  # a rate callable's rate is kept beside its state
            kept: list[Any] = []  # per kept rate: its policy's place in the call, its record
            for i, j in enumerate(group, 1):
                policy, _identity, cost, gate, key = unique[j]
                keys.append(key)
                self.extras[j] = _extra(policy, self.sent)
                args += (policy.code, policy.limit, policy.param, cost, self.extras[j],
                         "1" if gate else "0", policy.name)
                if policy.keeps_rate and not peek:
                    rate_keys.append(policy.rate_key(key[key.rindex("{") + 1:-1]))
                    kept += (i, policy.rate_record)
            keys += [overrides[key] for key in keys]  # KEYS[N + i]: policy i's override hash
            self.calls.append((keys + rate_keys, args + kept))  # see ratelimit.lua's KEYS/ARGV

    def commands(self, script: Script) -> list[tuple[Any, ...]]:
        """The script calls to make: one per slot group, sent together (protocol.call_groups)."""
        head = script.head()
        return [(*head, len(keys), *keys, *args) for keys, args in self.calls]

    def partly_decided(self, cause: BaseException) -> PartlyDecided:
        """The failure to raise when Redis failed once the gate was already closed."""
        return PartlyDecided([self.known[j] for j in self.index], cause)

    def leases(self) -> list[tuple[PolicyDefinition, str, str]]:
        """``(policy, key, lease)`` of every concurrency hit sent (a lost reply may hold it)."""
        if self.peek:
            return []
        return [(self.unique[j][0], self.unique[j][4], self.extras[j])
                for group in self.groups for j in group if self.unique[j][0].code == "cc"]

    def decisions(self, replies: Sequence[Sequence[int]]) -> list[Decision]:
        unique, peek = self.unique, self.peek
        out = list(self.known)
        for group, reply in zip(self.groups, replies, strict=True):
            gates_allow = not self.gate_closed
            if gates_allow:
                for n, j in enumerate(group):
                    if not reply[6 * n] & 1 and unique[j][3]:
                        gates_allow = False
                        break
            for n, j in enumerate(group):
                policy, identity, cost, gate, key = unique[j]
                flag = reply[6 * n]
                allowed, override = flag & 1 == 1, overridden_by(flag)
                # A block or an allow consumes nothing; a changed rate consumes as the policy.
                consumed = (allowed and not peek and (gates_allow or not gate)
                            and override in (None, RATE))
                lease = self.extras[j] if consumed and policy.code == "cc" else None
                decision = Decision(
                    allowed, reply[6 * n + 4], reply[6 * n + 1], reply[6 * n + 2] / US,
                    _retry(reply[6 * n + 3]), policy, identity, lease, False, override,
                    cost if consumed else 0,
                )
                if not peek:
                    denials.learn(key, cost, self.sent, policy, reply[6 * n:6 * n + 6], consumed,
                                  by=override)
                out[j] = decision
        return [cast(Decision, out[j]) for j in self.index]


class PartlyDecided(redis.RedisError):
    """Redis failed, but the request is refused anyway: a gating check was already denied
    without a round trip (a local denial, a doomed check). ``known`` holds, per check, its
    Decision or None; a client error (``connection.CLIENT_ERRORS``) like any other, so a
    caller unaware of it still fails safely."""

    def __init__(self, known: list[Decision | None], cause: BaseException) -> None:
        super().__init__(f"{cause} (a gating check was already denied)")
        self.known = known


def metric_result(decision: Decision) -> str:
    """The ``result`` label of a decided Decision (see :mod:`django_redislua.metrics`): a shadow
    policy's denial is a shadow denial whatever denied it (a block included: what it would have
    done); a live override's block or allow says so."""
    if decision.allowed:
        return metrics.ALLOWED_BY_OVERRIDE if decision.override == ALLOW else metrics.ALLOWED
    if decision.policy.shadow:
        return metrics.SHADOW_DENIED
    return metrics.BLOCKED if decision.override == BLOCK else metrics.DENIED


def _metered(decisions: Sequence[Decision], seconds: float,
             sinks: tuple[metrics.Sink, ...]) -> None:
    """Count ``decisions`` by result, and the time they took, once per policy."""
    if len(decisions) == 1:
        policy = decisions[0].policy
        for sink in sinks:
            sink.decided(policy.name, policy.algorithm, metric_result(decisions[0]), seconds)
        return
    timed: set[str] = set()
    counted: set[int] = set()
    for decision in decisions:
        if id(decision) in counted:  # two rules on one policy and identity: one check, merged
            continue
        counted.add(id(decision))
        policy = decision.policy
        for sink in sinks:
            if policy.name in timed:
                sink.decision(policy.name, policy.algorithm, metric_result(decision))
            else:
                sink.decided(policy.name, policy.algorithm, metric_result(decision), seconds)
        timed.add(policy.name)


def _timed_failure(checks: Sequence[Check], exc: BaseException, seconds: float,
                   sinks: tuple[metrics.Sink, ...]) -> None:
    """A call that failed took time too (a socket timeout, typically): time it, once per
    policy. Decisions made without Redis before it failed (:class:`PartlyDecided`) are counted
    as made; the caller counts the others (failed_open or unavailable), knowing what it did."""
    decided = [d for d in getattr(exc, "known", ()) if d is not None]
    _metered(decided, seconds, sinks)
    timed = {d.policy.name for d in decided}
    for name in {policy.name for policy, _identity, _cost in checks} - timed:
        for sink in sinks:
            sink.decision_seconds(name, seconds)


def evaluation(checks: Sequence[Check], peek: bool, now_us: int | None,
               soft: Collection[int], sinks: tuple[metrics.Sink, ...]
               ) -> Protocol[list[Decision]]:
    """Decide every ``(policy, identity, cost)``: the protocol of :func:`evaluate`."""
    if len(checks) == 1:  # one check gates nothing but itself: ``soft`` changes nothing
        return [(yield from stepped(_One(*checks[0], peek, now_us, sinks)))]
    started = time.perf_counter()
    cluster = yield Clustered()
    try:
        plan = _Plan(checks, peek, now_us, soft, cluster)
        replies: list[Any] = []
        if plan.calls:
            script = get_script(SCRIPT)
            try:
                replies = yield from call_groups(script, plan.commands(script))
            except BaseException as exc:
                for policy, key, lease in plan.leases():
                    yield from _lease_given_back(exc, key, lease, policy)
                if plan.gate_closed and isinstance(exc, CLIENT_ERRORS):
                    raise plan.partly_decided(exc) from exc  # refused whatever Redis would say
                raise
        decisions = plan.decisions(replies)
    except CLIENT_ERRORS as exc:  # Redis failing; a caller's mistake decided nothing
        if sinks:
            _timed_failure(checks, exc, time.perf_counter() - started, sinks)
        raise
    if sinks:
        _metered(decisions, time.perf_counter() - started, sinks)
    return decisions


def evaluate(
    checks: Sequence[Check], *, peek: bool = False, now_us: int | None = None,
    client: Any = None, soft: Collection[int] = (), metered: bool = True,
) -> list[Decision]:
    """Decide every ``(policy, identity, cost)`` in one script call (one per cluster slot).

    ``soft`` holds the indexes of checks that do not gate: their denial does not stop the
    others from consuming, and they consume whenever they allow. The others are all-or-nothing
    among themselves. ``now_us`` is for tests; ``client`` a redis-py client (or any object with
    ``execute_command``) instead of the app's. Hits are counted in the metrics (see
    :mod:`django_redislua.metrics`) unless ``metered`` is False: a caller that reads the
    Decisions its own way (compat) counts what it decided itself. Peeks are never counted.
    """
    sinks = () if peek or not metered else metrics.sinks()
    transport = current() if client is None else transport_for(client)
    if len(checks) == 1:
        return [drive_step(_One(*checks[0], peek, now_us, sinks), transport)]
    return drive(evaluation(checks, peek, now_us, soft, sinks), transport)


async def aevaluate(
    checks: Sequence[Check], *, peek: bool = False, now_us: int | None = None,
    client: Any = None, soft: Collection[int] = (), metered: bool = True,
) -> list[Decision]:
    """The asyncio twin of :func:`evaluate` (an async view under WSGI decides inline, on the
    sync transport: see ``transport.ThrowawayLoopTransport``)."""
    protocol = evaluation(checks, peek, now_us, soft, _sinks(peek, metered))
    return await adrive(protocol, _async_transport(client))


def _sinks(peek: bool, metered: bool = True) -> tuple[metrics.Sink, ...]:
    """Where a decision is counted: nowhere for a peek (or a caller that counts itself)."""
    return () if peek or not metered else metrics.sinks()


def _async_transport(client: Any) -> Any:
    return acurrent() if client is None else async_transport_for(client)


def decide(
    policy: PolicyDefinition, identity: str | bytes | int, cost: int, *, peek: bool = False,
    now_us: int | None = None, client: Any = None,
) -> Decision:
    """One check: :func:`evaluate` of ``[(policy, identity, cost)]``, without the list."""
    one = _One(policy, identity, cost, peek, now_us, () if peek else metrics.sinks())
    if one.decided is not None:  # a flood answered locally: no transport to find
        return one.decided
    return cast(Decision, drive_step(one, current() if client is None
                                     else transport_for(client)))


async def adecide(
    policy: PolicyDefinition, identity: str | bytes | int, cost: int, *, peek: bool = False,
    now_us: int | None = None, client: Any = None,
) -> Decision:
    """The asyncio twin of :func:`decide`."""
    one = _One(policy, identity, cost, peek, now_us, _sinks(peek))
    return cast(Decision, await adrive_step(one, _async_transport(client)))


def resetting(policy: PolicyDefinition, identity: str | bytes | int) -> Protocol[bool]:
    """Forget ``identity``'s state under ``policy``; False when there was none."""
    state = policy.redis_key(identity)
    denials.forget(state)
    return bool((yield Execute(("DEL", state))))


def releasing(policy: PolicyDefinition, identity: str | bytes | int, decision: Decision
              ) -> Protocol[None]:
    """Give back the concurrency slot ``decision`` took (by its lease id: twice is harmless)."""
    if decision.lease is not None:
        yield Execute(("ZREM", policy.redis_key(identity), decision.lease))


class Slot:
    """``with policy.slot(key):`` / ``async with policy.aslot(key):``: a concurrency slot held
    for the block; RateLimited (with the Decision) when none is free."""

    def __init__(self, policy: PolicyDefinition, identity: str | bytes | int) -> None:
        self.policy, self.identity = policy, identity
        self.decision: Decision | None = None

    def _entering(self) -> Protocol[Decision]:
        one = _One(self.policy, self.identity, self.policy.cost, False, None, metrics.sinks())
        decision: Decision = yield from stepped(one)
        if not decision.allowed:
            raise RateLimited([decision])
        self.decision = decision
        return decision

    def _leaving(self) -> Protocol[None]:
        assert self.decision is not None
        yield from releasing(self.policy, self.identity, self.decision)

    def __enter__(self) -> Decision:
        return run(self._entering())

    def __exit__(self, *exc: object) -> None:
        run(self._leaving())

    def __aenter__(self) -> Coroutine[Any, Any, Decision]:
        return arun(self._entering())

    def __aexit__(self, *exc: object) -> Coroutine[Any, Any, None]:
        return arun(self._leaving())


def slot(policy: PolicyDefinition, identity: str | bytes | int
         ) -> contextlib.AbstractContextManager[Decision]:
    return Slot(policy, identity)


def aslot(policy: PolicyDefinition, identity: str | bytes | int) -> Slot:
    return Slot(policy, identity)

