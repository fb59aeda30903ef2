"""Where Redis is, from settings: ``REDISLUA["CONNECTION"]`` (a URL, or a ``CACHES`` alias
whose LOCATION and OPTIONS say it) resolved to an :class:`Endpoint`, or a
:class:`ConnectionConfigError` naming its check id. Knows nothing of clients:
:mod:`django_redislua.connection` builds them from an Endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from django_redislua.conf import settings

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

