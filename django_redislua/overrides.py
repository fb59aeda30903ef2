"""Live overrides: block, allow or re-rate one identity, on every app server, at no extra cost.

    from django_redislua import overrides
    overrides.block("login", "203.0.113.7", ttl="1h", reason="credential stuffing")
    overrides.allow("api", partner_user, ttl="30d", reason="partner")  # never limited by "api"
    overrides.set_rate("api", "u42", "10000/h", ttl="30d", reason="enterprise plan")
    overrides.get("api", "u42")   # -> Override | None
    overrides.clear("api", "u42")
    overrides.scan()              # every live override

The identity is the one the policy's key yields (what the admin's keys tab shows: ``u42`` for
user 42 under the ``user`` keys), or what a person naturally has: a ``User``, a request (the
key is applied to it), an address (masked as the ``ip`` key masks it). An identity none of the
policy's keys can yield (``"42"`` for a ``user`` key) is refused with the forms they yield
(:func:`identity_of`): stored, it would never match. ``policy="*"`` blocks or allows it under
every policy. A policy's own override wins over "*".

Applied inside the decision's own script (``lib/override.lua``), in the same round trip: the
identity's override hash shares the cluster slot of its state keys, and a decision looks for it
with one ``EXISTS`` (of a missing key, when there is none), then reads it with one ``HMGET``. A
block refuses without consuming, ``Retry-After`` the block's remaining time; an allow admits
without consuming; a changed rate decides the policy's algorithm at that rate on the
identity's own state (switching rates never resets a count). Every app server honours a new
or cleared override at its next decision; a denial another process's local cache answers is
asked again within 1 s (see :mod:`~django_redislua.limiting.denials`), in this process at
once.

Every override ends (``ttl`` is required, at most :data:`MAX_TTL`); its reason and who set it
are kept beside it. Identities, reasons and names are bounded: a hostile value never makes a
long key or a large hash. Redis failing raises :class:`OverrideUnavailable`. Each call is one
script; the ``a``-twins run the same on the asyncio driver.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django_redislua.conf import settings
from django_redislua.connection import get_client, primary_nodes
from django_redislua.keys import identity_for, user_identity
from django_redislua.limiting import clock, denials
from django_redislua.limiting.decision import ALLOW, BLOCK, RATE
from django_redislua.limiting.definition import OVERRIDES, overrides_key
from django_redislua.limiting.identity import bound_identity, is_bound
from django_redislua.limiting.inspect import glob_escape
from django_redislua.limiting.policy import Policy
from django_redislua.limiting.rates import parse_duration
from django_redislua.limiting.registry import UnknownPolicy, get_policy
from django_redislua.recipes.base import Op, arun, run
from django_redislua.replies import text

__all__ = [
    "ALLOW",
    "BLOCK",
    "EVERY_POLICY",
    "RATE",
    "Override",
    "OverrideUnavailable",
    "Tag",
    "aallow",
    "ablock",
    "aclear",
    "aget",
    "allow",
    "aset_rate",
    "block",
    "clear",
    "get",
    "lookup",
    "scan",
    "set_rate",
]

# An identity as the API takes it: the identity string (what the policy's key yields, e.g.
# "u42"), or what a person naturally has: a User (user keys), a request (the key is applied),
# an address (the ip key masks it).
Who = object
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
    tag: str  # the identity in its key form (a digest for a long one): pass Tag(tag) to find it
    kind: str  # BLOCK, ALLOW or RATE
    rate: str | None  # RATE's rate, as it was given
    reason: str
    expires_at: datetime  # UTC, on Redis's clock
    created_by: str | None
    created_at: datetime | None


class Tag(str):
    """An identity in its key form (what a key's hash tag, and the admin's keys tab, show: a
    digest for a long identity): used as it is, not bounded again. Anything that cannot be a
    key form raises ValueError."""

    def __new__(cls, value: str) -> Tag:
        if not is_bound(value):
            raise ValueError(f"{value[:40]!r} is not an identity's key form")
        return super().__new__(cls, value)


def _tag(identity: str | bytes | int) -> str:
    return identity if isinstance(identity, Tag) else bound_identity(identity)


def lookup(pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Override]:
    """The live override that applies to each ``(policy name, tag)`` (its own, else "*"):
    for the admin's keys tab, one pipelined HMGET per identity; liveness on this machine's
    clock (a display, not a decision)."""
    wanted = list(dict.fromkeys(pairs))
    if not wanted:
        return {}
    pipe = get_client().pipeline(transaction=False)
    for name, tag in wanted:
        pipe.hmget(overrides_key(tag), [name, "*", f"m:{name}", "m:*"])
    now_us = int(time.time() * 1_000_000) + clock.shift_us
    found = {}
    for (name, tag), (own, every, own_meta, every_meta) in zip(wanted, pipe.execute(),
                                                               strict=True):
        override = (_parsed(name, own, own_meta, now_us, tag)
                    or _parsed("*", every, every_meta, now_us, tag))
        if override is not None:
            found[(name, tag)] = override
    return found


def _bounded(text: object, most: int) -> str:
    value = str(text)
    return value if len(value) <= most else value[:most - 1] + "\u2026"


def _policy_name(policy: Policy | str, every: bool, configured: bool = True
                 ) -> tuple[str, Policy | None]:
    """The field an override of ``policy`` is kept in, and the policy (None for "*", or for
    a name no longer in use when ``configured`` is False: its override can still be read
    and cleared). A name is a policy of ``REDISLUA["POLICIES"]``, else one in use (an inline
    ``@ratelimit``'s, a DRF scope's: :func:`~django_redislua.discovery.policies_in_use`).
    An unknown name raises UnknownPolicy (a KeyError) naming the configured ones."""
    if isinstance(policy, Policy):
        return policy.name, policy
    if not isinstance(policy, str) or not policy or len(policy) > MAX_SHOWN:
        raise ValueError(f"a policy is a Policy, a configured policy's name or {EVERY_POLICY!r}, "
                         f"not {str(policy)[:40]!r}")
    if policy == EVERY_POLICY:
        if not every:
            raise ValueError('a changed rate is for one policy: "*" has no rate to change')
        return EVERY_POLICY, None
    try:
        return policy, get_policy(policy)
    except UnknownPolicy:
        from django_redislua.discovery import find_policy

        found = find_policy(policy)  # an inline @ratelimit's, or a DRF scope's
        if found is not None:
            return policy, found
        if configured:
            raise
        return policy, None


def identity_of(policy: Policy | None, identity: object) -> str | bytes | int:
    """The identity ``policy``'s keys yield for ``identity`` (a request, a User, an address or
    the identity itself), or ValueError naming the forms they yield: an override of an
    identity no request can have would be stored and never match. A key form from the admin
    (:class:`Tag`) is kept. For "*" (``policy`` None) a User is ``u<pk>``; text is kept."""
    if isinstance(identity, Tag):
        return identity
    if policy is None:
        user = user_identity(identity)
        if user is not None:
            return user
        if isinstance(identity, str | bytes | int) and not isinstance(identity, bool):
            return identity
        raise ValueError('an override of "*" (every policy) takes an identity string or a '
                         f"User, not {identity!r:.40}: each policy keys a request its own way")
    from django_redislua.discovery import key_specs_of, policies_in_use

    in_use = policies_in_use().get(policy.name)
    if in_use is None or in_use.policy is not policy:
        # Not a policy requests are keyed by (a Policy of the Python API's own): its
        # identities are whatever its caller passes to hit().
        specs: list[object] = [DIRECT]
    else:
        specs = key_specs_of(policy)
    errors = []
    for spec in specs:
        try:
            return identity_for(spec, identity, policy.normalize)
        except ValueError as exc:
            errors.append(str(exc))
    raise ValueError(f"policy {policy.name!r}: " + "; ".join(dict.fromkeys(errors)))


# The key spec of a policy no request is keyed by: any identity (a request: its user_or_ip).
DIRECT = "direct"


def _lenient(policy: Policy | None, identity: object) -> str | bytes | int:
    """:func:`identity_of` for reading and clearing: an identity no key yields is used as it
    is (an override stored before identities were checked can still be read and cleared)."""
    try:
        return identity_of(policy, identity)
    except ValueError:
        if isinstance(identity, str | bytes | int):
            return identity
        raise


def _ttl_us(ttl: object) -> int:
    seconds = parse_duration(ttl)
    if seconds > MAX_TTL:
        raise ValueError(f"ttl {ttl!r} is longer than an override may last ({MAX_TTL:.0f} s)")
    return max(1000, round(seconds * 1_000_000))


def _setting(policy: Policy | str, identity: Who, kind: str, ttl: object,
             reason: str, by: object, rate: str | None = None, now_us: int | None = None
             ) -> Op[Override]:
    """The script call that sets an override; on its reply, this process's local denial of
    that policy and identity ends (the next decision meets the override at once)."""
    name, resolved = _policy_name(policy, every=kind != "r")
    ttl_us = _ttl_us(ttl)
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
            if (resolved.code == "ca" and resolved.rate is not None and derived.rate is not None
                    and derived.rate.calendar != resolved.rate.calendar):
                # The periods are the policy's: a quota per month is not made one per day.
                raise ValueError(
                    f"policy {resolved.name!r} counts per {resolved.rate.calendar}: give its "
                    f"override a rate per {resolved.rate.calendar} too, not {rate[:40]!r}")
            value = f"r|{derived.code}|{derived.limit}|{derived.param}|{derived.extra}"
    identity = identity_of(resolved, identity)
    shown = _bounded(identity if not isinstance(identity, bytes)
                     else identity.decode("utf-8", "replace"), MAX_SHOWN)
    meta = {"identity": shown, "rate": rate, "reason": _bounded(reason, MAX_REASON),
            "created_by": None if by is None else _bounded(by, MAX_SHOWN),
            "created_at": time.time()}
    tag = _tag(identity)
    state = None if resolved is None else resolved.tag_key(tag)

    def read(ends: Any) -> Override:
        denials.forget(state)  # None: "*", every entry (a block too: its Retry-After, at once)
        return _override(name, _KINDS[kind], int(ends), meta, tag)

    return Op("django_redislua.override_set", [overrides_key(tag)],
              [name, value, ttl_us, json.dumps(meta), clock.script_now(now_us)], read,
              OverrideUnavailable)


def _override(name: str, kind: str, ends_us: int, meta: dict[str, Any], tag: str) -> Override:
    created = meta.get("created_at")
    return Override(
        policy=name, identity=str(meta.get("identity", tag)), tag=tag, kind=kind,
        rate=meta.get("rate"),
        reason=str(meta.get("reason", "")),
        expires_at=datetime.fromtimestamp(ends_us / 1_000_000, UTC),
        created_by=meta.get("created_by"),
        created_at=None if created is None else datetime.fromtimestamp(float(created), UTC),
    )


def _parsed(name: str, value: bytes | str | None, meta: bytes | str | None, now_us: int,
            tag: str            ) -> Override | None:
    """The live override a field holds, or None (absent, ended, or not one of ours)."""
    if not value:
        return None
    parts = text(value).split("|")
    if len(parts) < 2 or parts[0] not in _KINDS or not parts[1].isdigit():
        return None
    ends = int(parts[1])
    if ends <= now_us:
        return None
    try:
        data = json.loads(meta) if meta else {}
    except ValueError:
        data = {}
    return _override(name, _KINDS[parts[0]], ends, data if isinstance(data, dict) else {}, tag)


# -- the API: one script call each, sync or on the asyncio driver --------------------------------

def block(policy: Policy | str, identity: Who, *, ttl: object, reason: str = "",
          by: object = None, now_us: int | None = None) -> Override:
    """Refuse ``identity`` under ``policy`` (or "*") for ``ttl``, consuming nothing.
    (``now_us``, here and below: a time to start from instead of Redis's, for tests that
    inject time, as :func:`~django_redislua.limiting.evaluate`'s.)"""
    return run(_setting(policy, identity, "b", ttl, reason, by, now_us=now_us))


def allow(policy: Policy | str, identity: Who, *, ttl: object, reason: str = "",
          by: object = None, now_us: int | None = None) -> Override:
    """Admit ``identity`` under ``policy`` (or "*") for ``ttl``, consuming nothing."""
    return run(_setting(policy, identity, "a", ttl, reason, by, now_us=now_us))


def set_rate(policy: Policy | str, identity: Who, rate: str, *, ttl: object,
             reason: str = "", by: object = None, now_us: int | None = None) -> Override:
    """Decide ``identity`` under ``policy`` at ``rate`` (its algorithm, on the identity's own
    state; for a concurrency policy, a number of slots) for ``ttl``."""
    return run(_setting(policy, identity, "r", ttl, reason, by, rate, now_us))


def get(policy: Policy | str, identity: Who, *, now_us: int | None = None
        ) -> Override | None:
    """The live override of ``policy`` (a name, or "*") for ``identity``, or None. Only that
    field: a "*" override is ``get("*", identity)``."""
    return run(_getting(policy, identity, now_us))


def clear(policy: Policy | str, identity: Who) -> bool:
    """End the override of ``policy`` (or "*") for ``identity``; False when there was none."""
    return run(_clearing(policy, identity))


def ablock(policy: Policy | str, identity: Who, *, ttl: object, reason: str = "",
           by: object = None) -> Awaitable[Override]:
    return arun(_setting(policy, identity, "b", ttl, reason, by))


def aallow(policy: Policy | str, identity: Who, *, ttl: object, reason: str = "",
           by: object = None) -> Awaitable[Override]:
    return arun(_setting(policy, identity, "a", ttl, reason, by))


def aset_rate(policy: Policy | str, identity: Who, rate: str, *, ttl: object,
              reason: str = "", by: object = None) -> Awaitable[Override]:
    return arun(_setting(policy, identity, "r", ttl, reason, by, rate))


def aget(policy: Policy | str, identity: Who) -> Awaitable[Override | None]:
    return arun(_getting(policy, identity))


def aclear(policy: Policy | str, identity: Who) -> Awaitable[bool]:
    return arun(_clearing(policy, identity))


def scan(policy: str | None = None, count: int = 500) -> Iterator[Override]:
    """Every live override (of ``policy`` only, if given), every primary's keys walked with
    ``SCAN``; ``count`` is SCAN's hint. For the admin and ``redislua_override list``."""
    pattern = f"{glob_escape(settings.KEY_PREFIX)}:{OVERRIDES}:{{*}}"
    for _name, client in primary_nodes():
        now_us = _now_us(client)
        for key in client.scan_iter(match=pattern, count=count):
            name = text(key)
            tag = name[name.index("{", len(settings.KEY_PREFIX)) + 1:-1]
            fields = {text(k): v
                      for k, v in client.hgetall(key).items()}
            for name, value in fields.items():
                if name.startswith("m:") or (policy is not None and name != policy):
                    continue
                found = _parsed(name, value, fields.get("m:" + name), now_us, tag)
                if found is not None:
                    yield found


# -- plumbing ----------------------------------------------------------------------------------

def _getting(policy: Policy | str, identity: Who, now_us: int | None = None
             ) -> Op[Override | None]:
    name, resolved = _policy_name(policy, every=True, configured=False)
    tag = _tag(_lenient(resolved, identity))

    def read(reply: Any) -> Override | None:
        return _parsed(name, reply[1], reply[2], int(reply[0]), tag)

    return Op("django_redislua.override_get", [overrides_key(tag)],
              [clock.script_now(now_us), name], read, OverrideUnavailable)


def _clearing(policy: Policy | str, identity: Who) -> Op[bool]:
    name, resolved = _policy_name(policy, every=True, configured=False)
    tag = _tag(_lenient(resolved, identity))
    state = None if resolved is None else resolved.tag_key(tag)

    def read(reply: Any) -> bool:
        denials.forget(state)  # None: "*", every entry
        return bool(reply)

    return Op("django_redislua.override_clear", [overrides_key(tag)],
              [name], read, OverrideUnavailable)


def _now_us(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1_000_000 + int(micros) + clock.shift_us

