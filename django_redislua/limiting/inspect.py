"""Live inspection of rate-limit keys, scripts and servers: what the admin shows. No requests.

Keys are found with ``SCAN`` (never ``KEYS``), node by node on a cluster, with a bounded amount
of work per page: at most ``max_calls`` SCAN calls, so a page answers quickly however many keys
the server holds, and hands back a cursor to continue from. Each key's state is read through the
engine's own ``peek`` (which writes nothing), plus its TTL, its raw fields as stored, and a
sampled ``MEMORY USAGE``: two pipelined round trips per node per page.

A policy whose rate is a callable (per-plan rates) decides each request at the rate the callable
gives it; the page cannot know that rate, so the decision scripts keep it beside the state
(:meth:`~django_redislua.limiting.policy.Policy.rate_key`, see ratelimit.lua, "Kept rates"). The
first pass reads that record, the second peeks with its numbers: still two round trips.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from django_redislua.conf import settings
from django_redislua.connection import get_client, primary_nodes
from django_redislua.limiting import denials
from django_redislua.limiting.decision import PolicyError
from django_redislua.limiting.definition import (
    ALGORITHMS,
    MAX_EXACT,
    MAX_RATE_TEXT,
    overrides_key,
)
from django_redislua.limiting.identity import bound_identity
from django_redislua.limiting.policy import Policy
from django_redislua.limiting.registry import get_policy
from django_redislua.scripts import Script, get_script, registry

ALGORITHM_NAMES = {code: name for name, code in ALGORITHMS.items()}
PAGE_SIZE = 50
MAX_SCAN_CALLS = 20
MAX_SCAN_COUNT = 1000
US = 1_000_000
# Integers this large in a key's fields are instants on the server clock, in microseconds.
_INSTANT_US = (10**15, 10**17)


@dataclass(frozen=True)
class KeyState:
    """One live rate-limit key and what the engine says about it."""

    key: str
    node: str
    policy_name: str
    algorithm: str
    identity: str
    policy: Policy | None  # the configured policy, if the key still matches one
    remaining: int | None  # None when there is no configured policy to peek with
    limit: int | None
    reset_after: float | None  # seconds until the state is full again
    ttl: float | None  # seconds; None when the key has no expiry
    fields: list[tuple[str, str]]  # the algorithm's own state, as stored
    memory: int | None  # bytes, MEMORY USAGE (sampled)
    server_time: float  # the server clock when the key was read, seconds since the epoch
    # A policy with a rate callable: the rate this identity was last decided at ("100/h"), as
    # kept beside its state; None when none is kept (see the module docstring).
    kept_rate: str | None = None

    @property
    def per_request(self) -> bool:
        """True when the key's policy takes its rate from a callable, per request."""
        return self.policy is not None and self.policy.is_dynamic


@dataclass(frozen=True)
class KeyPage:
    keys: list[KeyState]
    cursor: str  # pass back to continue; "" when the scan has covered every node
    scan_calls: int
    pattern: str
    memory: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory", sum(k.memory or 0 for k in self.keys))


@dataclass(frozen=True)
class NodeStatus:
    name: str
    version: str
    used_memory: int
    dbsize: int
    scripts: dict[str, bool]  # script name -> loaded in this node's script cache
    functions: str = ""  # this release's Functions library: "loaded", "not loaded", "needs Redis 7"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _key_pattern() -> re.Pattern[str]:
    codes = "|".join(ALGORITHM_NAMES)
    return re.compile(
        rf"^{re.escape(settings.KEY_PREFIX)}:(?P<name>.+):(?P<code>{codes}):\{{(?P<identity>[^{{}}]*)\}}$"
    )


def parse_key(key: str) -> tuple[str, str, str] | None:
    """``(policy name, algorithm code, identity)`` of a rate-limit key, or None if it is not one."""
    match = _key_pattern().match(key)
    return None if match is None else (match["name"], match["code"], match["identity"])


def glob_escape(text: str) -> str:
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def match_pattern(search: str = "", policy: str | None = None) -> str:
    """The SCAN MATCH glob for a search (a substring of the key or identity) and a policy."""
    prefix = glob_escape(settings.KEY_PREFIX)
    scope = f"{prefix}:{glob_escape(policy)}:" if policy else f"{prefix}:"
    if not search:
        return scope + "*" if policy else scope + "*:??:{*}"
    identity = bound_identity(search)
    if identity != search:
        # Never stored as typed: look for the digest the engine stores instead.
        return f"{scope}*{{{glob_escape(identity)}}}"
    return f"{scope}*{glob_escape(search)}*"


