"""What every recipe shares: its keys, one script call per operation, sync and asyncio alike.

An operation is described once, as an :class:`Op` (the script, its keys and arguments, and how
to read the reply); :func:`run` and :func:`arun` send it, so a sync method and its ``a``-twin
cannot drift apart. Redis failing raises :class:`RecipeUnavailable`: a stock, a queue or a
counter never "fails open".

Keys put the recipe's name outside the hash tag and the subject (a SKU, a user, a cache key)
inside it, so the keys of one subject share a cluster slot while different subjects spread over
the cluster; both pass through ``bound_identity``, so a hostile subject never makes a long key::

    rl:cap:downloads:{user:42}            CappedCounter
    rl:stock:flash-sale:{sku-1}           Inventory (+ ":orders", ":buyers")
    rl:queue:{emails}                     WorkQueue (+ ":tasks", ":in_flight", ...)
    rl:vcache:catalog:{page:1}            VersionedCache (+ ":building" while one builds)
    rl:wstats:latency:{checkout}          WindowStats
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from django_redislua.atransport import arun_step
from django_redislua.conf import settings
from django_redislua.connection import CLIENT_ERRORS
from django_redislua.limiting.identity import bound_identity
from django_redislua.limiting.rates import parse_duration
from django_redislua.locks import lease
from django_redislua.protocol import Protocol, raising
from django_redislua.scripts import Arg, get_script
from django_redislua.transport import run_step

T = TypeVar("T")

# Versions, counts and amounts travel through Lua's doubles: integers are exact below 2^53.
MAX_EXACT = 2**53 - 1


class RecipeUnavailable(Exception):
    """Redis could not be reached or failed while running a recipe's operation; whether the
    operation took effect is unknown only when the failure came after the command was sent
    (retry with the same order id, task token or version: every operation is safe to retry)."""


@dataclass(frozen=True)
class Op(Generic[T]):
    """One operation: ``script`` called with ``keys`` and ``args``, its reply read by ``read``;
    Redis failing raises ``unavailable`` (live overrides share this with the recipes)."""

    script: str
    keys: Sequence[str]
    args: Sequence[Arg]
    read: Callable[[Any], T]
    unavailable: type[Exception] = RecipeUnavailable


def delete_op(keys: Sequence[str]) -> Op[bool]:
    """Delete an instance's ``keys`` (one hash tag): True when any existed."""
    return Op("django_redislua.recipe_delete", keys, [], bool)


class _Step(Generic[T]):
    """An :class:`Op` as a :class:`~django_redislua.drivers.Step`: one script call, its reply
    read by the op; Redis failing raises RecipeUnavailable. The call is sent once: when its
    reply is lost the operation may or may not have happened (see RecipeUnavailable)."""

    decided = None

    def __init__(self, op: Op[T]) -> None:
        self.script = get_script(op.script)
        self.command = self.script.command(op.keys, op.args)
        self.result = op.read
        self.unavailable = op.unavailable

    def failed(self, failure: BaseException) -> Protocol[T]:
        if isinstance(failure, CLIENT_ERRORS):
            error = self.unavailable(f"Redis failed during {self.script.name}: {failure}")
            error.__cause__ = failure
            return raising(error)
        return raising(failure)


def recipe_errors(protocol: Protocol[T], what: str) -> Protocol[T]:
    """``protocol``, Redis failing raised as :class:`RecipeUnavailable`."""
    try:
        return (yield from protocol)
    except CLIENT_ERRORS as exc:
        raise RecipeUnavailable(f"Redis failed during {what}: {exc}") from exc


def run(op: Op[T]) -> T:
    return cast(T, run_step(_Step(op)))


def arun(op: Op[T]) -> Awaitable[T]:
    return cast(Awaitable[T], arun_step(_Step(op)))


def recipe_name(name: object) -> str:
    """The bounded form of a recipe's name (raises TypeError/ValueError for a bad one)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a recipe's name is a non-empty string, not {name!r}")
    return bound_identity(name)


def key(kind: str, name: str, subject: str | bytes | int | None = None) -> str:
    """``<prefix>:<kind>:<name>:{<subject>}``, or ``<prefix>:<kind>:{<name>}`` without one."""
    if subject is None:
        return f"{settings.KEY_PREFIX}:{kind}:{{{name}}}"
    return f"{settings.KEY_PREFIX}:{kind}:{name}:{{{identity(subject)}}}"


def identity(value: object) -> str:
    """A subject, order id or user id as it goes into a key or a field: bounded (see
    ``bound_identity``: at most 64 printable characters, no space, else a digest)."""
    if isinstance(value, bool) or not isinstance(value, (str, bytes, int)):
        raise TypeError(f"an identity is a str, bytes or int, not {type(value).__name__}")
    if value in ("", b""):
        raise ValueError("an identity cannot be empty")
    return bound_identity(value)


def whole(value: object, what: str, low: int = 0) -> int:
    """``value`` as an exact integer between ``low`` and 2^53 - 1, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} is an integer, not {value!r}")
    if not low <= value <= MAX_EXACT:
        raise ValueError(f"{what} must be between {low} and {MAX_EXACT}, not {value}")
    return value


def finite(value: object, what: str) -> float:
    """``value`` as a finite float, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} is a number, not {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, not {value!r}")
    return number


def microseconds(duration: float | str) -> int:
    """A duration ("10m", 30, "500ms") in whole microseconds (at least 1)."""
    return max(1, round(parse_duration(duration) * 1_000_000))


def milliseconds(duration: float | str) -> int:
    """A duration in whole milliseconds, rounded up (at least 1)."""
    return lease.milliseconds(parse_duration(duration))


