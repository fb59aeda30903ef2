"""What a policy is: its name, rate, algorithm, cost and options, parsed and checked, and the
Redis keys it decides on (:class:`PolicyDefinition`). Deciding is :class:`~django_redislua.
limiting.policy.Policy`'s, over the engine: the engine, the denial cache and a Decision read a
definition and never import Policy. No Django request in here."""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Sequence
from datetime import tzinfo
from typing import Any, Self, TypeVar

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_redislua import conf
from django_redislua.conf import settings
from django_redislua.limiting import calendar
from django_redislua.limiting.calendar import zone_of
from django_redislua.limiting.errors import PolicyError
from django_redislua.limiting.identity import bound_identity
from django_redislua.limiting.options import (
    DOTTED_PATH,
    CountFailures,
    count_failures_rule,
    methods_of,
    positive_int,
    resolve_callable,
)
from django_redislua.limiting.rates import Rate, RateError, parse_duration, parse_rate

ALGORITHMS = {
    "fixed_window": "fw",
    "sliding_log": "sl",
    "sliding_window": "sw",
    "token_bucket": "tb",
    "leaky_bucket": "lb",
    "gcra": "gc",
    "concurrency": "cc",
    "calendar": "ca",
}
WINDOW_ALGORITHMS = frozenset({"fixed_window", "sliding_log", "sliding_window"})
BUCKET_ALGORITHMS = frozenset({"token_bucket", "leaky_bucket", "gcra"})
CALENDAR = "calendar"  # a quota per calendar hour, day, week or month of a timezone
# A calendar quota's count shares one integer with its period's start (lib/calendar.lua).
MAX_CALENDAR_LIMIT = 999_999_999
DEFAULT_ALGORITHM = "sliding_window"
DEFAULT_CONCURRENCY_TIMEOUT = 60.0
# Options a policy in REDISLUA["POLICIES"] may have. `key`, `methods` and `block` are read by the
# Django layers; the core stores them untouched.
POLICY_OPTIONS = frozenset(
    {"algorithm", "rate", "burst", "limit", "timeout", "key", "methods", "cost", "block", "mode",
     "fallback_rate", "normalize", "count_failures", "timezone"}
)
# "enforce": the Django layers deny what the policy denies. "shadow": decided, counted and
# signalled exactly the same, but never blocks a request and sets no headers (a dry run).
ENFORCE, SHADOW = "enforce", "shadow"
MODES = (ENFORCE, SHADOW)

RateSpec = str | Callable[..., str | None] | None
# The shortest window period count_failures takes (half of it locates a refund's hit).
MIN_REFUND_PERIOD_US = 1_000_000
# Integers above 2^53 are not exact in a Lua number (a double): the scripts' bucket arithmetic
# (capacity times the interval numerator) must stay well below it.
MAX_EXACT = 2**53
# The key kind of an identity's live overrides (django_redislua.overrides): one hash per
# identity, "<KEY_PREFIX>:ov:{<identity>}", in the slot of the identity's state keys.
OVERRIDES = "ov"
# The key kind of the rate a rate callable last gave an identity (see Policy.rate_key): two
# letters, none of ALGORITHMS' codes, so never read as a state key.
RATE_KEPT = "rt"
# Characters of a kept rate's text ("1000/h", "100000/month (pro)"): plan names are at most 24
# (redislua.E034), so this bound is never reached.
MAX_RATE_TEXT = 40


def overrides_key(tag: str) -> str:
    """The override hash of the identity whose hash tag (:func:`bound_identity`) is ``tag``."""
    return f"{settings.KEY_PREFIX}:{OVERRIDES}:{{{tag}}}"


D = TypeVar("D", bound="PolicyDefinition")


