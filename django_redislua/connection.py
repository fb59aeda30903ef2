"""The Redis clients this app uses: sync and asyncio, built from ``REDISLUA["CONNECTION"]``.

``CONNECTION`` is a ``CACHES`` alias (django-redis or Django's ``RedisCache``) or a URL:
``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://host:port`` or
``redis+sentinel://host:port[,host:port]/service_name[/db]``.

A cache alias's sync connection pool is reused when it sets a socket timeout. A pool without
one (django-redis's default) would let a hung server hang every request, defeating FAIL_OPEN,
so then a sibling pool to the same server, with this app's short timeouts, is built instead.
asyncio clients are built per event loop (redis-py's asyncio connections belong to one loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import inspect
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.cluster
import redis.retry
import redis.sentinel
from asgiref.sync import AsyncToSync
from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff

from django_redislua.conf import on_change
from django_redislua.endpoints import (
    ConnectionConfigError as ConnectionConfigError,  # documented here (docs/api.md)
)
from django_redislua.endpoints import Endpoint, resolve_endpoint

SyncClient = redis.Redis | redis.cluster.RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

class RedisUnavailable(redis.ConnectionError):
    """Building the client failed a moment ago; it is not retried until the back-off ends."""


# Every way a call through the client can fail: redis-py's own families (RedisClusterException is
# not a RedisError), raw socket errors, and a setting that cannot be resolved (a connection
# setting, or the app missing from INSTALLED_APPS: ImproperlyConfigured, saying what to fix).
# The request layer's FAIL_OPEN guard catches exactly these.
CLIENT_ERRORS: tuple[type[BaseException], ...] = (
    redis.RedisError,
    redis.exceptions.RedisClusterException,
    OSError,
    ImproperlyConfigured,
)
# A connection closed by another thread while this one uses it fails inside redis-py (the reader
# or socket it dropped is None), not as a ConnectionError. redis-py 6.x does that to every
# thread at once: its cluster table refresh (NodesManager.initialize) disconnects the startup
# nodes' whole pools, connections in use included; any code calling pool.disconnect() does too.
TORN_DOWN = (AttributeError, TypeError)


class TornDown(redis.ConnectionError):
    """A connection another thread closed while this one used it: not a sign that Redis is
    down (protocol.retried tries again), unlike a refused connection."""


def torn_down(failure: BaseException) -> TornDown:
    """``failure`` (one of TORN_DOWN) as the lost connection it is."""
    lost = TornDown(f"the connection was closed while in use: {failure!r}")
    lost.__cause__ = failure
    return lost


# Where redis-py touches the socket or the reader a disconnect drops, outside its parsers.
_SOCKET_FUNCTIONS = frozenset({"send_packed_command", "_send_packed_command", "can_read"})
# Where its parsers read (the functions of redis/_parsers/ a torn-down reader fails in): the
# fallback when the parsers are not where redis-py 5.0.1 to 8.1 keep them.
_PARSER_FUNCTIONS = frozenset({"read_response", "_read_response", "read", "readline",
                               "read_from_socket", "_read_from_socket", "can_read_destructive"})


def has_redis_parsers() -> bool:
    """Feature test (docs/versions.md, "Other packages' internals"): redis-py's reply parsers
    live in the package ``redis._parsers``, so a failure raised in a file under
    ``/redis/_parsers/`` is one of a reader."""
    try:
        spec = importlib.util.find_spec("redis._parsers")
    except ModuleNotFoundError:  # pragma: no cover - redis itself missing
        return False
    return spec is not None and spec.submodule_search_locations is not None


REDIS_PARSERS = has_redis_parsers()


def closed_under_us(failure: BaseException) -> bool:
    """Whether ``failure`` (one of TORN_DOWN) was raised where redis-py reads or writes the
    socket (its parsers, ``send_packed_command``, ``can_read``): a connection another thread
    closed. Not a mistake such as a misspelt connection option (a TypeError from building the
    connection), which must reach the user as it is. Where the parsers are is redis-py's
    internal (:data:`REDIS_PARSERS`); without it their functions are known by name."""
    frame = failure.__traceback__
    if frame is None:
        return False
    while frame.tb_next is not None:
        frame = frame.tb_next
    code = frame.tb_frame.f_code
    path = code.co_filename.replace("\\", "/")
    if "/redis/" not in path:
        return False
    if REDIS_PARSERS:
        return "/redis/_parsers/" in path or code.co_name in _SOCKET_FUNCTIONS
    return code.co_name in _SOCKET_FUNCTIONS or code.co_name in _PARSER_FUNCTIONS


# Seconds a failed client build is remembered: an outage costs one connection attempt per
# second per process, not one per request (a cluster's discovery contacts every startup node).
BUILD_BACKOFF = 1.0


_cache_clients: weakref.WeakSet[redis.Redis] = weakref.WeakSet()  # a cache's, never closed here


def has_django_cache_client() -> bool:
    """Feature test (docs/versions.md, "Other packages' internals"): Django's ``RedisCache``
    keeps its client object in ``_cache`` (a cached property) and hands out its redis-py
    client by ``get_client(write=True)``. Django has no public way to reach it."""
    return "_cache" in vars(RedisCache) and callable(getattr(RedisCacheClient, "get_client", None))


DJANGO_CACHE_CLIENT = has_django_cache_client()


def _cache_sync_client(endpoint: Endpoint) -> redis.Redis | None:
    """The cache's own client when its pool has a socket timeout; None to build a sibling
    (also when Django's RedisCache no longer keeps its client where we read it)."""
    from django.core.cache import caches

    assert endpoint.cache_alias is not None
    if endpoint.cache_flavour == "django_redis":
        from django_redis import get_redis_connection

        client: redis.Redis = get_redis_connection(endpoint.cache_alias, write=True)
    elif DJANGO_CACHE_CLIENT:
        client = caches[endpoint.cache_alias]._cache.get_client(write=True)  # type: ignore[attr-defined]
    else:
        return None
    if not isinstance(client, redis.Redis):
        return None
    if client.connection_pool.connection_kwargs.get("socket_timeout") is None:
        return None
    return client


def checkout(pool: Any) -> Callable[[], Any]:
    """``pool.get_connection`` as a callable without arguments on every redis-py: up to 5.2 it
    requires a command name, from 5.3 passing one is deprecated. The connection it returns is
    connected, and was checked by the pool (a connection the server closed is replaced)."""
    parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        return functools.partial(pool.get_connection, "_")
    return pool.get_connection  # type: ignore[no-any-return]


def _build_sync(endpoint: Endpoint) -> SyncClient:
    if endpoint.cache_alias is not None and endpoint.kind == "single":
        reused = _cache_sync_client(endpoint)
        if reused is not None:
            _cache_clients.add(reused)
            return reused
    if endpoint.kind == "cluster":
        return redis.cluster.RedisCluster.from_url(endpoint.url, **endpoint.options)
    if endpoint.kind == "sentinel":
        # Sentinels are asked in turn, the next when one fails, so retrying a dead one only
        # delays the answer: redis-py's default Retry (10 tries, backoff up to 1 s) made each
        # dead sentinel cost ~3.5 s, not SOCKET_CONNECT_TIMEOUT. A user's own "retry" wins.
        sentinel = redis.sentinel.Sentinel(
            list(endpoint.sentinels),
            sentinel_kwargs={"retry": redis.retry.Retry(NoBackoff(), 0),
                             **endpoint.sentinel_options},
            **endpoint.options,
        )
        primary: redis.Redis = sentinel.master_for(endpoint.service_name)
        return primary
    return redis.Redis.from_url(endpoint.url, **endpoint.options)


# The Sentinel manager each asyncio Sentinel client was built from: closing the primary's client
# leaves the manager's clients of the sentinels open (see _aclose).
_sentinel_managers: weakref.WeakKeyDictionary[AsyncClient, redis.asyncio.sentinel.Sentinel] = (
    weakref.WeakKeyDictionary()
)


def _build_async(endpoint: Endpoint) -> AsyncClient:
    if endpoint.kind == "cluster":
        return redis.asyncio.cluster.RedisCluster.from_url(endpoint.url, **endpoint.options)
    if endpoint.kind == "sentinel":
        sentinel = redis.asyncio.sentinel.Sentinel(
            list(endpoint.sentinels),
            sentinel_kwargs={"retry": redis.asyncio.retry.Retry(NoBackoff(), 0),
                             **endpoint.sentinel_options},
            **endpoint.options,
        )
        async_primary: redis.asyncio.Redis = sentinel.master_for(endpoint.service_name)
        _sentinel_managers[async_primary] = sentinel
        return async_primary
    return redis.asyncio.Redis.from_url(endpoint.url, **endpoint.options)


_lock = threading.Lock()
_sync_client: SyncClient | None = None
_sync_failure: tuple[float, BaseException] | None = None  # (retry after, monotonic; the error)
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient] = (
    weakref.WeakKeyDictionary()
)


