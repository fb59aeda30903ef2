"""The settings: one schema entry per ``REDISLUA`` key, and the live facade that reads them.

Each entry (a :class:`Setting`, an attribute of :class:`Settings`) holds the setting's default,
how a value reads at request time, and the rule whose breach ``manage.py check`` reports under
its check id. The facade (``settings.KEY_PREFIX``) and the checks (``checks._scalars``) read the
same entries, so a setting's rule is written once.

The merged dict (``REDISLUA`` over the defaults) and the values read from it are cached, and the
caches are dropped on Django's ``setting_changed`` signal, so ``override_settings(REDISLUA=...)``
works in tests while the hot path pays one dict lookup per read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, NoReturn, TypeVar, overload

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from django_redislua import metric_backends as metrics

T = TypeVar("T")

HEADER_MODES = ("ietf", "legacy", "both", None)
DENIED_BODIES = ("text", "problem")


class Problem(NamedTuple):
    """What a check reports about a setting's value: the message and, when the check id's usual
    fix does not fit, a hint of its own."""

    message: str
    hint: str | None = None


# A setting's rule: (its name, a value) -> what is wrong with the value; [] when nothing.
Rule = Callable[[str, Any], list[Problem]]


def _must(test: Callable[[Any], bool], must: str, *, then: str = "",
          shown: Callable[[Any], str] | None = repr) -> Rule:
    """The usual rule: ``test(value)``, else "REDISLUA['NAME'] must be <must>, not <shown>."
    (``shown=None`` leaves the value out; ``then`` goes before the full stop)."""
    def rule(name: str, value: Any) -> list[Problem]:
        if test(value):
            return []
        what = "" if shown is None else f", not {shown(value)}"
        return [Problem(f"REDISLUA[{name!r}] must be {must}{what}{then}.")]
    return rule


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mask_rule(top: int) -> Rule:
    return _must(lambda v: _is_whole(v) and 0 < v <= top, f"between 1 and {top}")


def _key_prefix_ok(value: Any) -> bool:
    # Braces would change a key's cluster hash tag; whitespace has no place in a key.
    return isinstance(value, str) and bool(value) and not any(c in value for c in "{} \r\n")


def _denied_view_rule(name: str, value: Any) -> list[Problem]:
    if value is None:
        return []
    try:
        target = import_string(value) if isinstance(value, str) else value
    except ImportError as exc:
        return [Problem(f"REDISLUA[{name!r}] {value!r} cannot be imported: {exc}")]
    if not callable(target):
        return [Problem(f"REDISLUA[{name!r}] {value!r} is not callable.")]
    return []


def _metrics_rule(name: str, value: Any) -> list[Problem]:
    if not metrics.valid_setting(value):
        return [Problem(f"REDISLUA[{name!r}] must be \"auto\" or a list of "
                        f"{list(metrics.BACKENDS)} (each at most once), not {value!r}.")]
    if value == "auto":
        return []
    extras = {metrics.PROMETHEUS: "prometheus", metrics.OPENTELEMETRY: "otel"}
    return [Problem(f"REDISLUA[{name!r}] names {backend!r}, whose package is not installed.",
                    hint=f"pip install 'django-redislua[{extras[backend]}]'.")
            for backend in value if not metrics.installed(backend)]


def _token_shown(value: Any) -> str:
    # Never the token itself: its type, and its length when it is a string.
    return f"a {type(value).__name__}" + (f" of {len(value)}" if isinstance(value, str) else "")


def _as_is(value: Any) -> Any:
    return value


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


class Setting(Generic[T]):
    """One ``REDISLUA`` key: its default, how a value reads, and the check reporting a bad one.

    A value the rule rejects still reads: through ``read`` like any other (``bool("false")`` is
    True, which is why E024 exists), or as the default when ``read`` cannot take it
    (``float("soon")``) or with ``bad_reads_default`` (a lock keeps a 1 s claim window).
    ``copy`` (``dict.copy``, ``list.copy``): each read is a fresh copy, for the caller to change.

    No rule (and no check id): the setting is checked in checks.py along with what it is read
    with (CONNECTION with CACHES, POLICIES, MIDDLEWARE_POLICIES with POLICIES).
    """

    __slots__ = ("bad_reads_default", "check_id", "copy", "default", "name", "read", "rule")
    name: str

    def __init__(self, default: T, read: Callable[[Any], T], check_id: str | None = None,
                 rule: Rule | None = None, *, bad_reads_default: bool = False,
                 copy: Callable[[T], T] | None = None) -> None:
        self.default = default
        self.read = read
        self.check_id = check_id
        self.rule = rule
        self.bad_reads_default = bad_reads_default
        self.copy = copy

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    def problems(self, value: Any) -> list[Problem]:
        """What the check reports about ``value`` (under ``check_id``); [] when it is fine."""
        return [] if self.rule is None else self.rule(self.name, value)

    def value_of(self, value: Any) -> T:
        """What the app runs on when the setting is ``value``: never an exception (a request, or
        the check resolving the connection, would fail on it instead of the check reporting)."""
        if self.bad_reads_default and self.problems(value):
            return self.default
        try:
            return self.read(value)
        except (TypeError, ValueError, OverflowError):  # float("soon"), dict(3), int(inf)
            return self.default

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> Setting[T]: ...

    @overload
    def __get__(self, instance: Settings, owner: type[Any]) -> T: ...

    def __get__(self, instance: Settings | None, owner: type[Any]) -> Setting[T] | T:
        if instance is None:
            return self  # Settings.KEY_PREFIX: the schema entry
        value: T = _values[self.name]
        return value if self.copy is None else self.copy(value)

    def __set__(self, instance: Settings, value: NoReturn) -> NoReturn:
        raise AttributeError(f"{self.name} is read from settings.REDISLUA; override that instead")


def _flag(default: bool) -> Setting[bool]:
    return Setting(default, bool, "redislua.E024", _must(_is_bool, "True or False"))


def _seconds(default: float) -> Setting[float | None]:
    return Setting[float | None](
        default, _float_or_none, "redislua.E019",
        _must(lambda v: v is None or (_is_number(v) and v > 0), "a number of seconds > 0 or None"))


class Settings:
    """Typed, always-current view of ``settings.REDISLUA``: one :class:`Setting` per key, in the
    order docs/settings.md lists them."""

    __slots__ = ()

    # A CACHES alias (django-redis or Django's RedisCache) or a redis://, rediss://, unix://,
    # redis+cluster:// or redis+sentinel:// URL. Checked with CACHES: checks._connection.
    CONNECTION = Setting("default", str)
    # Extra keyword arguments for clients this app builds itself (from a URL, or beside a cache).
    CONNECTION_OPTIONS: Setting[dict[str, Any]] = Setting(
        {}, dict, "redislua.E019", _must(lambda v: isinstance(v, dict), "a dict", shown=None),
        copy=dict.copy)
    # Seconds. Short on purpose: a rate limiter must fail fast, then follow FAIL_OPEN.
    SOCKET_TIMEOUT = _seconds(0.5)
    SOCKET_CONNECT_TIMEOUT = _seconds(0.5)
    KEY_PREFIX = Setting("rl", str, "redislua.E016", _must(
        _key_prefix_ok, "a non-empty string without braces or spaces"))
    FAIL_OPEN = Setting(True, bool, "redislua.E013", _must(_is_bool, "True or False", shown=None))
    HEADERS = Setting[str | None]("ietf", _str_or_none, "redislua.E012", _must(
        lambda v: v in HEADER_MODES, f"one of {HEADER_MODES}"))
    TRUSTED_PROXIES = Setting(0, int, "redislua.E014", _must(
        lambda v: _is_whole(v) and v >= 0, "a whole number >= 0"))
    IPV4_MASK = Setting(32, int, "redislua.E015", _mask_rule(32))
    IPV6_MASK = Setting(64, int, "redislua.E015", _mask_rule(128))
    # Checked with the views and throttles using them: checks._policies.
    POLICIES: Setting[dict[str, dict[str, Any]]] = Setting({}, dict, copy=dict.copy)
    # Plans (plan name -> {policy name: rate, or None for unlimited}) and PLAN, the callable
    # (request) -> plan name (or its dotted path) that picks a request's: a policy a plan names
    # decides at that plan's rate (docs/quotas.md). Checked with POLICIES: checks._plans.
    PLANS: Setting[dict[str, dict[str, Any]]] = Setting({}, dict, copy=dict.copy)
    PLAN = Setting[Any](None, _as_is)
    # Checked against POLICIES: checks._middleware_policies.
    MIDDLEWARE_POLICIES: Setting[list[dict[str, Any]]] = Setting([], list, copy=list.copy)
    DENIED_VIEW = Setting[str | None](None, _str_or_none, "redislua.E018", _denied_view_rule)
    # The body of this app's own 429 (not of a DENIED_VIEW's): "text" ("Too Many Requests"), or
    # "problem" (RFC 9457 application/problem+json, the quota-exceeded type; see problem.py).
    DENIED_BODY = Setting("text", str, "redislua.E028", _must(
        lambda v: isinstance(v, str) and v in DENIED_BODIES, f"one of {DENIED_BODIES}",
        then="; denials keep the plain text body until it is fixed",
        shown=lambda v: f"{v!r:.80}"), bad_reads_default=True)
    # Call scripts as Redis 7 Functions (FCALL) instead of EVALSHA.
    USE_FUNCTIONS = _flag(False)
    # Answer a denied policy and identity in-process until Redis would lift the denial (at most
    # 1 s): a flood from one identity costs no round trip. Never admits; see limiting/denials.py.
    LOCAL_DENY = _flag(True)
    # Send script calls on a single server straight to a pooled connection (django_redislua/
    # lean.py), bypassing redis-py's per-command machinery; False keeps redis-py's path.
    LEAN_CALLS = _flag(True)
    # asyncio, a single server: the calls a loop's tasks make while others are in flight share
    # one connection, its writes and reads (django_redislua/pipelining.py); a call alone costs
    # what it costs without. False: a connection per call (docs/ratelimit.md, "Automatic
    # pipelining").
    PIPELINING = _flag(True)
    # False: the decorators, the middleware and the DRF throttles admit every request without
    # asking Redis (a kill switch, and for test settings). The Python API still decides.
    ENABLED = _flag(True)
    # "auto": record metrics in prometheus_client and/or OpenTelemetry, whichever is installed;
    # or a list of "prometheus", "opentelemetry"; [] for none. See django_redislua/metrics.py
    # (a bad value records as "auto" would).
    METRICS = Setting[Any]("auto", _as_is, "redislua.E025", _metrics_rule)
    # The bearer token a Prometheus scrape sends to the /metrics view (django_redislua.urls);
    # None: staff sessions only (also while the token is too short to be safe).
    METRICS_TOKEN = Setting[str | None](None, _as_is, "redislua.E027", _must(
        lambda v: v is None or (isinstance(v, str) and len(v) >= 16),
        "None or a string of at least 16 characters", shown=_token_shown), bad_reads_default=True)
    # Seconds a waiter handed a lock has to confirm it; an unconfirmed hand-off passes on.
    LOCK_CLAIM_WINDOW = Setting(1.0, float, "redislua.E023", _must(
        lambda v: _is_number(v) and 0 < v <= 60, "a number of seconds > 0 and <= 60"),
        bad_reads_default=True)

    def raw(self) -> dict[str, Any]:
        return _merged()


SCHEMA: tuple[Setting[Any], ...] = tuple(
    entry for entry in vars(Settings).values() if isinstance(entry, Setting))
_BY_NAME = {entry.name: entry for entry in SCHEMA}
DEFAULTS: dict[str, Any] = {entry.name: entry.default for entry in SCHEMA}


@functools.cache
def _merged() -> dict[str, Any]:
    user = getattr(django_settings, "REDISLUA", {})
    if not isinstance(user, dict):
        # checks.py reports this as redislua.E001; the app keeps running on defaults.
        user = {}
    return {**DEFAULTS, **user}


class _Values(dict[str, Any]):
    """The facade's values for the current settings, each read from the merged dict on first
    use and kept until the settings change."""

    def __missing__(self, name: str) -> Any:
        value = self[name] = _BY_NAME[name].value_of(_merged()[name])
        return value


_values = _Values()

# Bumped whenever REDISLUA or CACHES changes: a value derived from the settings on the hot path
# (a policy's key head, a script's command head, a view's rule) is cached with the generation
# read before it was made.
generation = 0


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: Any) -> None:
    global generation, _values
    if setting in ("REDISLUA", "CACHES"):
        _merged.cache_clear()
        _values = _Values()  # after the merge: a read in between fills the old one, not this
        try:
            for callback in _on_change:
                callback()
        finally:
            # Last: a value another thread derived while the caches above were being reset
            # (from a policy not yet forgotten, say) carries the old generation, and is made
            # again; and whatever a callback raised, the settings did change.
            generation += 1


_on_change: list[Any] = []


def on_change(callback: Any) -> Any:
    """Register a no-argument callable run whenever REDISLUA or CACHES changes (cache resets)."""
    _on_change.append(callback)
    return callback


def on_change_first(callback: Any) -> Any:
    """:func:`on_change`, run before the others: what gives connections back to a pool (the
    transports) runs before what closes the pool's idle connections (the clients)."""
    _on_change.insert(0, callback)
    return callback


settings = Settings()
