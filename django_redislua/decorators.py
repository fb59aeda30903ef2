"""``@ratelimit``: rate limits on Django views, decided in Redis by one script call per request.

A thin layer: it turns a request into ``(policy, identity, cost)`` checks (method filter, key
function, per-request rate) and hands them to :func:`django_redislua.limiting.evaluate`. Every
``@ratelimit`` stacked on one view is decided by the outermost wrapper in ONE call, all-or-nothing;
the inner wrappers find their rules already decided (marked on the request) and step aside.

The request-level helpers here (:func:`decide`, :func:`denied_response`, the FAIL_OPEN handling)
are shared with :mod:`django_redislua.middleware` and :mod:`django_redislua.compat`.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import redis
from asgiref.sync import async_to_sync, iscoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.module_loading import import_string
from django.views import View

from django_redislua.conf import settings
from django_redislua.headers import rate_limit_headers
from django_redislua.keys import KeyFunc, key_function
from django_redislua.limiting import Decision, Policy, RateLimited, aevaluate, evaluate, get_policy
from django_redislua.limiting.engine import Check
from django_redislua.signals import rate_limited

logger = logging.getLogger("django_redislua")

ViewT = TypeVar("ViewT", bound=Callable[..., Any])
# Seconds between two "Redis is unreachable" warnings: an outage must not log once per request.
OUTAGE_LOG_INTERVAL = 60.0
INLINE_OPTIONS = ("rate", "algorithm", "burst", "limit", "timeout")
_STACK_ATTR = "_redislua_stack"
_DONE_ATTR = "_redislua_done"


# -- rules: one @ratelimit, resolved for one view ----------------------------------------------
@dataclass(frozen=True)
class Rule:
    """What one ``@ratelimit`` (or middleware entry) checks: a policy, a key, a method filter."""

    policy: Policy
    key: KeyFunc
    methods: frozenset[str] | None
    cost: int
    block: bool

    def check(self, request: HttpRequest) -> Check | None:
        """The engine check for ``request``, or None when this rule does not apply to it."""
        if self.methods is not None and request.method not in self.methods:
            return None
        policy = self.policy
        if policy.is_dynamic:
            rate = policy.rate_for(request)
            if rate is None:  # the rate callable says: unlimited (e.g. for staff)
                return None
            policy = policy.with_rate(rate)
        identity = self.key(request)
        if identity is None:  # the key says: not limited
            return None
        return (policy, identity, self.cost)


def rule_for_policy(policy: Policy, **overrides: Any) -> Rule:
    """A Rule for a configured policy; ``key``/``methods``/``block``/``cost`` may be overridden."""
    methods = overrides.get("methods", policy.methods)
    if methods is not None and not isinstance(methods, frozenset):
        methods = frozenset(m.upper() for m in ([methods] if isinstance(methods, str) else methods))
    return Rule(
        policy=policy,
        key=key_function(overrides.get("key", policy.key)),
        methods=methods,
        cost=int(overrides.get("cost", policy.cost)),
        block=bool(overrides.get("block", policy.block)),
    )


def _stable_repr(value: Any) -> str:
    """A repr that is the same in every process (callables by dotted name, not address)."""
    if callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(sorted(_stable_repr(v) for v in value))
    return repr(value)


class Spec:
    """The arguments of one ``@ratelimit(...)``; resolved into a :class:`Rule` per request.

    Inline policies are named after the view plus a digest of their options, so two workers
    (or two stacked inline decorators with different rates) agree on the Redis key.
    """

    def __init__(self, policy: str | None, group: str | None, options: dict[str, Any]) -> None:
        self.policy_name = policy
        self.group = group
        self.options = options
        self._inline: dict[str, Policy] = {}
        self._rules: dict[Policy, Rule] = {}
        self._lock = threading.Lock()
        self.digest = hashlib.sha256(
            "|".join(f"{k}={_stable_repr(v)}" for k, v in sorted(options.items())).encode()
        ).hexdigest()[:8]
        rate = options.get("rate")
        if policy is None and not (isinstance(rate, str) and "/" not in rate):
            # Build once now, so a wrong rate or algorithm fails at import time, not per
            # request. A dotted-path rate is left alone: its module may still be importing.
            Policy("redislua.check", **options)

    def rule(self, view_name: str) -> Rule:
        """The Rule for this request (cached per policy object, rebuilt when settings change)."""
        if self.policy_name is not None:
            policy = get_policy(self.policy_name)
            overrides = self.options
        else:
            name = self.group or f"{view_name}:{self.digest}"
            policy = self._inline.get(name)  # type: ignore[assignment]
            if policy is None:
                with self._lock:
                    policy = self._inline.setdefault(name, Policy(name, **self.options))
            overrides = {}
        rule = self._rules.get(policy)
        if rule is None:
            rule = self._rules[policy] = rule_for_policy(policy, **overrides)
        return rule


@dataclass(frozen=True)
class Stack:
    """Every @ratelimit directly stacked on one view; ``view`` is the undecorated callable."""

    specs: tuple[Spec, ...]
    view: Callable[..., Any]
    view_name: str
    owner: object  # the wrapper this stack belongs to (attributes copied by wraps() do not count)


def _own_stack(fn: object) -> Stack | None:
    stack = getattr(fn, _STACK_ATTR, None)
    if isinstance(stack, Stack) and stack.owner is fn:
        return stack
    return None


def _inner_specs(fn: object) -> list[Spec]:
    """Specs of @ratelimit wrappers further down the ``__wrapped__`` chain (behind other
    decorators, or applied by a separate ``method_decorator``), decided with this level.

    A stack copied onto another wrapper by ``functools.wraps`` counts too: ``method_decorator``
    applies the decorator anew on every call, and only such a copy says it will.
    """
    found: dict[int, Spec] = {}
    seen: set[int] = set()
    current: object = fn
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        stack = getattr(current, _STACK_ATTR, None)
        if isinstance(stack, Stack):
            found.update((id(spec), spec) for spec in stack.specs)
        current = getattr(current, "__wrapped__", None) or getattr(current, "func", None)
    return list(found.values())


def _view_name(fn: Any) -> str:
    target = getattr(fn, "func", fn)  # functools.partial (method_decorator) -> the method
    module = getattr(fn, "__module__", None) or getattr(target, "__module__", "")
    qualname = getattr(fn, "__qualname__", None) or getattr(target, "__qualname__", repr(fn))
    return f"{module}.{qualname}"


def _pending(request: HttpRequest, specs: Sequence[Spec], view_name: str) -> list[Rule]:
    """Rules of ``specs`` not yet decided for this request; marks them decided."""
    done: set[int] = request.__dict__.setdefault(_DONE_ATTR, set())
    rules = []
    for spec in specs:
        if id(spec) not in done:
            done.add(id(spec))
            rules.append(spec.rule(view_name))
    return rules


# -- deciding (with FAIL_OPEN) ---------------------------------------------------------------------
_outage_lock = threading.Lock()
_outage_state = {"last": float("-inf"), "suppressed": 0}


def report_outage(exc: BaseException) -> None:
    """Log that Redis failed, at most once per OUTAGE_LOG_INTERVAL per process."""
    now = time.monotonic()
    with _outage_lock:
        if now - _outage_state["last"] < OUTAGE_LOG_INTERVAL:
            _outage_state["suppressed"] += 1
            return
        suppressed = int(_outage_state["suppressed"])
        _outage_state["last"], _outage_state["suppressed"] = now, 0
    logger.warning(
        "Redis is unreachable for rate limiting (%s: %s); FAIL_OPEN=%s so requests are %s. "
        "%d similar failures were not logged since the last warning.",
        type(exc).__name__, exc, settings.FAIL_OPEN,
        "allowed" if settings.FAIL_OPEN else "answered 503", suppressed,
    )


@dataclass(frozen=True)
class Outcome:
    """The result of deciding a request's rules."""

    rules: tuple[Rule, ...]
    decisions: tuple[Decision, ...]
    unavailable: bool = False  # Redis failed and FAIL_OPEN is False: answer 503

    @property
    def blocked(self) -> bool:
        pairs = zip(self.rules, self.decisions, strict=True)
        return any(not decision.allowed and rule.block for rule, decision in pairs)


