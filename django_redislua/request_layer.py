"""The request layer shared by the decorator, the middleware, the DRF throttles and compat.

It turns rules (a policy, a key function, a method filter) into engine checks for one request,
decides them in ONE script call, and answers: the view runs, a 429 (``DENIED_VIEW``), or a 503
(the answers themselves are :mod:`django_redislua.responses`').
:func:`deciding` is the one path every layer decides by: the checks, the failure and recovery
log lines and metrics, the records on the request, the ``rate_limited`` signal. What a layer
does differently is an argument of it (a DRF throttle's ``timer``; compat's django-ratelimit
reading of its counter, its ``RATELIMIT_FAIL_OPEN``), never a copy of it.
It holds the one FAIL_OPEN guard, which knows every way the Redis client can fail
(:data:`~django_redislua.connection.CLIENT_ERRORS`) and every way a rule can be unusable
(a :class:`~django_redislua.limiting.PolicyError`: an unknown policy name, a broken policy in
settings). Both follow ``REDISLUA["FAIL_OPEN"]``: the rule is skipped (and logged) or the
request is answered 503. A rate callable's mistake (it raised, or returned what is not a rate)
is not a Redis failure and never makes a limit unlimited: the request is decided at the
policy's ``fallback_rate``, or answered 503 (logged with the policy, the callable and what it
did). Configuration mistakes are reported at start-up by the system checks; this is what a
request meets when a deployment ignored them. Nothing here answers 500.

A ``count_failures`` policy (a login's) is decided before the view like any other; once the
response is made, the hit of a request whose response is not a failure (:func:`failed`) is
given back (:mod:`~django_redislua.limiting.refund`), in one more round trip for the request.
A view that raises keeps every hit; so does a refund Redis fails (logged: one more failure
counted, the safe side, and the response goes out as it is).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from django.http import HttpRequest, HttpResponseBase

from django_redislua import metrics
from django_redislua.atransport import arun
from django_redislua.conf import settings
from django_redislua.connection import CLIENT_ERRORS
from django_redislua.keys import KeyFunc, key_function, normalized
from django_redislua.limiting.decision import Decision, PolicyError, RateLimited, allowed_of
from django_redislua.limiting.definition import (
    PolicyDefinition,
    RateCallableError,
    ZoneCallableError,
    check_cost,
)
from django_redislua.limiting.engine import (
    Check,
    PartlyDecided,
    evaluation,
    metric_result,
)
from django_redislua.limiting.engine import adecide as adecide_check
from django_redislua.limiting.engine import decide as decide_check
from django_redislua.limiting.policy import Policy
from django_redislua.limiting.refund import Refund, refunds_of
from django_redislua.limiting.registry import get_policy
from django_redislua.plans import planned
from django_redislua.protocol import Invoke, Protocol
from django_redislua.reporting import (
    report_broken,
    report_outage,
    report_rate_callable,
    report_recovery,
    report_shadow_denial,
)
from django_redislua.responses import (
    add_headers,
    denying,
    on_close,
    refunding_unless_failed,
    release_all,
    releasing_all,
    unavailable_response,
)
from django_redislua.signals import rate_limited
from django_redislua.transport import run


# -- rules ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """What one ``@ratelimit`` (or middleware entry, or policy throttle) checks."""

    policy: Policy
    key: KeyFunc
    methods: frozenset[str] | None
    cost: int
    block: bool

    def check(self, request: HttpRequest) -> Check | None:
        """The engine check for ``request``, or None when this rule does not apply to it.

        A rate callable's mistake is logged here and decided at the policy's ``fallback_rate``
        (without one: :class:`RateCallableError`, a 503); a timezone callable's, in TIME_ZONE.
        """
        if self.methods is not None and request.method not in self.methods:
            return None
        policy: PolicyDefinition = self.policy
        if policy.plans is not None:  # a plan names it: the rate of the request's plan
            planned_policy = planned(policy, request)
            if planned_policy is None:  # the plan says: unlimited
                return None
            policy = planned_policy
        elif policy._rate_callable is not None:  # dynamic (no plan: checked above)
            try:
                resolved = policy.resolved_for(request)
            except RateCallableError as exc:
                report_rate_callable(exc)
                if exc.fallback is None:
                    raise
                resolved = exc.fallback
            if resolved is None:  # the rate callable says: unlimited (e.g. for staff)
                return None
            policy = resolved
        if policy._zone_callable is not None:  # a calendar quota in the identity's timezone
            try:
                policy = policy.zoned_for(request)
            except ZoneCallableError as exc:
                report_rate_callable(exc, "timezone")
                policy = exc.fallback
        identity: str | bytes | int | None = self.key(request)
        if identity is None:  # the key callable says: not limited
            return None
        if policy.normalize:
            identity = normalized(identity)
        return (policy, identity, self.cost)


RuleOrError = Rule | PolicyError


def rule_for_policy(policy: Policy, **overrides: Any) -> Rule:
    """A Rule for a configured policy; ``key``/``methods``/``block``/``cost`` may be overridden.

    PolicyError (redislua.E008) when the key is not a key.
    """
    methods = overrides.get("methods", policy.methods)
    if methods is not None and not isinstance(methods, frozenset):
        methods = frozenset(m.upper() for m in ([methods] if isinstance(methods, str) else methods))
    cost = int(overrides.get("cost", policy.cost))
    check_cost(policy, cost)
    return Rule(
        policy=policy,
        key=key_function(overrides.get("key", policy.key)),
        methods=methods,
        cost=cost,
        block=bool(overrides.get("block", policy.block)),
    )


def resolve_rule(build: Callable[[], Rule]) -> RuleOrError:
    """``build()``, or the PolicyError saying why the rule cannot be used."""
    try:
        return build()
    except PolicyError as exc:
        return exc


def rule_for_name(name: str, **overrides: Any) -> RuleOrError:
    """The Rule of the configured policy ``name``, or why it cannot be used."""
    return resolve_rule(lambda: rule_for_policy(get_policy(name), **overrides))


# -- deciding (with the FAIL_OPEN guard) ---------------------------------------------------------
class Outcome(NamedTuple):
    """The result of deciding a request's rules (a named tuple: one is built per request)."""

    rules: tuple[Rule, ...]  # the rules of ``decisions``, pair by pair
    decisions: tuple[Decision, ...]  # the enforced Decisions: what the response answers by
    unavailable: bool = False  # Redis failed (or a rule is broken) and FAIL_OPEN is False: 503
    # Every Decision holding a concurrency slot, shadow and block=False ones too: released when
    # the response is done, or at once when the request is refused.
    held: tuple[Decision, ...] = ()
    # Every hit a count_failures policy took (shadow and block=False ones too): given back once
    # the response is made, unless it is a failure.
    refunds: tuple[Refund, ...] = ()
    # Every Decision made, one per check decided (shadow ones too), in the rules' order.
    made: tuple[Decision, ...] = ()

    @property
    def blocked(self) -> bool:
        if all(map(allowed_of, self.decisions)):  # the common case, without a Python loop
            return False
        pairs = zip(self.rules, self.decisions, strict=True)
        return any(not decision.allowed and rule.block for rule, decision in pairs)

    @property
    def plain(self) -> bool:
        """The view simply runs: nothing refused, no slot to give back, no hit to refund (the
        lean drivers, :func:`guard` and :func:`aguard`, then need no protocol)."""
        return not (self.unavailable or self.held or self.refunds or self.blocked)


