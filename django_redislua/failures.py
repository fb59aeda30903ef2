"""The failure families a protocol tells apart, found without importing redis-py or Django.

A protocol (:mod:`django_redislua.protocol`) tells a Redis failure from a cancellation, a
redirect from an error reply, a busy server from a refused connection. The classes it matches
belong to redis-py, to Django (``ImproperlyConfigured``: a connection setting that cannot be
resolved) and to :mod:`django_redislua.connection` (``TornDown``). Importing them would load
their packages: ``import redis.exceptions`` runs redis-py's ``__init__``, which imports its
clients (``redis.client``, ``redis.cluster``, ``redis.sentinel``, ``redis.asyncio``: some 250
modules). So nothing is imported here: a failure can only be an instance of a class whose
module is loaded already, so each family is looked up in ``sys.modules`` when something is
matched against it, and kept once every module it names is loaded (at once, in any process
that has built a client).

``families().client`` is :data:`django_redislua.connection.CLIENT_ERRORS`, the families the
request layer's FAIL_OPEN guard catches (``tests/unit/test_failures.py`` holds them equal).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

Classes = tuple[type[BaseException], ...]


@dataclass(frozen=True, slots=True)
class Families:
    """Each family as a tuple for ``isinstance`` and ``except`` (empty while none of its
    classes' modules is loaded: then nothing can be one of them)."""

    client: Classes  # every failure of a call through the client (connection.CLIENT_ERRORS)
    redis_or_socket: Classes  # a failure of Redis or of the socket (not of a setting)
    busy: Classes  # a connection that timed out or was closed by another thread: Redis is up
    redirects: Classes  # "not run here": MOVED, ASK, TRYAGAIN, CLUSTERDOWN
    moved: Classes
    ask: Classes  # redis-py's MovedError is an AskError too
    try_again: Classes
    cluster_down: Classes
    no_script: Classes
    response: Classes  # any error reply


# Each family's classes, by module and name (the fields of Families, in order).
_NAMES: dict[str, tuple[str, ...]] = {
    "client": ("redis.exceptions.RedisError", "redis.exceptions.RedisClusterException",
               "builtins.OSError", "django.core.exceptions.ImproperlyConfigured"),
    "redis_or_socket": ("redis.exceptions.RedisError", "builtins.OSError"),
    "busy": ("redis.exceptions.TimeoutError", "django_redislua.connection.TornDown"),
    "redirects": ("redis.exceptions.MovedError", "redis.exceptions.AskError",
                  "redis.exceptions.TryAgainError", "redis.exceptions.ClusterDownError"),
    "moved": ("redis.exceptions.MovedError",),
    "ask": ("redis.exceptions.AskError",),
    "try_again": ("redis.exceptions.TryAgainError",),
    "cluster_down": ("redis.exceptions.ClusterDownError",),
    "no_script": ("redis.exceptions.NoScriptError",),
    "response": ("redis.exceptions.ResponseError",),
}
_complete: Families | None = None


def families() -> Families:
    """The families as far as their modules are loaded now."""
    global _complete
    if _complete is not None:
        return _complete
    found = {family: tuple(cls for cls in map(_loaded, names) if cls is not None)
             for family, names in _NAMES.items()}
    known = Families(**found)
    complete = all(len(found[family]) == len(names) for family, names in _NAMES.items())
    if complete:
        _complete = known
    return known


def _loaded(name: str) -> type[BaseException] | None:
    """The class ``name`` ("module.Class") if its module is loaded (and done defining it)."""
    module, _, attribute = name.rpartition(".")
    cls = getattr(sys.modules.get(module), attribute, None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None