def _decode_cursor(cursor: str) -> tuple[int, int]:
    if not cursor:
        return 0, 0
    node, _, position = cursor.partition("-")
    try:
        result = int(node), int(position)
    except ValueError:
        raise ValueError(f"bad cursor {cursor!r}") from None
    if min(result) < 0:
        raise ValueError(f"bad cursor {cursor!r}")
    return result


def scan_primaries(nodes: Sequence[tuple[str, Any]], cursor: str, pattern: str,
                   page_size: int, max_calls: int, take: Callable[[int, str], bool],
                   ) -> tuple[str, int]:
    """SCAN ``nodes`` (every primary) for ``pattern`` from ``cursor`` ("<node>-<position>",
    "" = the start), calling ``take(node index, key)`` for each key found (True when the key
    counts toward the page), until ``page_size`` keys counted or ``max_calls`` SCANs made.
    Returns the cursor to continue from ("" when every node was scanned) and the SCANs made.
    Raises ValueError for a bad cursor."""
    index, position = _decode_cursor(cursor)
    counted = calls = 0
    count = page_size
    while index < len(nodes) and calls < max_calls and counted < page_size:
        position, keys = nodes[index][1].scan(position, match=pattern, count=count)
        calls += 1
        counted += sum(1 for key in keys if take(index, _text(key)))
        if position == 0:
            index += 1
        count = min(count * 2, MAX_SCAN_COUNT)
    return ("" if index >= len(nodes) else f"{index}-{position}"), calls


Known = Mapping[str, Policy]


def _settings_policies() -> dict[str, Policy]:
    known = {}
    for name in settings.POLICIES:
        try:
            known[name] = get_policy(name)
        except PolicyError:
            continue
    return known


def _configured(name: str, code: str, known: Known) -> Policy | None:
    """The known policy ``name`` if it still uses this algorithm (a policy with a rate callable
    is peeked at the rate kept beside the key's state, when there is one)."""
    policy = known.get(name)
    if policy is None or policy.code != code:
        return None
    return policy


Kept = tuple[str, int, int, str]  # a kept rate: its text, and its limit, param and extra


def kept_rate(record: Any, code: str) -> Kept | None:
    """A kept rate's record ("CODE|LIMIT|PARAM|EXTRA|RATE", see ratelimit.lua) for a state of
    algorithm ``code``; None when absent or not of that shape (never trusted further)."""
    if not isinstance(record, bytes) or len(record) > 200:
        return None
    parts = record.decode("ascii", "replace").split("|", 4)
    if len(parts) != 5 or parts[0] != code:
        return None
    _code, limit, param, extra, text = parts
    if not (limit.isdigit() and param.isdigit() and (extra == "" or extra.isdigit())):
        return None
    if int(limit) < 1 or int(param) < 1 or len(text) > MAX_RATE_TEXT:
        return None
    return text, int(limit), int(param), extra


def _node_of(key: str, nodes: Sequence[tuple[str, redis.Redis]]) -> int:
    client = get_client()
    if isinstance(client, RedisCluster):
        name = cast(Any, client).get_node_from_key(key).name  # untyped in redis-py
        return next((i for i, (n, _) in enumerate(nodes) if n == name), 0)
    return 0