UNAVAILABLE = Outcome((), (), unavailable=True)
NOTHING = Outcome((), ())  # REDISLUA["ENABLED"] is False: nothing decided, nothing recorded


def checks_for(
    request: HttpRequest, rules: Iterable[RuleOrError]
) -> tuple[list[Rule], list[Check], bool]:
    """The rules that apply, their checks, and whether the request must be answered 503: a
    rule is unusable (logged here) and ``FAIL_OPEN`` is False, or a rate callable made a
    mistake with no ``fallback_rate`` to decide at (whatever ``FAIL_OPEN`` says: a broken rate
    callable never makes a limit silently unlimited). A shadow rule never refuses a request."""
    applied, checks, refuse = [], [], False
    for rule in rules:
        if not isinstance(rule, PolicyError):
            try:
                check = rule.check(request)
            except RateCallableError:  # logged by Rule.check
                refuse = refuse or not rule.policy.shadow
            except PolicyError as exc:
                report_broken(exc)
                refuse = refuse or (not rule.policy.shadow and not settings.FAIL_OPEN)
            else:
                if check is not None:
                    applied.append(rule)
                    checks.append(check)
            continue
        report_broken(rule)
        refuse = refuse or not settings.FAIL_OPEN
    return applied, checks, refuse


def soft_indexes(rules: Sequence[Rule]) -> frozenset[int]:
    """Indexes of the rules that never gate the others: those that do not block
    (``block=False``), and shadow policies (enforcing nothing, they must change nothing)."""
    return frozenset(i for i, rule in enumerate(rules) if not rule.block or rule.policy.shadow)


