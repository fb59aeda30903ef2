"""Live overrides: block, allow or re-rate one identity, on every app server, at no extra cost.

    from django_redislua import overrides
    overrides.block("login", "203.0.113.7", ttl="1h", reason="credential stuffing")
    overrides.allow("api", "42", ttl="30d", reason="partner")        # never limited by "api"
    overrides.set_rate("api", "42", "10000/h", ttl="30d", reason="enterprise plan")
    overrides.get("api", "42")   # -> Override | None
    overrides.clear("api", "42")
    overrides.scan()             # every live override

The identity is the one the policy's key function yields (what the admin's keys tab shows);
``policy="*"`` blocks or allows it under every policy. A policy's own override wins over "*".

Applied inside the decision's own script (``lib/override.lua``), in the same round trip: the
identity's override hash shares the cluster slot of its state keys, and a decision reads it
with one ``HMGET`` (of a missing key, when there is none). A block refuses without consuming,
``Retry-After`` the block's remaining time; an allow admits without consuming; a changed rate
decides the policy's algorithm at that rate on the identity's own state (switching rates
never resets a count). Every app server honours a new or cleared override at its next decision;
a denial another process's local cache answers is asked again within 1 s (see
:mod:`~django_redislua.limiting.denials`), in this process at once.

Every override ends (``ttl`` is required, at most :data:`MAX_TTL`); its reason and who set it
are kept beside it. Identities, reasons and names are bounded: a hostile value never makes a
long key or a large hash. Redis failing raises :class:`OverrideUnavailable`. Each call is one
script; the ``a``-twins run the same on the asyncio driver.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from django_redislua.conf import settings
from django_redislua.connection import primary_nodes
from django_redislua.limiting import clock, denials
from django_redislua.limiting.decision import ALLOW, BLOCK, RATE
from django_redislua.limiting.identity import bound_identity
from django_redislua.limiting.inspect import glob_escape
from django_redislua.limiting.policy import OVERRIDES, Policy, overrides_key
from django_redislua.limiting.rates import parse_duration
from django_redislua.limiting.registry import get_policy
from django_redislua.recipes.base import Op, RecipeUnavailable, arun, run

__all__ = [
    "ALLOW",
    "BLOCK",
    "EVERY_POLICY",
    "RATE",
    "Override",
    "OverrideUnavailable",
    "aallow",
    "ablock",
    "aclear",
    "aget",
    "allow",
    "aset_rate",
    "block",
    "clear",
    "get",
    "scan",
    "set_rate",
]

T = TypeVar("T")
EVERY_POLICY = "*"
MAX_TTL = 366 * 86_400.0  # seconds: an override is an incident's or a contract's, not forever
MAX_REASON = 500  # characters kept of a reason
MAX_SHOWN = 200  # characters kept of an identity or a user's name, for display
_KINDS = {"b": BLOCK, "a": ALLOW, "r": RATE}


class OverrideUnavailable(Exception):
    """Redis failed while setting, reading or clearing an override. A set or clear whose
    reply was lost may have happened: read it back with :func:`get`, or do it again (setting
    the same override twice, or clearing it twice, leaves the same state)."""


@dataclass(frozen=True)
class Override:
    """A live override, as :func:`get` and :func:`scan` read it."""

    policy: str  # a policy's name, or "*": every policy
    identity: str  # as it was given (at most MAX_SHOWN characters)
    kind: str  # BLOCK, ALLOW or RATE
    rate: str | None  # RATE's rate, as it was given
    reason: str
    expires_at: datetime  # UTC, on Redis's clock
    created_by: str | None
    created_at: datetime | None


def _bounded(text: object, most: int) -> str:
    value = str(text)
    return value if len(value) <= most else value[:most - 1] + "\u2026"


def _policy_name(policy: Policy | str, every: bool) -> tuple[str, Policy | None]:
    """The field an override of ``policy`` is kept in, and the policy (None for "*")."""
    if isinstance(policy, Policy):
        return policy.name, policy
    if policy == EVERY_POLICY:
        if not every:
            raise ValueError('a changed rate is for one policy: "*" has no rate to change')
        return EVERY_POLICY, None
    return policy, get_policy(policy)  # raises KeyError naming the configured policies


def _ttl_us(ttl: object) -> int:
    seconds = parse_duration(ttl)
    if seconds > MAX_TTL:
        raise ValueError(f"ttl {ttl!r} is longer than an override may last ({MAX_TTL:.0f} s)")
    return max(1000, round(seconds * 1_000_000))


def _setting(policy: Policy | str, identity: str | bytes | int, kind: str, ttl: object,
             reason: str, by: object, rate: str | None = None) -> tuple[Op[Override], str]:
    """The script call that sets an override, and the state key whose local denial it ends."""
    name, resolved = _policy_name(policy, every=kind != "r")
    value = kind
    if kind == "r":
        assert resolved is not None and rate is not None
        if resolved.code == "cc":  # a concurrency policy's "rate" is its number of slots
            if not (isinstance(rate, str | int) and str(rate).isdigit() and int(rate) > 0):
                raise ValueError(f"policy {resolved.name!r} counts requests in flight: its rate "
                                 f"is a number of slots (e.g. '10'), not {str(rate)[:40]!r}")
            value = f"r|cc|{int(rate)}|{resolved.param}|"
        else:
            derived = resolved.with_rate(rate)  # raises PolicyError for a bad rate
            value = f"r|{derived.code}|{derived.limit}|{derived.param}|{derived.extra}"
    shown = _bounded(identity if not isinstance(identity, bytes)
                     else identity.decode("utf-8", "replace"), MAX_SHOWN)
    created = time.time()
    meta = {"identity": shown, "rate": rate, "reason": _bounded(reason, MAX_REASON),
            "created_by": None if by is None else _bounded(by, MAX_SHOWN), "created_at": created}
    tag = bound_identity(identity)
    key = overrides_key(tag)

    def read(ends: Any) -> Override:
        return _override(name, _KINDS[kind], int(ends), meta)

    op = Op("django_redislua.override_set", [key],
            [name, value, _ttl_us(ttl), json.dumps(meta), clock.script_now(None)], read)
    return op, "" if resolved is None else resolved.redis_key(identity)


def _override(name: str, kind: str, ends_us: int, meta: dict[str, Any]) -> Override:
    created = meta.get("created_at")
    return Override(
        policy=name, identity=str(meta.get("identity", "")), kind=kind, rate=meta.get("rate"),
        reason=str(meta.get("reason", "")),
        expires_at=datetime.fromtimestamp(ends_us / 1_000_000, UTC),
        created_by=meta.get("created_by"),
        created_at=None if created is None else datetime.fromtimestamp(float(created), UTC),
    )


def _parsed(name: str, value: bytes | str | None, meta: bytes | str | None, now_us: int
            ) -> Override | None:
    """The live override a field holds, or None (absent, ended, or not one of ours)."""
    if not value:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    parts = text.split("|")
    if len(parts) < 2 or parts[0] not in _KINDS or not parts[1].isdigit():
        return None
    ends = int(parts[1])
    if ends <= now_us:
        return None
    try:
        data = json.loads(meta) if meta else {}
    except ValueError:
        data = {}
    return _override(name, _KINDS[parts[0]], ends, data if isinstance(data, dict) else {})


def _forgotten(state_key: str) -> None:
    """This process's local denial of ``state_key`` (or of every key, for "*") ends at once."""
    denials.forget(state_key or None)