def scan_keys(
    cursor: str = "", *, search: str = "", policy: str | None = None,
    page_size: int = PAGE_SIZE, max_calls: int = MAX_SCAN_CALLS, known: Known | None = None,
) -> KeyPage:
    """One page of live rate-limit keys, from ``cursor`` ("" = the start).

    At most ``max_calls`` SCAN calls are made; the page may hold fewer than ``page_size`` keys
    (or a few more: SCAN's COUNT is a hint) and still have a cursor to continue from. A search
    that is a whole key of ours is looked up directly, without scanning.
    """
    nodes = primary_nodes()
    if known is None:
        known = _settings_policies()
    if search and parse_key(search) is not None and not cursor:
        index = _node_of(search, nodes)
        return KeyPage(_states(nodes[index], [search], known), "", 0, search)
    pattern = match_pattern(search, policy)
    found: dict[tuple[int, str], None] = {}

    def take(index: int, key: str) -> bool:
        # MATCH is a glob: only keys of a state's shape count (not a kept rate's, "...:rt:{}")
        if (index, key) in found or parse_key(key) is None:
            return False
        found[index, key] = None
        return True

    next_cursor, calls = scan_primaries(nodes, cursor, pattern, page_size, max_calls, take)
    by_node: dict[int, list[str]] = {}
    for node_index, key in found:
        by_node.setdefault(node_index, []).append(key)
    states: list[KeyState] = []
    for node_index, node_keys in by_node.items():
        states += _states(nodes[node_index], node_keys, known)
    states.sort(key=lambda s: (s.policy_name, s.identity))
    return KeyPage(states, next_cursor, calls, pattern)


def _tag(key: str) -> str:
    return key[key.rindex("{") + 1:-1]  # a state key ends with its identity's tag


def _peek(pipe: Any, script: Script, key: str, policy: Policy,
          numbers: tuple[int, int, str]) -> None:
    """A peek at ``key`` with ``numbers`` (limit, param, extra) and the identity's overrides:
    what its next hit meets (the engine's own script, which writes nothing on a peek)."""
    limit, param, extra = numbers
    pipe.evalsha(script.sha, 2, key, overrides_key(_tag(key)),
                 "peek", "", policy.code, limit, param, 1, extra, "1", policy.name)


def _pipelined(client: redis.Redis, script: Script, fill: Callable[[Any], None]) -> list[Any]:
    """The replies of the pipeline ``fill`` fills; run again, once, with the script loaded
    when a peek in it met NOSCRIPT. A failed command comes back as its exception."""
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        fill(pipe)
        replies = pipe.execute(raise_on_error=False)
        if attempt == 0 and any(isinstance(r, NoScriptError) for r in replies):
            client.script_load(script.source)
            continue
        break
    return replies


def _first_pass(client: redis.Redis, keys: Sequence[str], script: Script,
                policies: Sequence[Policy | None]) -> list[Any]:
    """TIME, then TYPE, PTTL, MEMORY USAGE and (when possible) a peek for every key; for a
    key of a policy with a rate callable, its kept rate instead of the peek.

    A peek that fails (the key holds another algorithm's state) comes back as its exception.
    """
    def fill(pipe: Any) -> None:
        pipe.time()
        for key, policy in zip(keys, policies, strict=True):
            pipe.type(key)
            pipe.pttl(key)
            pipe.memory_usage(key)
            if policy is None:
                continue
            if policy.is_dynamic:
                pipe.get(policy.rate_key(_tag(key)))
            else:
                _peek(pipe, script, key, policy, (policy.limit, policy.param, policy.extra))

    return _pipelined(client, script, fill)