def record_shadow(request: HttpRequest, decisions: Sequence[Decision]) -> None:
    """Keep shadow Decisions on ``request.ratelimit_shadow`` and log their denials (sampled:
    one line per policy a minute, with how many were held back)."""
    shadow = [d for d in decisions if d.policy.shadow]
    if not shadow:
        return
    previous = getattr(request, "ratelimit_shadow", None)
    request.ratelimit_shadow = [*(previous or []), *shadow]  # type: ignore[attr-defined]
    for decision in shadow:
        if not decision.allowed:
            report_shadow_denial(decision)


def _outcome(rules: Sequence[Rule], decisions: Sequence[Decision | None]) -> Outcome:
    """What ``decisions`` (one per rule; None: left undecided, Redis failed) come to. The
    Outcome blocks on enforced Decisions only; a shadow policy's never does."""
    if len(decisions) == 1 and decisions[0] is not None:  # a request's common case, unrolled
        only = decisions[0]
        one = (only,)
        enforced = not only.policy.shadow
        return Outcome(tuple(rules) if enforced else (), one if enforced else (), False,
                       one if only.lease is not None else (), refunds_of(one), one)
    made: list[Decision] = []
    paired: list[Rule] = []
    shown: list[Decision] = []
    for rule, decision in zip(rules, decisions, strict=True):
        if decision is not None:
            made.append(decision)
            if not decision.policy.shadow:
                paired.append(rule)
                shown.append(decision)
    return Outcome(tuple(paired), tuple(shown), False,
                   tuple(d for d in made if d.lease is not None), refunds_of(made), tuple(made))


def _record(request: HttpRequest, outcome: Outcome) -> None:
    """Put the enforced Decisions on ``request.ratelimit`` (and ``request.limited``), the
    shadow ones on ``request.ratelimit_shadow``, after those earlier layers put there."""
    if len(outcome.made) != len(outcome.decisions):  # made beyond the enforced: shadow ones
        record_shadow(request, outcome.made)
    previous = getattr(request, "ratelimit", None)
    request.ratelimit = [*(previous or []), *outcome.decisions]  # type: ignore[attr-defined]
    limited = not all(map(allowed_of, outcome.decisions))
    request.limited = getattr(request, "limited", False) or limited  # type: ignore[attr-defined]


def count_failure(checks: Iterable[Check], fail_open: bool) -> None:
    """Redis failed for ``checks``: count each as failed_open (admitted) or unavailable."""
    result = metrics.FAILED_OPEN if fail_open else metrics.UNAVAILABLE
    seen: set[str] = set()
    for policy, identity, _cost in checks:
        key = policy.redis_key(identity)  # two rules on one policy and identity: one check
        if key not in seen:
            seen.add(key)
            metrics.decision(policy.name, policy.algorithm, result)


def report_failure(checks: Sequence[Check], exc: BaseException, *,
                   fail_open: Callable[[], bool] | None = None,
                   refused_as: str = "answered 503", counted: bool = True) -> bool:
    """Redis failed for ``checks``: log it (once a minute), count the checks left undecided
    (unless not ``counted``: a peek), and say whether the request is admitted: when
    ``fail_open()`` says so (default: ``FAIL_OPEN``), or when only shadow rules were asked
    (they must never refuse a request, not even with 503); never when a rule was already
    denied without Redis (:class:`PartlyDecided`, whose known Decisions the engine counted),
    nor are those undecided checks admitted then."""
    if isinstance(exc, PartlyDecided):
        report_outage(exc)
        if counted:
            count_failure([c for c, d in zip(checks, exc.known, strict=True) if d is None], False)
        return False
    admit = (settings.FAIL_OPEN if fail_open is None else fail_open()) or all(
        policy.shadow for policy, _identity, _cost in checks)
    report_outage(exc, fail_open=admit, denied_as=refused_as)
    if counted:
        count_failure(checks, admit)
    return admit