def _checks(request: HttpRequest, rules: Iterable[Rule]) -> tuple[list[Rule], list[Check]]:
    applied, checks = [], []
    for rule in rules:
        check = rule.check(request)
        if check is not None:
            applied.append(rule)
            checks.append(check)
    return applied, checks


def _outcome(request: HttpRequest, rules: list[Rule], decisions: Sequence[Decision]) -> Outcome:
    previous = getattr(request, "ratelimit", None)
    request.ratelimit = [*(previous or []), *decisions]  # type: ignore[attr-defined]
    limited = any(not d.allowed for d in decisions)
    request.limited = getattr(request, "limited", False) or limited  # type: ignore[attr-defined]
    return Outcome(tuple(rules), tuple(decisions))


def decide(request: HttpRequest, rules: Iterable[Rule], sender: Any) -> Outcome:
    """Decide ``rules`` for ``request`` in one script call; record and signal the result."""
    applied, checks = _checks(request, rules)
    decisions: list[Decision] = []
    if checks:
        try:
            decisions = evaluate(checks)
        except redis.RedisError as exc:
            report_outage(exc)
            if not settings.FAIL_OPEN:
                return Outcome((), (), unavailable=True)
            applied = []
    outcome = _outcome(request, applied, decisions)
    for decision in decisions:
        if not decision.allowed:
            rate_limited.send(sender, request=request, decision=decision)
    return outcome