def _states(node: tuple[str, redis.Redis], keys: Sequence[str], known: Known) -> list[KeyState]:
    name, client = node
    script = get_script("django_redislua.ratelimit")
    parsed = [p for p in map(parse_key, keys) if p is not None]
    if len(parsed) != len(keys):
        raise ValueError("only rate-limit keys of this app can be inspected")
    policies = [_configured(name, code, known) for name, code, _identity in parsed]
    replies = iter(_first_pass(client, keys, script, policies))
    seconds, micros = _checked(next(replies))
    now_us = int(seconds) * US + int(micros)
    first = []
    for policy, (_name, code, _identity) in zip(policies, parsed, strict=True):
        kind = _text(_checked(next(replies)))
        pttl, memory = int(_checked(next(replies))), _checked(next(replies))
        peeked = kept = None
        if policy is not None and policy.is_dynamic:
            kept = kept_rate(next(replies), code)  # peeked in the second pass
        elif policy is not None:
            peeked = next(replies)
        first.append((kind, pttl, memory, None if isinstance(peeked, Exception) else peeked,
                      kept))

    def fill(pipe: Any) -> None:
        for key, policy, (kind, _pttl, _memory, _peeked, kept) in zip(
                keys, policies, first, strict=True):
            if kind == "hash":
                pipe.hgetall(key)
            elif kind == "string":
                pipe.get(key)
            elif kind == "zset":
                pipe.zcard(key)
                pipe.zrange(key, 0, 0, withscores=True)
                pipe.zrange(key, -1, -1, withscores=True)
            if kept is not None and policy is not None and kind != "none":
                _peek(pipe, script, key, policy, kept[1:])

    raw = iter(_pipelined(client, script, fill))

    states = []
    rows = zip(keys, parsed, policies, first, strict=True)
    for key, parts, policy, (kind, pttl, memory, peeked, kept) in rows:
        fields = _fields(kind, raw, parts[1])
        if kind == "none":
            continue  # expired since SCAN saw it
        if kept is not None:
            peeked = next(raw)
            if isinstance(peeked, Exception):
                peeked = None
        policy_name, code, identity = parts
        # The limit the peek decided with: the policy's (or its kept rate's), or a live
        # override's changed rate, which decides instead while it lasts.
        limit = (int(peeked[4]) if peeked else
                 policy.limit if policy is not None and not policy.is_dynamic else None)
        states.append(KeyState(
            key=key, node=name, policy_name=policy_name, algorithm=ALGORITHM_NAMES[code],
            identity=identity, policy=policy,
            remaining=int(peeked[1]) if peeked else None,
            limit=limit,
            reset_after=int(peeked[2]) / US if peeked else None,
            ttl=pttl / 1000 if pttl >= 0 else None,
            fields=fields, memory=int(memory) if memory is not None else None,
            server_time=now_us / US,
            kept_rate=kept[0] if kept is not None and peeked else None,
        ))
    return states


def instant(text: str) -> float | None:
    """Seconds since the epoch if ``text`` is an instant in microseconds on the server clock.

    The algorithms store instants as integer microseconds, alone or ``:``-joined with counts.
    """
    if text.isdigit() and _INSTANT_US[0] < int(text) < _INSTANT_US[1]:
        return int(text) / US
    return None


def _checked(reply: Any) -> Any:
    if isinstance(reply, Exception):
        raise reply
    return reply


# The algorithms' packed state (django_redislua/redislua/lib/<algorithm>.lua): the previous
# release's struct format (doubles; still written when a value does not fit the compact form)
# and the field names. The algorithm code in every key names the layout, the length the form.
PACKED = {
    "fw": ("<dd", ("window start", "count")),
    "sw": ("<ddd", ("window start", "current count", "previous count")),
    "tb": ("<ddd", ("tokens taken", "refilled at", "refilled at, 1/q us")),
    "lb": ("<dd", ("water, 1/q us", "measured at")),
    "gc": ("<dd", ("TAT", "TAT, 1/q us")),
}
# The compact form (12 bytes: Redis keeps it inside the value's object): little-endian unsigned
# integers of these widths in bytes (the sliding window's start in ms, not us).
COMPACT = {"fw": (7, 5), "sw": (6, 3, 3), "tb": (4, 7, 1), "lb": (5, 7), "gc": (7, 5)}
# The smallest form, where it fits: the fields' decimal digits, these many each, one 19-digit
# integer (Redis keeps it in the object's pointer). The sliding window's start in ms.
DIGITS = {"fw": (16, 3), "sw": (13, 3, 3)}
# The sliding log: one '<I7' entry (a hit's time, us) per unit admitted, in time order.
LOG_ENTRY = 7


def _split(value: bytes, widths: tuple[int, ...], decimal: bool) -> list[float]:
    """Fields of these widths: decimal digits, or little-endian unsigned integers."""
    numbers, at = [], 0
    for width in widths:
        part = value[at:at + width]
        numbers.append(float(part) if decimal else float(int.from_bytes(part, "little")))
        at += width
    return numbers


def log_times(value: bytes) -> list[int]:
    """A sliding log's entries: the times (server clock, us) of the hits it holds, oldest first."""
    if len(value) % LOG_ENTRY:
        raise ValueError(f"a sliding log is {LOG_ENTRY}-byte entries, not {len(value)} bytes")
    return [int.from_bytes(value[at:at + LOG_ENTRY], "little")
            for at in range(0, len(value), LOG_ENTRY)]