def _read(decisions: Sequence[Decision | None], read: Callable[[Decision], Decision],
          counted: bool) -> list[Decision | None]:
    """``read`` of each Decision made, counted in the metrics under the policy asked."""
    seen = [None if d is None else read(d) for d in decisions]
    if counted:
        for asked, decision in zip(decisions, seen, strict=True):
            if asked is not None and decision is not None:
                metrics.decision(asked.policy.name, asked.policy.algorithm,
                                 metric_result(decision))
    return seen


def signalling(request: HttpRequest, decisions: Iterable[Decision], sender: Any
               ) -> Protocol[None]:
    """Send ``rate_limited`` from ``sender`` for each denial among ``decisions`` (on the
    asyncio driver with ``asend``: async receivers are awaited, sync ones run in a thread)."""
    for decision in decisions:
        if not decision.allowed:
            yield Invoke(functools.partial(rate_limited.send, sender, request=request,
                                           decision=decision),
                         asynchronous=functools.partial(rate_limited.asend, sender, request=request,
                                                        decision=decision))


def deciding(
    request: HttpRequest, rules: Iterable[RuleOrError], sender: Any, *,
    now_us: int | None = None, peek: bool = False,
    read: Callable[[Decision], Decision] | None = None, record: bool = True,
    fail_open: Callable[[], bool] | None = None, refused_as: str = "answered 503",
) -> Protocol[Outcome]:
    """Decide ``rules`` for ``request``: the one path of the decorator, the middleware, the DRF
    throttles and compat.

    Nothing at all when ``ENABLED`` is False (no key function runs, Redis is not asked); 503
    (``Outcome.unavailable``) when a rule cannot be used (:func:`checks_for`). Otherwise the
    checks of the rules that apply are decided in ONE script call (none when no rule applies).
    Redis failing is reported (:func:`report_failure`): the request is admitted with nothing
    decided, or answered 503, or refused by what was decided without Redis; an answer after
    an outage says, once, that limits apply again. The Decisions are put on the request, then
    ``rate_limited`` is sent from ``sender`` for each denial (shadow ones too).

    What differs between the callers is said by keyword:

    - ``now_us``: the time the scripts decide at instead of the Redis clock (a DRF throttle's
      own ``timer``);
    - ``peek``: look, consume nothing; nothing is signalled or counted in the metrics
      (compat's ``increment=False``);
    - ``read``: the caller's own reading of each Decision the engine made (compat's
      django-ratelimit ``count > limit``): the read Decisions are the Outcome's, the ones
      signalled and the ones counted in the metrics, under the policy asked, instead of the
      engine's;
    - ``record=False``: nothing is put on the request (compat: django-ratelimit's
      ``is_ratelimited`` sets no attribute);
    - ``fail_open``: whether a request Redis could not decide is admitted, instead of
      ``FAIL_OPEN`` (compat: ``RATELIMIT_FAIL_OPEN``); ``refused_as``: what a request that is
      not admitted gets, for the log line.
    """
    applying = _applying(request, rules)
    if isinstance(applying, Outcome):
        return applying
    return (yield from _deciding_checks(
        request, *applying, sender, now_us=now_us, peek=peek, read=read, record=record,
        fail_open=fail_open, refused_as=refused_as))


