"""``VersionedCache``: cache writes that never replace a newer value with an older one.

The classic race: two writers read the database at versions 6 and 7, the one holding 7 writes
first, then 6 overwrites it and the cache serves old data until it expires. Here a write
carries its version and the compare and the write are one script. ``get_or_build`` is
``single_flight`` on the same entry: one caller builds, the others are served the stale copy
(or wait for the build when there is none, and share its failure: ``BuildFailed``), and a
build never overwrites a version that a ``set`` stored while it ran, nor stores after a
``delete`` made while it ran.

Values are pickled, as Django's cache does: only cache what your own code built.
"""

from __future__ import annotations

import pickle
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, TypeVar, cast

from django_redislua.atransport import arun as arun_protocol
from django_redislua.locks.coordination import own_errors
from django_redislua.locks.flight import Flight, flight_keys, flying
from django_redislua.locks.keys import Keys
from django_redislua.protocol import Invoke, Protocol
from django_redislua.recipes.base import (
    Op,
    arun,
    key,
    milliseconds,
    recipe_errors,
    recipe_name,
    run,
    whole,
)
from django_redislua.transport import run as run_protocol

R = TypeVar("R")


class Versioned(NamedTuple):
    """A cached ``value`` and the ``version`` it was stored under."""

    value: Any
    version: int


def _versioned(reply: Any) -> Versioned | None:
    if not reply:
        return None
    return Versioned(pickle.loads(reply[0]), int(reply[1] or 0))  # our own record


class VersionedCache:
    """Entries of the cache called ``name``, each with the version it was stored under.

    ``set`` writes only when its version is newer than the stored one's; the guard holds while
    the entry lives (after it expires any version may write). ``get`` returns only fresh values.
    """

    kind = "vcache"

    def __init__(self, name: str) -> None:
        self.name = recipe_name(name)

    def __repr__(self) -> str:
        return f"<VersionedCache {self.name}>"

    def keys(self, cache_key: str | bytes | int) -> Keys:
        """The entry's keys: the entry itself, ``:building`` (the build lease of
        ``get_or_build``), ``:failed`` (a failed build, for the callers that waited on it) and
        the channel that wakes the callers waiting for a build."""
        base = key(self.kind, self.name, cache_key)
        return Keys(base=base, channel=f"{base}:released")

    def _set(self, cache_key: str | bytes | int, value: Any, version: int,
             ttl: float | str) -> Op[bool]:
        whole(version, "version")
        return Op("django_redislua.recipe_vcache_set", [self.keys(cache_key).base],
                  [version, pickle.dumps(value), milliseconds(ttl)],
                  lambda reply: bool(reply[0]))

    def set(self, cache_key: str | bytes | int, value: Any, version: int,
            ttl: float | str = 300) -> bool:
        """Store ``value`` under ``version`` (an integer, 0 to 2^53 - 1) for ``ttl``, only when
        no entry with the same or a newer version is stored; True when written."""
        return run(self._set(cache_key, value, version, ttl))

    async def aset(self, cache_key: str | bytes | int, value: Any, version: int,
                   ttl: float | str = 300) -> bool:
        return await arun(self._set(cache_key, value, version, ttl))

    def _get(self, cache_key: str | bytes | int) -> Op[Versioned | None]:
        return Op("django_redislua.recipe_vcache_get", [self.keys(cache_key).base], [],
                  _versioned)

    def _value(self, cache_key: str | bytes | int, default: Any) -> Op[Any]:
        def read(reply: Any) -> Any:
            found = _versioned(reply)
            return default if found is None else found.value

        return Op("django_redislua.recipe_vcache_get", [self.keys(cache_key).base], [], read)

    def get(self, cache_key: str | bytes | int, default: Any = None) -> Any:
        """The fresh value stored under ``cache_key``, else ``default``."""
        return run(self._value(cache_key, default))

    async def aget(self, cache_key: str | bytes | int, default: Any = None) -> Any:
        return await arun(self._value(cache_key, default))

    def get_versioned(self, cache_key: str | bytes | int) -> Versioned | None:
        """The fresh value and its version, or None."""
        return run(self._get(cache_key))

    async def aget_versioned(self, cache_key: str | bytes | int) -> Versioned | None:
        return await arun(self._get(cache_key))

    def _delete(self, cache_key: str | bytes | int) -> Op[bool]:
        return Op("django_redislua.flight_forget", flight_keys(self.keys(cache_key)), [], bool)

    def delete(self, cache_key: str | bytes | int) -> bool:
        """Forget the entry (its version too), fresh or stale: the next ``get_or_build``
        builds. A build running now is not stored when it ends (its caller still gets its
        value): it may have read the data before the change that made you delete. True if the
        entry existed."""
        return run(self._delete(cache_key))

    async def adelete(self, cache_key: str | bytes | int) -> bool:
        return await arun(self._delete(cache_key))

    def get_or_build(self, cache_key: str | bytes | int, build: Callable[[], R],
                     ttl: float | str = 300, stale_ttl: float | str = 0,
                     lock_timeout: float | str = 10) -> R:
        """The fresh value; else exactly one caller runs ``build`` while the others get the
        stale copy (kept ``stale_ttl`` after it stops being fresh) or, without one, wait for
        the build: when it raises, they raise ``BuildFailed`` (see ``single_flight``) instead
        of each building in turn. The built value is stored under the version the entry had
        (0 for none), and not at all when a newer version was ``set``, or the entry deleted,
        while it built. ``lock_timeout`` is the build lease, renewed while ``build`` runs (it
        bounds how long a crashed builder keeps the others waiting)."""
        return cast(R, run_protocol(self._building(cache_key, Invoke(build), ttl, stale_ttl,
                                                   lock_timeout)))

    async def aget_or_build(self, cache_key: str | bytes | int,
                            build: Callable[[], Awaitable[R]], ttl: float | str = 300,
                            stale_ttl: float | str = 0, lock_timeout: float | str = 10) -> R:
        """The asyncio twin of :meth:`get_or_build`, for an async ``build``."""
        return cast(R, await arun_protocol(self._building(cache_key, Invoke(build), ttl,
                                                          stale_ttl, lock_timeout)))

    def _building(self, cache_key: str | bytes | int, build: Invoke, ttl: float | str,
                  stale_ttl: float | str, lock_timeout: float | str) -> Protocol[Any]:
        flight = Flight(self.keys(cache_key), lock_timeout, versioned=True, name=str(cache_key))
        return own_errors(recipe_errors(flying(flight, build, ttl, stale_ttl), "get_or_build"))