async def adecide(request: HttpRequest, rules: Iterable[Rule], sender: Any) -> Outcome:
    """The asyncio twin of :func:`decide` (no thread hop: the asyncio Redis client)."""
    applied, checks = _checks(request, rules)
    decisions: list[Decision] = []
    if checks:
        try:
            decisions = await aevaluate(checks)
        except redis.RedisError as exc:
            report_outage(exc)
            if not settings.FAIL_OPEN:
                return Outcome((), (), unavailable=True)
            applied = []
    outcome = _outcome(request, applied, decisions)
    for decision in decisions:
        if not decision.allowed:
            await rate_limited.asend(sender, request=request, decision=decision)
    return outcome


# -- responses ---------------------------------------------------------------------------------
def add_headers(response: HttpResponseBase, decisions: Sequence[Decision]) -> None:
    """Rate-limit headers per ``REDISLUA["HEADERS"]``; headers already set are kept."""
    for name, value in rate_limit_headers(decisions).items():
        if name not in response:
            response[name] = value


def _default_denied(request: HttpRequest, exception: RateLimited) -> HttpResponse:
    return HttpResponse(
        "Too Many Requests\n", status=429, content_type="text/plain; charset=utf-8"
    )


def _denied_view() -> Callable[..., Any]:
    path = settings.DENIED_VIEW
    return _default_denied if path is None else cast(Callable[..., Any], import_string(path))


def denied_response(request: HttpRequest, exception: RateLimited) -> HttpResponseBase:
    """``DENIED_VIEW(request, exception)`` (default: a plain 429) plus Retry-After and headers."""
    view = _denied_view()
    if iscoroutinefunction(view):
        response = async_to_sync(view)(request, exception)
    else:
        response = view(request, exception)
    add_headers(response, exception.decisions)
    return cast(HttpResponseBase, response)


async def adenied_response(request: HttpRequest, exception: RateLimited) -> HttpResponseBase:
    view = _denied_view()
    if iscoroutinefunction(view):
        response = await view(request, exception)
    else:
        response = view(request, exception)
    add_headers(response, exception.decisions)
    return cast(HttpResponseBase, response)


def unavailable_response() -> HttpResponse:
    """FAIL_OPEN = False and Redis failed: 503, never a 500."""
    return HttpResponse(
        "Service Unavailable: rate limiter unreachable\n", status=503,
        content_type="text/plain; charset=utf-8", headers={"Retry-After": "1"},
    )


# -- concurrency leases ------------------------------------------------------------------------
def _release_all(decisions: Sequence[Decision]) -> None:
    for decision in decisions:
        if decision.lease is not None:
            try:
                decision.policy.release(decision.key, decision)
            except redis.RedisError as exc:  # the lease expires after the policy's timeout anyway
                report_outage(exc)


async def _arelease_all(decisions: Sequence[Decision]) -> None:
    for decision in decisions:
        if decision.lease is not None:
            try:
                await decision.policy.arelease(decision.key, decision)
            except redis.RedisError as exc:
                report_outage(exc)


def _on_close(response: HttpResponseBase, callback: Callable[[], None]) -> None:
    # Django runs a response's resource closers from close(), which WSGI servers and the ASGI
    # handler call once the last chunk is sent (or the client went away).
    closers: list[Callable[[], None]] = response._resource_closers  # type: ignore[attr-defined]
    closers.append(callback)


def finish(response: HttpResponseBase, decisions: Sequence[Decision]) -> HttpResponseBase:
    """Headers on an allowed response; concurrency slots released when the response is done.

    A streaming response is not done when the view returns: its slots are released by
    ``response.close()``, which the WSGI/ASGI handler calls after the last chunk is sent.
    """
    add_headers(response, decisions)
    if any(d.lease is not None for d in decisions):
        if response.streaming:
            _on_close(response, functools.partial(_release_all, decisions))
        else:
            _release_all(decisions)
    return response


async def afinish(response: HttpResponseBase, decisions: Sequence[Decision]) -> HttpResponseBase:
    add_headers(response, decisions)
    if any(d.lease is not None for d in decisions):
        if response.streaming:
            _on_close(response, functools.partial(_release_all, decisions))
        else:
            await _arelease_all(decisions)
    return response