def _deciding_checks(
    request: HttpRequest, applied: list[Rule], checks: list[Check], sender: Any, *,
    now_us: int | None = None, peek: bool = False,
    read: Callable[[Decision], Decision] | None = None, record: bool = True,
    fail_open: Callable[[], bool] | None = None, refused_as: str = "answered 503",
) -> Protocol[Outcome]:
    """:func:`deciding` once the rules that apply and their checks are known."""
    decisions: Sequence[Decision | None] = ()
    if checks:
        sinks = () if peek or read is not None else metrics.sinks()
        try:
            # One check gates nothing but itself: its rule's softness changes nothing.
            soft = soft_indexes(applied) if len(checks) > 1 else frozenset()
            decisions = yield from evaluation(checks, peek, now_us, soft, sinks)
        except CLIENT_ERRORS as exc:
            undecided = _undecided(checks, exc, fail_open=fail_open, refused_as=refused_as,
                                   peek=peek)
            if undecided is None:
                return UNAVAILABLE
            decisions = undecided
        else:
            report_recovery()
        if read is not None:
            decisions = _read(decisions, read, counted=not peek)
    outcome = _concluded(request, applied, decisions, record)
    if not peek:
        yield from signalling(request, outcome.made, sender)
    return outcome


def _applying(request: HttpRequest, rules: Iterable[RuleOrError]
              ) -> Outcome | tuple[list[Rule], list[Check]]:
    """:func:`deciding`'s start: the rules that apply and their checks, or the Outcome when
    nothing is to be decided (``ENABLED`` is False) or the request is answered 503."""
    if not settings.ENABLED:
        return NOTHING
    applied, checks, refuse = checks_for(request, rules)
    if refuse:
        return UNAVAILABLE
    return applied, checks


def _undecided(checks: Sequence[Check], exc: BaseException, *,
               fail_open: Callable[[], bool] | None = None,
               refused_as: str = "answered 503", peek: bool = False
               ) -> Sequence[Decision | None] | None:
    """Redis failed deciding ``checks``: reported (:func:`report_failure`); the Decisions the
    request goes on with (none made: admitted; those made without Redis: refused by them), or
    None: answered 503."""
    admit = report_failure(checks, exc, fail_open=fail_open, refused_as=refused_as,
                           counted=not peek)
    if isinstance(exc, PartlyDecided):  # refused anyway, by a check decided without Redis
        return exc.known
    return [None] * len(checks) if admit else None


def _concluded(request: HttpRequest, applied: Sequence[Rule],
               decisions: Sequence[Decision | None], record: bool = True) -> Outcome:
    outcome = _outcome(applied, decisions)
    if record:
        _record(request, outcome)
    return outcome


def decide(request: HttpRequest, rules: Iterable[RuleOrError], sender: Any, *,
           now_us: int | None = None) -> Outcome:
    """:func:`deciding` on the sync driver. One check (a request's common case) is decided
    without the protocol loop (the engine's ``decide``, as ``Policy.hit`` is); the steps
    around it are :func:`deciding`'s own functions, and a denial's signal its protocol."""
    applying = _applying(request, rules)
    if isinstance(applying, Outcome):
        return applying
    applied, checks = applying
    if len(checks) != 1:
        return run(_deciding_checks(request, applied, checks, sender, now_us=now_us))
    made: Decision | BaseException
    try:
        made = decide_check(*checks[0], now_us=now_us)
    except CLIENT_ERRORS as exc:
        made = exc
    outcome = _single_concluded(request, applied, checks, made)
    # signalling sends for denials only: an allowed request (the hot path) skips its protocol.
    if not all(map(allowed_of, outcome.made)):
        run(signalling(request, outcome.made, sender))
    return outcome


def _single_concluded(request: HttpRequest, applied: Sequence[Rule], checks: Sequence[Check],
                      made: Decision | BaseException) -> Outcome:
    """The Outcome of a request's single check, decided (``made``) or failed (Redis's error):
    :func:`_deciding_checks`'s own steps around it, for the lean drivers."""
    decisions: Sequence[Decision | None]
    if isinstance(made, BaseException):
        undecided = _undecided(checks, made)
        if undecided is None:
            return UNAVAILABLE
        decisions = undecided
    else:
        report_recovery()
        decisions = [made]
    return _concluded(request, applied, decisions)


def adecide(request: HttpRequest, rules: Iterable[RuleOrError], sender: Any, *,
            now_us: int | None = None) -> Awaitable[Outcome]:
    """:func:`deciding` on the asyncio driver (no thread hop: the asyncio transport)."""
    return arun(deciding(request, rules, sender, now_us=now_us))