# Every client's closer stays referenced until its loop shuts down, even after a settings change
# dropped the client: a closer that is garbage-collected while its loop is not running (a test's
# loop between two tests) could never close its client, which would leak its connections.
_closers: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, list[AsyncGenerator[None, None]]
] = weakref.WeakKeyDictionary()
_closing: set[asyncio.Future[Any]] = set()


def _aclose(client: AsyncClient) -> Awaitable[list[None]]:
    """Close an asyncio client, and for Sentinel the connections to the sentinels too (closing
    the primary's client leaves the Sentinel manager's own clients open)."""
    manager = _sentinel_managers.get(client)
    sentinels = manager.sentinels if manager is not None else ()
    return asyncio.gather(client.aclose(), *(sentinel.aclose() for sentinel in sentinels))


def _closed(task: asyncio.Future[Any]) -> None:
    """A close has ended. One the loop's shutdown cancelled (a settings change just before
    ``asyncio.run`` returned) is consumed, not logged as never retrieved: the client's closer
    closes it as the loop shuts down (``_close_with_loop``)."""
    _closing.discard(task)
    if not task.cancelled():
        task.exception()


def _close_soon(loop: asyncio.AbstractEventLoop, client: AsyncClient) -> None:
    """Close a dropped asyncio client on its own loop (it cannot be closed from another)."""
    if loop.is_closed():
        return

    def schedule() -> None:
        task = asyncio.ensure_future(_aclose(client), loop=loop)
        _closing.add(task)
        task.add_done_callback(_closed)

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        schedule()
    elif loop.is_running():
        loop.call_soon_threadsafe(schedule)