# -- the API -----------------------------------------------------------------------------------

def block(policy: Policy | str, identity: str | bytes | int, *, ttl: object, reason: str = "",
          by: object = None) -> Override:
    """Refuse ``identity`` under ``policy`` (or "*") for ``ttl``, consuming nothing."""
    op, _state = _setting(policy, identity, "b", ttl, reason, by)
    return _run(op)


def allow(policy: Policy | str, identity: str | bytes | int, *, ttl: object, reason: str = "",
          by: object = None) -> Override:
    """Admit ``identity`` under ``policy`` (or "*") for ``ttl``, consuming nothing."""
    op, state = _setting(policy, identity, "a", ttl, reason, by)
    override = _run(op)
    _forgotten(state)
    return override


def set_rate(policy: Policy | str, identity: str | bytes | int, rate: str, *, ttl: object,
             reason: str = "", by: object = None) -> Override:
    """Decide ``identity`` under ``policy`` at ``rate`` (its algorithm, its own state) for
    ``ttl``."""
    op, state = _setting(policy, identity, "r", ttl, reason, by, rate)
    override = _run(op)
    _forgotten(state)
    return override


def get(policy: Policy | str, identity: str | bytes | int) -> Override | None:
    """The live override of ``policy`` (a name, or "*") for ``identity``, or None. Only that
    field: a "*" override is ``get("*", identity)``."""
    name, _policy = _policy_name(policy, every=True)
    return _run(_getting(name, identity))