def finishing(response: HttpResponseBase, outcome: Outcome, request: Any = None
              ) -> Protocol[HttpResponseBase]:
    """Headers on an allowed response; the hits of count_failures policies given back unless
    the response is a failure; concurrency slots released when the response is done.

    A streaming response is not done when the view returns: its slots are released by
    ``response.close()``, which the WSGI/ASGI handler calls after the last chunk is sent. (Its
    status is known: its refunds are not delayed.)
    """
    add_headers(response, outcome.decisions, denied=response.status_code == 429)
    if outcome.refunds:
        yield from refunding_unless_failed(request, response, outcome.refunds)
    if outcome.held:
        if response.streaming:
            on_close(response, functools.partial(release_all, outcome.held))
        else:
            yield from releasing_all(outcome.held)
    return response


def guarded(request: HttpRequest, rules: Sequence[RuleOrError], sender: Any,
            view: Callable[[], Any]) -> Protocol[HttpResponseBase]:
    """The request skeleton, once for the decorator, the middleware and compat, sync and
    asyncio: decide ``rules`` (one round trip), then answer 503, 429, or ``view()`` (called,
    and awaited on the asyncio driver) with its headers; every concurrency slot taken is given
    back when the response is done, or at once when the request is refused or the view
    raises; the hits of count_failures policies are given back once the response is made,
    unless it is a failure (a refused request took none but those of ``block=False`` and
    shadow rules, which its 429 decides like any response; a view that raises keeps them)."""
    if not rules:
        return cast(HttpResponseBase, (yield Invoke(view)))
    outcome = yield from deciding(request, rules, sender)
    return (yield from answering(request, outcome, view))


def guard(request: HttpRequest, rules: Sequence[RuleOrError], sender: Any,
          view: Callable[[], HttpResponseBase]) -> HttpResponseBase:
    """:func:`guarded` on the sync driver. A request decided by :func:`decide` whose view
    simply runs (nothing refused, no slot to give back, no hit to refund) runs it and takes
    :func:`finishing`'s headers without the protocol loop; any other answers as
    :func:`answering` says."""
    if not rules:
        return view()
    outcome = decide(request, rules, sender)
    if not outcome.plain:
        return run(answering(request, outcome, view))
    response = view()
    add_headers(response, outcome.decisions, denied=response.status_code == 429)
    return response


async def aguard(request: HttpRequest, rules: Sequence[RuleOrError], sender: Any,
                 view: Callable[[], Awaitable[HttpResponseBase]]) -> HttpResponseBase:
    """:func:`guarded` on the asyncio driver, the twin of :func:`guard`: a request's single
    check is decided by the engine's ``adecide`` (``Policy.ahit``'s path) and a view that
    simply runs is awaited and given its headers without the protocol loop; any other case
    (several checks, a refusal, a slot held, a refund, a denial to signal) goes through the
    same generators as :func:`guarded`."""
    if not rules:
        return await view()
    applying = _applying(request, rules)
    if isinstance(applying, Outcome):
        return await arun(answering(request, applying, view))
    applied, checks = applying
    if len(checks) != 1:
        outcome = await arun(_deciding_checks(request, applied, checks, sender))
        return await arun(answering(request, outcome, view))
    made: Decision | BaseException
    try:
        made = await adecide_check(*checks[0])
    except CLIENT_ERRORS as exc:
        made = exc
    outcome = _single_concluded(request, applied, checks, made)
    if not all(map(allowed_of, outcome.made)):
        await arun(signalling(request, outcome.made, sender))
    if not outcome.plain:
        return await arun(answering(request, outcome, view))
    response = await view()
    add_headers(response, outcome.decisions, denied=response.status_code == 429)
    return response


def answering(request: HttpRequest, outcome: Outcome, view: Callable[[], Any]
              ) -> Protocol[HttpResponseBase]:
    """:func:`guarded`'s answer once ``outcome`` is decided: 503, 429, or ``view()``."""
    if outcome.unavailable:
        return unavailable_response()
    if outcome.blocked:
        yield from releasing_all(outcome.held)
        denied: HttpResponseBase = yield from denying(request, RateLimited(outcome.decisions))
        if outcome.refunds:
            yield from refunding_unless_failed(request, denied, outcome.refunds)
        return denied
    try:
        response = yield Invoke(view)
    except BaseException:
        yield from releasing_all(outcome.held)
        raise
    return (yield from finishing(response, outcome, request))