@on_change
def reset_clients() -> None:
    """Forget built clients (settings changed); asyncio ones are closed on their loops, the
    sync one's idle connections now (one in use by another thread is left to finish its call;
    a cache alias's client is the cache's, left alone)."""
    global _sync_client, _sync_failure
    with _lock:
        sync_client, _sync_client, _sync_failure = _sync_client, None, None
        dropped = list(_async_clients.items())
        _async_clients.clear()
    if sync_client is not None:
        _disconnect_idle(sync_client)
    for loop, client in dropped:
        _close_soon(loop, client)


def _disconnect_idle(client: SyncClient) -> None:
    if isinstance(client, redis.cluster.RedisCluster):
        # RedisCluster.close() leaves the nodes' pools of a client built by from_url open.
        pools = [node.redis_connection.connection_pool for node in client.get_nodes()
                 if node.redis_connection is not None]
    elif client in _cache_clients:
        return
    else:
        pools = [client.connection_pool]
    for pool in pools:
        pool.disconnect(inuse_connections=False)


def get_client() -> SyncClient:
    """The process-wide sync client (thread-safe; redis-py pools connections).

    A build that fails (a cluster's discovery finding no node, a setting that cannot be
    resolved) is remembered for BUILD_BACKOFF seconds: meanwhile calls raise RedisUnavailable
    at once instead of trying again per request.
    """
    global _sync_client, _sync_failure
    client = _sync_client
    if client is None:
        with _lock:
            if _sync_client is None:
                if _sync_failure is not None and time.monotonic() < _sync_failure[0]:
                    raise RedisUnavailable(
                        f"the Redis client could not be built ({_sync_failure[1]}); "
                        f"retrying within {BUILD_BACKOFF:g}s"
                    ) from _sync_failure[1]
                try:
                    _sync_client = _build_sync(resolve_endpoint())
                except CLIENT_ERRORS as exc:
                    _sync_failure = (time.monotonic() + BUILD_BACKOFF, exc)
                    raise
                _sync_failure = None
            client = _sync_client
    return client


