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
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.cluster
import redis.retry
import redis.sentinel
from asgiref.sync import AsyncToSync
from django.conf import settings as django_settings
from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff

from django_redislua.conf import on_change, settings

SyncClient = redis.Redis | redis.cluster.RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

REDIS_CACHE_BACKENDS = {
    "django.core.cache.backends.redis.RedisCache": "django",
    "django_redis.cache.RedisCache": "django_redis",
}
# Django's RedisCache keeps these OPTIONS for itself; every other one goes to the pool.
DJANGO_CACHE_ONLY_OPTIONS = frozenset({"pool_class", "parser_class", "serializer"})
# django-redis's own OPTIONS that become client keyword arguments.
DJANGO_REDIS_OPTIONS = {
    "USERNAME": "username",
    "PASSWORD": "password",
    "SOCKET_TIMEOUT": "socket_timeout",
    "SOCKET_CONNECT_TIMEOUT": "socket_connect_timeout",
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


class ConnectionConfigError(ImproperlyConfigured):
    """``REDISLUA["CONNECTION"]`` (or the cache it names) is wrong; ``check_id`` reports it."""

    def __init__(self, check_id: str, message: str) -> None:
        super().__init__(message)
        self.check_id = check_id


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


@dataclass(frozen=True)
class Endpoint:
    """Where Redis is and how to authenticate, resolved from settings; knows nothing of clients.

    ``options`` are the keyword arguments of every client built for it, sync and asyncio alike:
    this app's short timeouts, then the cache's OPTIONS, then ``REDISLUA["CONNECTION_OPTIONS"]``
    (URL query arguments, which redis-py parses itself, win over all of them).
    """

    kind: str  # "single", "cluster" or "sentinel"
    url: str  # for "cluster"/"sentinel": the URL with the +cluster/+sentinel part removed
    options: dict[str, Any] = field(default_factory=dict)
    cache_alias: str | None = None
    cache_flavour: str | None = None  # "django" or "django_redis"
    sentinels: tuple[tuple[str, int], ...] = ()
    service_name: str = ""
    sentinel_options: dict[str, Any] = field(default_factory=dict)  # the Sentinels' own auth


def _client_options(
    extra: dict[str, Any], sentinel_extra: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The data nodes' client options and the sentinels' own, merged in the documented order:
    this app's timeouts, then ``extra`` (a cache's OPTIONS), then ``CONNECTION_OPTIONS``, whose
    ``"sentinel_kwargs"`` goes to the sentinels (after ``sentinel_extra``)."""
    options = {**_timeouts(), **extra, **settings.CONNECTION_OPTIONS}
    sentinel = {**_timeouts(), **(sentinel_extra or {}), **options.pop("sentinel_kwargs", {})}
    return options, sentinel


def _timeouts() -> dict[str, Any]:
    return {
        "socket_timeout": settings.SOCKET_TIMEOUT,
        "socket_connect_timeout": settings.SOCKET_CONNECT_TIMEOUT,
    }


def _split_hostport(url: str, hostport: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` or ``[v6][:port]``; ConnectionConfigError when the port is not a port."""
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") else ""
    elif hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
    else:
        host, port = hostport, ""  # no port, or a bare IPv6 address
    if not port:
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConnectionConfigError(
            "redislua.E002",
            f"REDISLUA['CONNECTION'] URL {redacted_url(url)!r}: port {port!r} is not a number "
            "from 1 to 65535.",
        )
    return host, int(port)


def redacted_url(url: str) -> str:
    """The URL with any password replaced, for error messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo = f"{parts.username or ''}:***"
    return url.replace(parts.netloc, f"{userinfo}@{parts.netloc.rsplit('@', 1)[-1]}", 1)


def parse_url(url: str, extra: dict[str, Any] | None = None) -> Endpoint:
    """Parse a CONNECTION URL; ConnectionConfigError (redislua.E002) says what is wrong.

    ``extra`` holds the client options given beside the URL (a cache's OPTIONS); the app's
    ``CONNECTION_OPTIONS`` are applied over them.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ConnectionConfigError(
            "redislua.E002",
            f"{url!r} is not a Redis URL: write redis://host:port/db (or rediss://, unix://, "
            "redis+cluster://, redis+sentinel://).",
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in URL_SCHEMES:
        raise ConnectionConfigError(
            "redislua.E002",
            f"{redacted_url(url)!r} has the scheme {scheme!r}; use one of "
            f"{', '.join(URL_SCHEMES)}.",
        )
    options, sentinel_options = _client_options(extra or {})
    base_scheme = scheme.split("+")[0]
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = parse_qs(parts.query)
    if scheme.endswith("+sentinel"):
        path = [p for p in parts.path.split("/") if p]
        if not netloc or not path:
            raise ConnectionConfigError(
                "redislua.E002",
                f"Sentinel URL {redacted_url(url)!r} must look like "
                "redis+sentinel://[:password@]host:port[,host:port]/service_name[/db].",
            )
        sentinels = [_split_hostport(url, hostport, 26379) for hostport in netloc.split(",")]
        if parts.password:
            options.setdefault("password", unquote(parts.password))
        if parts.username:
            options.setdefault("username", unquote(parts.username))
        if len(path) > 1:
            if not path[1].isdigit():
                raise ConnectionConfigError(
                    "redislua.E002",
                    f"Sentinel URL {redacted_url(url)!r}: db {path[1]!r} is not a number.",
                )
            options.setdefault("db", int(path[1]))
        for name, values in query.items():  # the Sentinels' own credentials, else data options
            if name in ("sentinel_password", "sentinel_username"):
                sentinel_options[name.removeprefix("sentinel_")] = values[-1]
            else:
                options.setdefault(name, values[-1])
        if base_scheme == "rediss":
            options.setdefault("ssl", True)
        return Endpoint(
            "sentinel", url, options, sentinels=tuple(sentinels), service_name=path[0],
            sentinel_options=sentinel_options,
        )
    if scheme != "unix":
        if not parts.hostname:
            raise ConnectionConfigError(
                "redislua.E002", f"REDISLUA['CONNECTION'] URL {redacted_url(url)!r} has no host."
            )
        _split_hostport(url, netloc, 6379)
        db = parts.path.strip("/")
        if db and not db.isdigit():
            raise ConnectionConfigError(
                "redislua.E002", f"URL {redacted_url(url)!r}: the database {db!r} is not a number."
            )
    elif not parts.path:
        raise ConnectionConfigError(
            "redislua.E002", f"unix URL {redacted_url(url)!r} names no socket path."
        )
    if scheme.endswith("+cluster"):
        return Endpoint("cluster", url.replace(parts.scheme, base_scheme, 1), options)
    return Endpoint("single", url, options)


def _cache_options(flavour: str, options: dict[str, Any]) -> dict[str, Any]:
    """A cache's OPTIONS as redis-py client keyword arguments (password, TLS, timeouts...)."""
    if flavour == "django":
        # Django's RedisCache passes every OPTIONS entry but these three to the connection pool.
        return {k: v for k, v in options.items() if k not in DJANGO_CACHE_ONLY_OPTIONS}
    # django-redis: upper-case options of its own, plus CONNECTION_POOL_KWARGS as they are.
    kwargs: dict[str, Any] = {}
    for option, kwarg in DJANGO_REDIS_OPTIONS.items():
        if options.get(option) is not None:
            kwargs[kwarg] = options[option]
    kwargs.update(options.get("CONNECTION_POOL_KWARGS") or {})
    return kwargs


def resolve_endpoint(
    target: str | None = None, caches: dict[str, Any] | None = None
) -> Endpoint:
    """Turn ``REDISLUA["CONNECTION"]`` into an Endpoint (no network I/O).

    ConnectionConfigError (redislua.E002/E003) when it cannot be resolved. Checks pass the raw
    settings in; everything else uses the live ones.
    """
    target = settings.CONNECTION if target is None else target
    caches = getattr(django_settings, "CACHES", {}) if caches is None else caches
    if target not in caches:
        if "://" not in target:
            raise ConnectionConfigError(
                "redislua.E002",
                f"REDISLUA['CONNECTION'] {target!r} is not a CACHES alias "
                f"(known: {', '.join(caches) or 'none'}) and not a URL.",
            )
        return parse_url(target)
    config = caches[target]
    backend = config.get("BACKEND", "")
    flavour = REDIS_CACHE_BACKENDS.get(backend)
    if flavour is None:
        raise ConnectionConfigError(
            "redislua.E003",
            f"REDISLUA['CONNECTION'] names the cache {target!r}, whose backend {backend!r} is "
            f"not a Redis backend ({', '.join(REDIS_CACHE_BACKENDS)}).",
        )
    location = config.get("LOCATION", "")
    if isinstance(location, str):
        location = location.split(",")
    primary = str(location[0]).strip() if location else ""
    cache_options = config.get("OPTIONS") or {}
    try:
        extra = _cache_options(flavour, cache_options)
        if flavour == "django_redis" and cache_options.get("SENTINELS"):
            # django-redis's Sentinel form: LOCATION redis://service_name/db, OPTIONS SENTINELS.
            endpoint = _django_redis_sentinel(primary, cache_options, extra)
        else:
            endpoint = parse_url(primary, extra)
    except ConnectionConfigError as exc:
        raise ConnectionConfigError(
            exc.check_id, f"the cache {target!r} (REDISLUA['CONNECTION']): LOCATION: {exc}"
        ) from None
    return replace(endpoint, cache_alias=target, cache_flavour=flavour)


def _django_redis_sentinel(
    location: str, options: dict[str, Any], extra: dict[str, Any]
) -> Endpoint:
    parts = urlsplit(location)
    if not parts.hostname:
        raise ConnectionConfigError(
            "redislua.E002", f"{location!r} must look like redis://service_name/db with SENTINELS"
        )
    db = parts.path.strip("/")
    try:
        sentinels = [(str(host), int(port)) for host, port in options["SENTINELS"]]
    except (TypeError, ValueError):
        raise ConnectionConfigError(
            "redislua.E002", f"OPTIONS['SENTINELS'] must be a list of (host, port) pairs, not "
            f"{options['SENTINELS']!r}"
        ) from None
    data, sentinel_options = _client_options(extra, options.get("SENTINEL_KWARGS") or {})
    if parts.password:
        data.setdefault("password", unquote(parts.password))
    if db.isdigit():
        data.setdefault("db", int(db))
    return Endpoint(
        "sentinel", location, data, sentinels=tuple(sentinels), service_name=parts.hostname,
        sentinel_options=sentinel_options,
    )


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


def _close_soon(loop: asyncio.AbstractEventLoop, client: AsyncClient) -> None:
    """Close a dropped asyncio client on its own loop (it cannot be closed from another)."""
    if loop.is_closed():
        return

    def schedule() -> None:
        task = asyncio.ensure_future(_aclose(client), loop=loop)
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