def unpack_state(code: str, value: bytes) -> list[tuple[str, str]] | None:
    """The named fields of an algorithm's packed state, or None when it is not of that shape."""
    if code == "sl":
        if not value or len(value) % LOG_ENTRY:
            return None
        first = int.from_bytes(value[:LOG_ENTRY], "little")
        last = int.from_bytes(value[-LOG_ENTRY:], "little")
        if last >= MAX_EXACT:  # no time a script writes: another writer's value
            return None
        result = [("entries", str(len(value) // LOG_ENTRY)), ("oldest", str(first))]
        return [*result, ("newest", str(last))] if len(value) > LOG_ENTRY else result
    if code == "ca":  # the period's start in seconds and the count (lib/calendar.lua)
        text = value.decode("ascii", "replace")
        start, count = (text[:10], text[10:]) if len(text) == 19 and text.isdigit() else (
            text.partition(":")[::2])
        if not (start.isdigit() and count.isdigit()):
            return None
        return [("period start", str(int(start) * 1_000_000)), ("count", str(int(count)))]
    layout = PACKED.get(code)
    if layout is None:
        return None
    wide, names = layout
    digits = DIGITS.get(code)
    if len(value) == struct.calcsize(wide):
        numbers = list(struct.unpack(wide, value))
    else:
        if digits and len(value) == sum(digits) and value.isdigit():
            numbers = _split(value, digits, decimal=True)
        elif len(value) == sum(COMPACT[code]):
            numbers = _split(value, COMPACT[code], decimal=False)
        else:
            return None
        if code == "sw":
            numbers[0] *= 1000  # its start in ms
    # No time or count a script writes reaches 2^53: a value beyond is another writer's, which
    # the scripts read as no state (docs/ratelimit.md) and this shows as it is. (NaN too.)
    if not all(-MAX_EXACT < number < MAX_EXACT for number in numbers):
        return None
    return [(name, f"{number:.0f}") for name, number in zip(names, numbers, strict=True)]


def _fields(kind: str, raw: Any, code: str) -> list[tuple[str, str]]:
    """Consume this key's replies from the second pipeline; its state as (name, value) pairs."""
    if kind == "hash":
        return sorted((_text(k), _text(v)) for k, v in _checked(next(raw)).items())
    if kind == "string":
        value = _checked(next(raw))
        if value is None:
            return []
        packed = unpack_state(code, value) if isinstance(value, bytes) else None
        return packed if packed is not None else [("value", _text(value))]
    if kind == "zset":
        size, oldest, newest = (_checked(next(raw)) for _ in range(3))
        result = [("entries", str(size))]
        if oldest:
            result.append(("oldest", f"{oldest[0][1]:.0f}"))
        if newest and size > 1:
            result.append(("newest", f"{newest[0][1]:.0f}"))
        return result
    return []


def reset_key(key: str) -> bool:
    """Delete one rate-limit key (one ``DEL``, atomic). False if it was already gone.

    Only keys of this app's rate-limit shape are accepted, so the admin cannot delete others.
    """
    if parse_key(key) is None:
        raise ValueError(f"{key!r} is not a rate-limit key of this app")
    denials.forget(key)  # this process at once; the others within the cache's 1 s horizon
    return bool(get_client().delete(key))


def server_status() -> list[NodeStatus]:
    """Version, memory, key count, script-cache and Functions-library state of every primary."""
    from django_redislua.functions import MIN_FUNCTIONS_VERSION, library_names

    scripts = registry.all()
    lib_name, _source = registry.library()
    result = []
    for name, client in primary_nodes():
        pipe = client.pipeline(transaction=False)
        pipe.info("server")
        pipe.info("memory")
        pipe.dbsize()
        if scripts:
            pipe.script_exists(*(s.sha for s in scripts.values()))
        replies = pipe.execute()
        loaded = replies[3] if scripts else []
        version = str(replies[0].get("redis_version", "?"))
        if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < MIN_FUNCTIONS_VERSION:
            functions = "needs Redis 7"
        else:
            functions = "loaded" if lib_name in library_names(client, lib_name) else "not loaded"
        result.append(NodeStatus(
            name=name,
            version=version,
            functions=functions,
            used_memory=int(replies[1].get("used_memory", 0)),
            dbsize=int(replies[2]),
            scripts={s: bool(ok) for s, ok in zip(scripts, loaded, strict=True)},
        ))
    return result