def clear(policy: Policy | str, identity: str | bytes | int) -> bool:
    """End the override of ``policy`` (or "*") for ``identity``; False when there was none."""
    name, resolved = _policy_name(policy, every=True)
    cleared = _run(_clearing(name, identity))
    _forgotten("" if resolved is None else resolved.redis_key(identity))
    return cleared


async def ablock(policy: Policy | str, identity: str | bytes | int, *, ttl: object,
                 reason: str = "", by: object = None) -> Override:
    op, _state = _setting(policy, identity, "b", ttl, reason, by)
    return await _arun(op)


async def aallow(policy: Policy | str, identity: str | bytes | int, *, ttl: object,
                 reason: str = "", by: object = None) -> Override:
    op, state = _setting(policy, identity, "a", ttl, reason, by)
    override = await _arun(op)
    _forgotten(state)
    return override


async def aset_rate(policy: Policy | str, identity: str | bytes | int, rate: str, *,
                    ttl: object, reason: str = "", by: object = None) -> Override:
    op, state = _setting(policy, identity, "r", ttl, reason, by, rate)
    override = await _arun(op)
    _forgotten(state)
    return override


async def aget(policy: Policy | str, identity: str | bytes | int) -> Override | None:
    name, _policy = _policy_name(policy, every=True)
    return await _arun(_getting(name, identity))


async def aclear(policy: Policy | str, identity: str | bytes | int) -> bool:
    name, resolved = _policy_name(policy, every=True)
    cleared = await _arun(_clearing(name, identity))
    _forgotten("" if resolved is None else resolved.redis_key(identity))
    return cleared


def scan(policy: str | None = None, count: int = 500) -> Iterator[Override]:
    """Every live override (of ``policy`` only, if given), every primary's keys walked with
    ``SCAN``; ``count`` is SCAN's hint. For the admin and ``redislua_override list``."""
    pattern = f"{glob_escape(settings.KEY_PREFIX)}:{OVERRIDES}:{{*}}"
    for _name, client in primary_nodes():
        now_us = _now_us(client)
        for key in client.scan_iter(match=pattern, count=count):
            fields = {(k.decode() if isinstance(k, bytes) else str(k)): v
                      for k, v in client.hgetall(key).items()}
            for name, value in fields.items():
                if name.startswith("m:") or (policy is not None and name != policy):
                    continue
                found = _parsed(name, value, fields.get("m:" + name), now_us)
                if found is not None:
                    yield found


# -- plumbing ----------------------------------------------------------------------------------

def _getting(name: str, identity: str | bytes | int) -> Op[Override | None]:
    def read(reply: Any) -> Override | None:
        return _parsed(name, reply[1], reply[2], int(reply[0]))

    return Op("django_redislua.override_get", [overrides_key(bound_identity(identity))],
              [clock.script_now(None), name], read)


def _clearing(name: str, identity: str | bytes | int) -> Op[bool]:
    return Op("django_redislua.override_clear", [overrides_key(bound_identity(identity))],
              [name], lambda reply: bool(reply))


def _run(op: Op[T]) -> T:
    try:
        return run(op)
    except RecipeUnavailable as exc:  # one script call, as a recipe's: Redis failed
        raise OverrideUnavailable(str(exc)) from exc


async def _arun(op: Op[T]) -> T:
    try:
        return await arun(op)
    except RecipeUnavailable as exc:
        raise OverrideUnavailable(str(exc)) from exc


def _now_us(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros) + clock.shift_us

