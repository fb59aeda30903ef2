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
import threading
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from django_redislua.conf import on_change, settings

SyncClient = redis.Redis | redis.cluster.RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

REDIS_CACHE_BACKENDS = {
    "django.core.cache.backends.redis.RedisCache": "django",
    "django_redis.cache.RedisCache": "django_redis",
}
URL_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)


@dataclass(frozen=True)
class Endpoint:
    """Where Redis is, resolved from settings; knows nothing of clients."""

    kind: str  # "single", "cluster" or "sentinel"
    url: str  # for "cluster"/"sentinel": the URL with the +cluster/+sentinel part removed
    options: dict[str, Any] = field(default_factory=dict)
    cache_alias: str | None = None
    cache_flavour: str | None = None  # "django" or "django_redis"
    sentinels: tuple[tuple[str, int], ...] = ()
    service_name: str = ""


def _timeouts() -> dict[str, Any]:
    return {
        "socket_timeout": settings.SOCKET_TIMEOUT,
        "socket_connect_timeout": settings.SOCKET_CONNECT_TIMEOUT,
    }


def parse_url(url: str) -> Endpoint:
    """Parse a CONNECTION URL; ImproperlyConfigured with a readable reason when it is wrong."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in URL_SCHEMES:
        raise ImproperlyConfigured(
            f"REDISLUA['CONNECTION'] {url!r} is neither a CACHES alias nor a URL with a scheme in "
            f"{', '.join(URL_SCHEMES)}."
        )
    options = {**_timeouts(), **settings.CONNECTION_OPTIONS}
    base_scheme = scheme.split("+")[0]
    if scheme.endswith("+cluster"):
        if not parts.hostname:
            raise ImproperlyConfigured(f"Cluster URL {url!r} needs a host:port of one node.")
        return Endpoint("cluster", url.replace(scheme, base_scheme, 1), options)
    if scheme.endswith("+sentinel"):
        netloc = parts.netloc.rsplit("@", 1)[-1]
        path = [p for p in parts.path.split("/") if p]
        if not netloc or not path:
            raise ImproperlyConfigured(
                f"Sentinel URL {url!r} must look like redis+sentinel://host:port/service_name."
            )
        sentinels = []
        for hostport in netloc.split(","):
            host, _, port = hostport.rpartition(":")
            if not host:
                host, port = port, "26379"
            sentinels.append((host.strip("[]"), int(port)))
        if parts.password:
            options.setdefault("password", unquote(parts.password))
        if parts.username:
            options.setdefault("username", unquote(parts.username))
        if len(path) > 1:
            options.setdefault("db", int(path[1]))
        if base_scheme == "rediss":
            options.setdefault("ssl", True)
        return Endpoint("sentinel", url, options, sentinels=tuple(sentinels), service_name=path[0])
    if scheme != "unix" and not parts.hostname:
        raise ImproperlyConfigured(f"REDISLUA['CONNECTION'] URL {url!r} has no host.")
    return Endpoint("single", url, options)


def resolve_endpoint() -> Endpoint:
    """Turn ``REDISLUA["CONNECTION"]`` into an Endpoint (no network I/O)."""
    target = settings.CONNECTION
    caches = getattr(django_settings, "CACHES", {})
    if target in caches:
        config = caches[target]
        backend = config.get("BACKEND", "")
        flavour = REDIS_CACHE_BACKENDS.get(backend)
        if flavour is None:
            raise ImproperlyConfigured(
                f"REDISLUA['CONNECTION'] names the cache {target!r}, whose backend {backend!r} is "
                f"not a Redis backend ({', '.join(REDIS_CACHE_BACKENDS)})."
            )
        location = config.get("LOCATION", "")
        if isinstance(location, str):
            location = location.split(",")
        primary = str(location[0]).strip() if location else ""
        endpoint = parse_url(primary)
        return Endpoint(
            endpoint.kind,
            endpoint.url,
            endpoint.options,
            target,
            flavour,
            endpoint.sentinels,
            endpoint.service_name,
        )
    if "://" not in target:
        raise ImproperlyConfigured(
            f"REDISLUA['CONNECTION'] {target!r} is not a CACHES alias "
            f"(known: {', '.join(caches) or 'none'}) and not a URL."
        )
    return parse_url(target)


def _cache_sync_client(endpoint: Endpoint) -> redis.Redis | None:
    """The cache's own client when its pool has a socket timeout; None to build a sibling."""
    from django.core.cache import caches

    assert endpoint.cache_alias is not None
    if endpoint.cache_flavour == "django_redis":
        from django_redis import get_redis_connection

        client: redis.Redis = get_redis_connection(endpoint.cache_alias, write=True)
    else:
        client = caches[endpoint.cache_alias]._cache.get_client(write=True)  # type: ignore[attr-defined]
    if not isinstance(client, redis.Redis):
        return None
    if client.connection_pool.connection_kwargs.get("socket_timeout") is None:
        return None
    return client