async def _close_with_loop(
    loop: asyncio.AbstractEventLoop, client: AsyncClient
) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        # The client refers to its loop, so the weak-keyed maps would never drop it by themselves.
        if _async_clients.get(loop) is client:
            del _async_clients[loop]
        _closers.pop(loop, None)  # the loop is shutting down: every closer of it runs now
        await _aclose(client)


def has_loop_thread_executors() -> bool:
    """Feature test (docs/versions.md, "Other packages' internals"): asgiref's
    ``AsyncToSync.loop_thread_executors`` maps each loop it made for one call to that call's
    executor. asgiref has no public way to tell such a loop."""
    return isinstance(getattr(AsyncToSync, "loop_thread_executors", None), dict)


ASGIREF_LOOP_EXECUTORS = has_loop_thread_executors()


def on_throwaway_loop() -> bool:
    """True inside an event loop that asgiref made for one ``async_to_sync`` call.

    That is how an async view runs under WSGI: a new loop per request, in a thread of its own,
    serving nothing else. An asyncio client there would connect (and authenticate, and shake
    hands for TLS) once per request; the process-wide sync client, called inline, reuses its
    pool and blocks only that private loop, exactly as a sync view would.

    Without asgiref's ``loop_thread_executors`` (:data:`ASGIREF_LOOP_EXECUTORS`) every loop
    is taken for a lasting one: correct, at the cost of a connection per such request.
    """
    if not ASGIREF_LOOP_EXECUTORS:
        return False
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return loop in AsyncToSync.loop_thread_executors


def get_async_client() -> AsyncClient:
    """The asyncio client of the running event loop, closed when that loop shuts down.

    Loops can be short-lived: asgiref's async_to_sync runs each call of an async view under WSGI
    in a new loop. A client's connections cannot outlive its loop, so the client is tied to the
    loop's end through an async generator: asyncio.run, asgiref and pytest-asyncio all finalize
    a loop's async generators (``shutdown_asyncgens``) before closing it.
    """
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        client = _build_async(resolve_endpoint())
        closer = _close_with_loop(loop, client)
        # Run the generator to its `yield` now, synchronously (nothing before it awaits): that
        # registers it with the loop, whose shutdown then runs its `finally`.
        with contextlib.suppress(StopIteration):
            closer.__anext__().send(None)
        _async_clients[loop] = client
        _closers.setdefault(loop, []).append(closer)
    return client


def primary_nodes(client: SyncClient | None = None) -> list[tuple[str, redis.Redis]]:
    """``(name, client)`` for every primary: one for a single server, each primary of a cluster."""
    client = client or get_client()
    if isinstance(client, redis.cluster.RedisCluster):
        nodes = []
        # Not get_primaries(): while a node fails, redis-py reorders its node table without the
        # lock get_primaries() iterates it under (NodesManager.move_node_to_end_of_cached_nodes,
        # redis-py 7.2 to 8.1 at least), so it can raise "dictionary changed size during
        # iteration". get_nodes() copies the table in one step.
        for node in [n for n in client.get_nodes() if n.server_type == redis.cluster.PRIMARY]:
            conn = node.redis_connection or client.get_redis_connection(node)
            nodes.append((node.name, conn))
        return nodes
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        name = f"unix:{kwargs['path']}"
    else:
        name = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    return [(name, client)]


def aclose_client() -> Awaitable[object]:
    """Close and forget the running loop's asyncio client (await it before the loop ends)."""
    loop = asyncio.get_running_loop()
    client = _async_clients.pop(loop, None)
    _closers.pop(loop, None)
    return asyncio.sleep(0) if client is None else _aclose(client)