class PolicyDefinition:
    """A named limit, as defined: :class:`~django_redislua.limiting.policy.Policy` decides by it
    (``hit``/``peek``/``reset``, one round trip each).

    ``rate`` is ``"N/period"``; it may also be a callable ``(request) -> str | None`` or its
    dotted path, which the Django layers resolve per request with :meth:`with_rate`.
    """

    # A policy at a rate its rate callable gave (see _derived) keeps that rate beside each
    # identity's state (rate_key), as ``rate_record``, so the admin can peek at it.
    keeps_rate = False
    rate_record = ""
    _rate_head: tuple[int, str] = (-1, "")  # (settings generation, rate_key's head)

    def __init__(
        self,
        name: str,
        rate: RateSpec = None,
        algorithm: str = DEFAULT_ALGORITHM,
        *,
        burst: int | None = None,
        limit: int | None = None,
        timeout: float | str | None = None,
        key: Any = None,
        methods: Sequence[str] | None = None,
        cost: int = 1,
        block: bool = True,
        mode: str = ENFORCE,
        fallback_rate: str | None = None,
        normalize: bool = False,
        count_failures: CountFailures = None,
        timezone: object = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise PolicyError(
                "redislua.E004", f"a policy name must be a non-empty string, not {name!r}"
            )
        if "{" in name or "}" in name:  # it would become its keys' hash tag (cluster slot)
            raise PolicyError(
                "redislua.E004",
                f"policy name {name!r} must not contain braces: on a cluster, {{...}} in a key "
                "is its hash tag, and a policy's keys are tagged with the identity",
            )
        if algorithm not in ALGORITHMS:
            raise PolicyError(
                "redislua.E005",
                f"policy {name!r}: unknown algorithm {algorithm!r} "
                f"(choose from {', '.join(ALGORITHMS)})",
            )
        if mode not in MODES:
            raise PolicyError(
                "redislua.E026",
                f"policy {name!r}: mode must be {ENFORCE!r} or {SHADOW!r}, not {mode!r}",
            )
        self.name = name
        self.mode = mode
        self.shadow = mode == SHADOW
        self.algorithm = algorithm
        self.code = ALGORITHMS[algorithm]
        self.key = key
        self.methods = methods_of(name, methods)
        self.cost = positive_int(cost, "redislua.E010", f"policy {name!r}: cost")
        self.block = bool(block)
        if not isinstance(normalize, bool):
            raise PolicyError(
                "redislua.E011", f"policy {name!r}: normalize must be True or False, not "
                f"{normalize!r:.40}")
        self.normalize = normalize
        # Which responses are failures (the Django layers give every other admitted hit back,
        # see limiting/refund.py): statuses, or a callable (request, response) -> bool; None:
        # every request counts.
        self.count_failures = count_failures_rule(name, algorithm, count_failures)
        self.fallback_rate: str | None = None
        self.rate_spec: RateSpec = rate
        self.rate: Rate | None = None
        self.timeout: float | None = None
        self.burst: int | None = None
        self.extra = ""  # the script's per-policy "extra" argument, where the algorithm has one
        self._rate_callable: Callable[..., str | None] | None = None
        # The rates of the plans (REDISLUA["PLANS"]) that name this policy (None: no plan
        # does): plan name -> rate, or None for unlimited. The request layer decides a request
        # at its plan's rate, or at the policy's own when its plan does not name it.
        self.plans: dict[str, str | None] | None = None
        # A calendar policy's timezone: None (the project's TIME_ZONE, read per decision), a
        # tzinfo, or a callable (request) -> zone that the Django layers resolve per request
        # (see in_zone).
        self.zone: tzinfo | None = None
        self._zone_callable: Callable[..., object] | None = None
        # The bounds a decision sent last, for the period they hold: (start, end, text). A
        # policy whose rate or zone differs is another object, with nothing kept (_derived,
        # _zoned); one in the project's TIME_ZONE forgets them when that changes.
        self._calendar_kept: tuple[int, int, str] = NOTHING_KEPT
        # (settings generation, "<KEY_PREFIX>:<name>:<code>:{", "<KEY_PREFIX>:ov:{"): see
        # redis_key and redis_keys
        self._key_head: tuple[int, str, str] = (-1, "", "")
        # The engine's cache of what a single check sends (engine._single_call).
        self._single_call: tuple[int, Any, tuple[Any, ...]] = (-1, None, ())

        if timezone is not None:
            self._set_zone(timezone)
        if algorithm == "concurrency":
            if limit is None:
                raise PolicyError(
                    "redislua.E010", f"policy {name!r}: a concurrency policy needs `limit`"
                )
            self.limit = positive_int(limit, "redislua.E010", f"policy {name!r}: limit")
            if self.cost != 1:
                raise PolicyError(
                    "redislua.E010", f"policy {name!r}: a concurrency slot costs 1, not {cost}"
                )
            try:
                self.timeout = parse_duration(
                    DEFAULT_CONCURRENCY_TIMEOUT if timeout is None else timeout
                )
            except RateError as exc:
                raise PolicyError("redislua.E009", f"policy {name!r}: timeout: {exc}") from None
            self.param = round(self.timeout * 1_000_000)
            return
        if limit is not None:
            raise PolicyError(
                "redislua.E010", f"policy {name!r}: `limit` is for concurrency policies; use `rate`"
            )
        if burst is not None:
            if algorithm not in BUCKET_ALGORITHMS:
                raise PolicyError(
                    "redislua.E007",
                    f"policy {name!r}: `burst` applies to {', '.join(sorted(BUCKET_ALGORITHMS))}, "
                    f"not {algorithm}",
                )
            self.burst = positive_int(burst, "redislua.E007", f"policy {name!r}: burst")
        if rate is None:
            raise PolicyError("redislua.E006", f"policy {name!r}: `rate` is required, e.g. '10/m'")
        if isinstance(rate, str) and "/" in rate:
            try:
                self._set_rate(parse_rate(rate))
            except RateError as exc:
                raise PolicyError("redislua.E006", f"policy {name!r}: {exc}") from None
        elif isinstance(rate, str) and not DOTTED_PATH.fullmatch(rate):
            raise PolicyError(
                "redislua.E006",
                f"policy {name!r}: rate {rate!r} is not a rate (nor the dotted path of a rate "
                f"callable): write \"N/unit\" such as \"5/m\", \"100/10s\" or \"1000/day\"",
            )
        else:
            self._rate_callable = resolve_callable(rate, "redislua.E006", f"policy {name!r}: rate")
            self.limit = 0
            self.param = 0
            if fallback_rate is not None:
                self.fallback_rate = fallback_rate
                _derived(self, fallback_rate)  # a PolicyError (E006) now, not per request
            return
        if fallback_rate is not None:
            raise PolicyError(
                "redislua.E006",
                f"policy {name!r}: fallback_rate is the rate a rate callable's mistake falls back "
                "to; this policy's rate is not a callable",
            )
        if (self.count_failures is not None and algorithm in WINDOW_ALGORITHMS
                and self.param < MIN_REFUND_PERIOD_US):
            # A refund finds its hit's window within half a period (ratelimit_refund.lua).
            raise PolicyError(
                "redislua.E030",
                f"policy {name!r}: count_failures needs a period of at least 1 s with "
                f"{algorithm}, not {rate}",
            )

    def _set_rate(self, rate: Rate, *, fixed: bool = True) -> None:
        """``fixed``: the rate is the policy's own (a cost above it is a mistake), not one a
        rate callable returned for one request (then it is a denial)."""
        if self.algorithm == CALENDAR and rate.calendar is None:
            raise PolicyError(
                "redislua.E006", f"policy {self.name!r}: a calendar quota counts per hour, day, "
                f"week or month (\"10000/month\", \"1000/day\"), not per {rate}")
        if self.algorithm != CALENDAR and rate.calendar == "month":
            raise PolicyError(
                "redislua.E006", f"policy {self.name!r}: months differ in length, so "
                f"{self.algorithm} cannot count per month; use algorithm 'calendar' for a quota "
                "reset on the 1st, or a rolling '30d'")
        self.rate = rate
        if rate.count == 0:  # denies everything, decided without Redis (see engine._doomed)
            self.limit, self.param = 0, rate.period_us
            return
        self._set_limit(rate)
        if fixed:
            check_cost(self, self.cost)

    def _set_zone(self, spec: object) -> None:
        what = f"policy {self.name!r}: timezone"
        if self.algorithm != CALENDAR:
            raise PolicyError("redislua.E033", f"{what} is for calendar policies (algorithm "
                              f"'calendar'); a {self.algorithm} policy counts rolling time")
        if callable(spec) or (isinstance(spec, str) and DOTTED_PATH.fullmatch(spec)):
            self._zone_callable = resolve_callable(spec, "redislua.E033", what)
            return
        try:
            self.zone = zone_of(spec)
        except ValueError as exc:
            raise PolicyError("redislua.E033", f"{what}: {exc}") from None

    def calendar_zone(self) -> tzinfo:
        """The timezone a calendar policy's periods are in: its own, else the project's
        ``TIME_ZONE``. A zone callable must have been resolved (see :meth:`in_zone`)."""
        if self.zone is not None:
            return self.zone
        if self._zone_callable is not None:
            raise PolicyError(
                "redislua.E033", f"policy {self.name!r} has a timezone callable; resolve it "
                "with policy.in_zone()")
        return default_zone()

    def calendar_bounds(self, at_us: int | None = None) -> str:
        """What a decision of this calendar policy sends as its extra: the boundaries of its
        periods around ``at_us`` (the decision's clock reading, or a test's time), else around
        this process's clock (:func:`calendar.bounds`). Every decision of the policy asks: the
        answer is kept on the policy for the period it holds (``engine._One`` reads it inline)."""
        now = calendar.now_us() if at_us is None else at_us
        kept = self._calendar_kept
        if kept[0] <= now < kept[1]:
            return kept[2]
        assert self.rate is not None and self.rate.calendar is not None
        zone = self.calendar_zone()
        start, end, text = calendar.bounds_of(self.rate.calendar, zone, now)
        if self.zone is None:
            _in_default_zone.add(self)
        self._calendar_kept = (start, end, text)
        return text

    @property
    def zone_callable_name(self) -> str:
        """The timezone callable's dotted name, for log lines."""
        spec = self._zone_callable
        return f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"

    def in_zone(self, zone: object) -> Self:
        """This calendar policy with its periods in ``zone`` (a name, a ZoneInfo; None: the
        project's ``TIME_ZONE``): same name, same keys. ValueError for what is no timezone."""
        zoned: Self = _zoned(self, None if zone is None else zone_of(zone))
        return zoned

    def zoned_for(self, *args: Any) -> Self:
        """This policy in the timezone its timezone callable gives for ``args`` (a request);
        itself when it has none. A mistake of the callable (it raised, or gave what is no
        timezone) raises :class:`ZoneCallableError`, which carries the policy in the project's
        ``TIME_ZONE`` to decide with instead (a quota is never lifted by it)."""
        if self._zone_callable is None:
            return self
        try:
            zone = self._zone_callable(*args)
        except Exception as exc:  # the callable is the user's code: any mistake of it
            raise ZoneCallableError(self, f"raised {type(exc).__name__}: {str(exc)[:200]}"
                                    ) from exc
        try:
            return self.in_zone(zone)
        except ValueError as exc:
            raise ZoneCallableError(self, f"returned {zone!r:.80} ({exc})") from None

    def _set_limit(self, rate: Rate) -> None:
        if self.algorithm == CALENDAR:
            if rate.count > MAX_CALENDAR_LIMIT:
                raise PolicyError(
                    "redislua.E006", f"policy {self.name!r}: a calendar quota counts up to "
                    f"{MAX_CALENDAR_LIMIT:,}, not {rate.count:,}")
            self.limit, self.param = rate.count, rate.period_us
            return
        if self.algorithm in WINDOW_ALGORITHMS:
            self.limit = rate.count
            self.param = rate.period_us
        else:
            self.limit = self.burst if self.burst is not None else rate.count
            # The interval between requests is exactly P / Q microseconds (the period over the
            # count, reduced): the scripts count in 1/Q us, so 10^7/s is 1/10 us, not 1 us.
            shared = math.gcd(rate.period_us, rate.count)
            self.param, q = rate.period_us // shared, rate.count // shared
            self.extra = str(q)
            if self.limit * self.param > MAX_EXACT // 4:
                raise PolicyError(
                    "redislua.E007",
                    f"policy {self.name!r}: a burst of {self.limit} at {rate} is beyond what the "
                    "bucket can count exactly; use a smaller burst or a rate that divides its "
                    "period evenly",
                )

    def __repr__(self) -> str:
        what = self.rate or self.rate_spec if self.algorithm != "concurrency" else self.limit
        shadow = " shadow" if self.shadow else ""
        return f"<Policy {self.name} {self.algorithm} {what}{shadow}>"

    @property
    def interval_us(self) -> float:
        """Microseconds between two requests at the policy's rate (buckets); the period for the
        window algorithms, the lease timeout for concurrency."""
        if self.code in ("tb", "lb", "gc") and self.extra:
            return self.param / int(self.extra)
        return float(self.param)

    @property
    def is_dynamic(self) -> bool:
        """True when the rate is resolved per request (see :meth:`with_rate`): a callable's, or
        the request's plan's (REDISLUA["PLANS"])."""
        return self._rate_callable is not None or self.plans is not None

    def rate_for(self, *args: Any) -> str | None:
        """Call the rate callable (dynamic policies) or return the fixed rate string."""
        if self._rate_callable is None:
            return str(self.rate_spec) if self.algorithm != "concurrency" else None
        return self._rate_callable(*args)

    def resolved_for(self, *args: Any) -> Self | None:
        """This policy at the rate its callable gives for ``args`` (a request): None when the
        callable says unlimited (None). A mistake of the callable (it raised, or gave
        something that is not a rate) raises :class:`RateCallableError` carrying the policy
        at ``fallback_rate``, or None without one (the request layer then answers 503: never
        unlimited)."""
        try:
            rate = self.rate_for(*args)
        except Exception as exc:  # the callable is the user's code: any mistake of it
            what = f"raised {type(exc).__name__}: {str(exc)[:200]}"
            raise RateCallableError(self, what) from exc
        if rate is None:
            return None
        try:
            if not isinstance(rate, str):
                raise RateError("not a string")
            return self.with_rate(rate)
        except (RateError, PolicyError) as exc:
            what = f"returned {rate!r:.80}, which is not a rate (\"N/unit\") or None ({exc})"
            raise RateCallableError(self, what) from None

    @property
    def callable_name(self) -> str:
        """The rate callable's dotted name, for log lines."""
        spec = self.rate_spec
        if isinstance(spec, str):
            return spec
        return f"{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"

    def with_rate(self, rate: str) -> Self:
        """This policy with a concrete rate (cached per rate string); same name, same keys."""
        derived: Self = _derived(self, rate)  # of this policy's own class (see _derived)
        return derived

    def on_plan(self, plan: str, rate: str) -> Self:
        """This policy at ``rate``, the rate of the plan ``plan`` (or its own, when the plan
        does not name it): decided like :meth:`with_rate`, and keeping the rate with the
        plan's name beside each identity's state, for the admin."""
        derived: Self = _derived(self, rate, plan)
        return derived

    def redis_key(self, identity: str | bytes | int, prefix: str | None = None) -> str:
        """The key holding this policy's state for ``identity``.

        The identity is the hash tag, so one identity's keys share a cluster slot.
        """
        if prefix is not None:
            return f"{prefix}:{self.name}:{self.code}:{{{bound_identity(identity)}}}"
        return self._heads()[1] + bound_identity(identity) + "}"

    def tag_key(self, tag: str) -> str:
        """The state key of the identity whose hash tag (:func:`bound_identity`) is ``tag``."""
        return self._heads()[1] + tag + "}"

    def redis_keys(self, identity: str | bytes | int) -> tuple[str, str]:
        """The key of this policy's state for ``identity`` and the key of ``identity``'s
        overrides (:mod:`django_redislua.overrides`): one hash tag, so one cluster slot."""
        head = self._heads()
        bound = bound_identity(identity)
        return head[1] + bound + "}", head[2] + bound + "}"

    def rate_key(self, tag: str) -> str:
        """The key keeping the rate this policy's rate callable last gave the identity whose
        hash tag (:func:`bound_identity`) is ``tag``: ``<KEY_PREFIX>:<name>:rt:{<tag>}``, in
        the slot of its state. Written by the decision scripts (see ratelimit.lua)."""
        head = self._rate_head
        if head[0] != conf.generation:
            head = self._rate_head = (
                conf.generation, f"{settings.KEY_PREFIX}:{self.name}:{RATE_KEPT}:{{")
        return head[1] + tag + "}"

    def _heads(self) -> tuple[int, str, str]:
        head = self._key_head  # every decision builds a key: the head is built once per settings
        if head[0] != conf.generation:
            generation = conf.generation  # read first: a change while building makes it stale
            prefix = settings.KEY_PREFIX
            head = self._key_head = (
                generation, f"{prefix}:{self.name}:{self.code}:{{", f"{prefix}:{OVERRIDES}:{{")
        return head


_default_zone: list[tzinfo] = []  # the project's TIME_ZONE, read once (until it changes)
# Calendar policies that kept periods of the project's TIME_ZONE: they forget them when it changes.
_in_default_zone: weakref.WeakSet[PolicyDefinition] = weakref.WeakSet()
NOTHING_KEPT = (0, 0, "")


def default_zone() -> tzinfo:
    """The project's ``TIME_ZONE`` (UTC when unset), where calendar periods are by default."""
    if not _default_zone:
        _default_zone.append(zone_of(getattr(django_settings, "TIME_ZONE", None) or "UTC"))
    return _default_zone[0]


@receiver(setting_changed)
def _time_zone_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "TIME_ZONE":
        _default_zone.clear()
        for policy in list(_in_default_zone):
            policy._calendar_kept = NOTHING_KEPT


@functools.lru_cache(maxsize=4096)
def _zoned(policy: D, zone: tzinfo | None) -> D:
    zoned = type(policy).__new__(type(policy))
    zoned.__dict__.update(policy.__dict__)
    zoned._zone_callable = None
    zoned.zone = zone
    zoned._calendar_kept = NOTHING_KEPT
    return zoned


class ZoneCallableError(PolicyError):
    """A calendar policy's timezone callable made a mistake for one request: the request is
    decided in the project's ``TIME_ZONE`` instead (``fallback``), and the mistake logged."""

    def __init__(self, policy: PolicyDefinition, what: str) -> None:
        super().__init__(
            "redislua.E033",
            f"policy {policy.name!r}: its timezone callable {policy.zone_callable_name} {what}; "
            "its requests are decided in the project's TIME_ZONE",
        )
        self.policy = policy
        self.fallback = policy.in_zone(None)


class RateCallableError(PolicyError):
    """A policy's rate callable made a mistake for one request (it raised, or returned what is
    not a rate). ``fallback`` is the policy at its ``fallback_rate``, or None."""

    def __init__(self, policy: PolicyDefinition, what: str) -> None:
        fallback = policy.with_rate(policy.fallback_rate) if policy.fallback_rate else None
        then = (f"decided at its fallback_rate {policy.fallback_rate!r}" if fallback is not None
                else "answered 503 (set the policy's fallback_rate to decide at a rate instead)")
        super().__init__(
            "redislua.E006",
            f"policy {policy.name!r}: its rate callable {policy.callable_name} {what}; "
            f"requests it covers are {then}",
        )
        self.policy = policy
        self.fallback = fallback


def check_cost(policy: PolicyDefinition, cost: int) -> None:
    """A fixed cost above a fixed, non-zero capacity could never be admitted: redislua.E010.

    (A rate callable's rate is known per request only: a cost above it is then a denial that
    no wait can lift, not an error.)"""
    if policy.rate is not None and 0 < policy.limit < cost and not policy.is_dynamic:
        raise PolicyError(
            "redislua.E010",
            f"policy {policy.name!r}: cost {cost} is above its capacity {policy.limit}, so no "
            "request could ever be admitted",
        )


@functools.lru_cache(maxsize=1024)
def _derived(policy: D, rate: str, plan: str = "") -> D:
    derived = type(policy).__new__(type(policy))
    derived.__dict__.update(policy.__dict__)
    derived._rate_callable = None
    derived._calendar_kept = NOTHING_KEPT  # its rate may count another period
    derived.plans = None
    derived.rate_spec = rate
    try:
        derived._set_rate(parse_rate(rate), fixed=False)
    except RateError as exc:
        raise PolicyError("redislua.E006", f"policy {policy.name!r}: {exc}") from None
    if policy.is_dynamic or policy.keeps_rate:
        # The admin cannot know a rate its callable gives per request: each decision that
        # consumes keeps it beside the identity's state (ratelimit.lua). A fixed-rate policy's
        # with_rate (tests, overrides' set_rate) sends nothing more.
        derived.keeps_rate = True
        shown = f"{derived.rate} ({plan})" if plan else str(derived.rate)
        derived.rate_record = (f"{derived.code}|{derived.limit}|{derived.param}|{derived.extra}"
                               f"|{shown[:MAX_RATE_TEXT]}")
        derived._single_call = (-1, None, ())  # its command has one key more (engine._One)
    return derived