def _build_sync(endpoint: Endpoint) -> SyncClient:
    if endpoint.cache_alias is not None and endpoint.kind == "single":
        reused = _cache_sync_client(endpoint)
        if reused is not None:
            return reused
    if endpoint.kind == "cluster":
        return redis.cluster.RedisCluster.from_url(endpoint.url, **endpoint.options)
    if endpoint.kind == "sentinel":
        sentinel = redis.sentinel.Sentinel(
            list(endpoint.sentinels), sentinel_kwargs=_timeouts(), **endpoint.options
        )
        primary: redis.Redis = sentinel.master_for(endpoint.service_name)
        return primary
    return redis.Redis.from_url(endpoint.url, **endpoint.options)


def _build_async(endpoint: Endpoint) -> AsyncClient:
    if endpoint.kind == "cluster":
        return redis.asyncio.cluster.RedisCluster.from_url(endpoint.url, **endpoint.options)
    if endpoint.kind == "sentinel":
        sentinel = redis.asyncio.sentinel.Sentinel(
            list(endpoint.sentinels), sentinel_kwargs=_timeouts(), **endpoint.options
        )
        async_primary: redis.asyncio.Redis = sentinel.master_for(endpoint.service_name)
        return async_primary
    return redis.asyncio.Redis.from_url(endpoint.url, **endpoint.options)


_lock = threading.Lock()
_sync_client: SyncClient | None = None
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncClient] = (
    weakref.WeakKeyDictionary()
)


_closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncGenerator[None, None]] = (
    weakref.WeakKeyDictionary()
)
_closing: set[asyncio.Future[None]] = set()


def _close_soon(loop: asyncio.AbstractEventLoop, client: AsyncClient) -> None:
    """Close a dropped asyncio client on its own loop (it cannot be closed from another)."""
    if loop.is_closed():
        return

    def schedule() -> None:
        task = asyncio.ensure_future(client.aclose(), loop=loop)
        _closing.add(task)
        task.add_done_callback(_closing.discard)

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
    """Forget built clients (settings changed); asyncio ones are closed on their loops."""
    global _sync_client
    with _lock:
        _sync_client = None
        dropped = list(_async_clients.items())
        _async_clients.clear()
        _closers.clear()
    for loop, client in dropped:
        _close_soon(loop, client)


def get_client() -> SyncClient:
    """The process-wide sync client (thread-safe; redis-py pools connections)."""
    global _sync_client
    client = _sync_client
    if client is None:
        with _lock:
            if _sync_client is None:
                _sync_client = _build_sync(resolve_endpoint())
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
            _closers.pop(loop, None)
        await client.aclose()


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
        _closers[loop] = closer
    return client


def primary_nodes(client: SyncClient | None = None) -> list[tuple[str, redis.Redis]]:
    """``(name, client)`` for every primary: one for a single server, each primary of a cluster."""
    client = client or get_client()
    if isinstance(client, redis.cluster.RedisCluster):
        nodes = []
        for node in client.get_primaries():
            conn = node.redis_connection or client.get_redis_connection(node)
            nodes.append((node.name, conn))
        return nodes
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        name = f"unix:{kwargs['path']}"
    else:
        name = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    return [(name, client)]


async def aclose_client() -> None:
    """Close and forget the running loop's asyncio client (call before the loop ends)."""
    loop = asyncio.get_running_loop()
    client = _async_clients.pop(loop, None)
    _closers.pop(loop, None)
    if client is not None:
        await client.aclose()