# -- guarding a view call ----------------------------------------------------------------------
def guard(
    stack: Stack, request: HttpRequest, call: Callable[[], HttpResponseBase]
) -> HttpResponseBase:
    rules = _pending(request, [*stack.specs, *_inner_specs(stack.view)], stack.view_name)
    if not rules:
        return call()
    outcome = decide(request, rules, ratelimit)
    if outcome.unavailable:
        return unavailable_response()
    if outcome.blocked:
        return denied_response(request, RateLimited(outcome.decisions))
    try:
        response = call()
    except BaseException:
        _release_all(outcome.decisions)
        raise
    return finish(response, outcome.decisions)


async def aguard(
    stack: Stack, request: HttpRequest, call: Callable[[], Awaitable[HttpResponseBase]]
) -> HttpResponseBase:
    rules = _pending(request, [*stack.specs, *_inner_specs(stack.view)], stack.view_name)
    if not rules:
        return await call()
    outcome = await adecide(request, rules, ratelimit)
    if outcome.unavailable:
        return unavailable_response()
    if outcome.blocked:
        return await adenied_response(request, RateLimited(outcome.decisions))
    try:
        response = await call()
    except BaseException:
        await _arelease_all(outcome.decisions)
        raise
    return await afinish(response, outcome.decisions)


def _decorate_function(fn: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    inner = _own_stack(fn)
    if inner is not None:  # directly stacked: one wrapper, one script call, for the whole stack
        specs, view, name = (spec, *inner.specs), inner.view, inner.view_name
    else:
        specs, view, name = (spec,), fn, _view_name(fn)
    wrapper: Callable[..., Any]

    if iscoroutinefunction(view):
        @functools.wraps(fn)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return await aguard(stack, request, lambda: view(request, *args, **kwargs))
    else:
        @functools.wraps(fn)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return guard(stack, request, lambda: view(request, *args, **kwargs))

    stack = Stack(specs, view, name, wrapper)
    setattr(wrapper, _STACK_ATTR, stack)
    return wrapper


def _decorate_class(cls: type[View], spec: Spec) -> type[View]:
    original = cls.dispatch
    inner = _own_stack(original)
    if inner is not None:
        specs, view = (spec, *inner.specs), inner.view
    else:
        specs, view = (spec,), original
    name = f"{cls.__module__}.{cls.__qualname__}"
    dispatch: Callable[..., Any]

    if cls.view_is_async:
        async def dispatch(self: View, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return await aguard(stack, request, lambda: view(self, request, *args, **kwargs))
    else:
        def dispatch(self: View, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return guard(stack, request, lambda: view(self, request, *args, **kwargs))

    functools.update_wrapper(dispatch, original)
    stack = Stack(specs, view, name, dispatch)
    setattr(dispatch, _STACK_ATTR, stack)
    cls.dispatch = dispatch  # type: ignore[method-assign,assignment]
    return cls


def ratelimit(
    policy: str | None = None,
    *,
    rate: Any = None,
    key: Any = None,
    algorithm: str | None = None,
    methods: Sequence[str] | str | None = None,
    block: bool | None = None,
    cost: int | None = None,
    burst: int | None = None,
    limit: int | None = None,
    timeout: float | str | None = None,
    group: str | None = None,
) -> Callable[[ViewT], ViewT]:
    """Limit a view by a policy from ``REDISLUA["POLICIES"]`` or an inline one.

    ``@ratelimit("login")`` uses the configured policy (``key``, ``methods``, ``block`` and
    ``cost`` may be overridden here). ``@ratelimit(rate="10/m", key="user_or_ip",
    algorithm="gcra", ...)`` defines one inline, named after the view (or ``group``: views
    sharing a group share the counter). Works on sync and ``async def`` views, on class-based
    views (decorate the class, or ``method_decorator``), and stacked: one script call decides
    every ``@ratelimit`` of the view, all-or-nothing.
    """
    given = {
        "rate": rate, "key": key, "algorithm": algorithm, "methods": methods, "block": block,
        "cost": cost, "burst": burst, "limit": limit, "timeout": timeout,
    }
    options = {k: v for k, v in given.items() if v is not None}
    if policy is None:
        if "rate" not in options and "limit" not in options:
            raise TypeError("ratelimit() needs a policy name, or an inline rate= (or limit=)")
        options.setdefault("algorithm", "concurrency" if "limit" in options else "sliding_window")
    else:
        ignored = sorted(set(options) & set(INLINE_OPTIONS))
        if ignored:
            raise TypeError(
                f"ratelimit({policy!r}) uses a configured policy; set {', '.join(ignored)} in "
                "REDISLUA['POLICIES'] or use an inline rate= without a policy name"
            )
    spec = Spec(policy, group, options)

    def decorator(target: ViewT) -> ViewT:
        if isinstance(target, type):
            if not issubclass(target, View):
                raise TypeError(f"@ratelimit decorates views and View subclasses, not {target!r}")
            return cast(ViewT, _decorate_class(target, spec))
        return cast(ViewT, _decorate_function(target, spec))

    return decorator
