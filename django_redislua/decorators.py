"""``@ratelimit``: rate limits on Django views, decided in Redis by one script call per request.

A thin layer over :mod:`django_redislua.request_layer`: it finds the rules of a view (every
``@ratelimit`` stacked on it) and lets the request layer decide and answer. Every ``@ratelimit``
stacked on one view is decided by the outermost wrapper in ONE call; the inner wrappers find
their rules already decided (marked on the request) and step aside.

Arguments are checked when the decorator is applied, but a mistake (an unknown policy name, a
bad inline rate) does not stop the import: the system checks report it (``manage.py check``
walks the URLconf), and a request to that view meets the FAIL_OPEN guard, never a 500.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from django.views import View

from django_redislua import conf, request_layer
from django_redislua.limiting.decision import PolicyError
from django_redislua.limiting.options import CountFailures
from django_redislua.limiting.policy import Policy
from django_redislua.limiting.registry import broken_in_settings, get_policy
from django_redislua.request_layer import (
    Rule,
    RuleOrError,
    resolve_rule,
    rule_for_name,
    rule_for_policy,
)

ViewT = TypeVar("ViewT", bound=Callable[..., Any])
INLINE_OPTIONS = ("rate", "algorithm", "burst", "limit", "timeout", "fallback_rate", "normalize",
                  "count_failures")
_STACK_ATTR = "_redislua_stack"
_DONE_ATTR = "_redislua_done"


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
        # (settings generation, view name, its Rule): the Rule every request of the view takes.
        self._last: tuple[int, str, Rule] = (-1, "", cast(Rule, None))
        self.digest = hashlib.sha256(
            "|".join(f"{k}={_stable_repr(v)}" for k, v in sorted(options.items())).encode()
        ).hexdigest()[:8]

    def error(self) -> PolicyError | None:
        """What is wrong with these arguments, or None; the system checks call this. A policy
        of ``REDISLUA["POLICIES"]`` that is broken itself is left to the settings check, which
        reports it once for every view that uses it."""
        if self.policy_name is not None:
            if broken_in_settings(self.policy_name):
                return None
            result = rule_for_name(self.policy_name, **self.options)
        else:
            options = self.options
            result = resolve_rule(lambda: rule_for_policy(Policy("redislua.check", **options)))
        return result if isinstance(result, PolicyError) else None

    def rule(self, view_name: str) -> RuleOrError:
        """The Rule for this request (cached per policy object, rebuilt when settings change),
        or the PolicyError saying why it cannot be used (not kept: built again each time, so it
        is logged as it is, and a policy fixed since is used)."""
        last = self._last
        if last[0] == conf.generation and last[1] == view_name:
            return last[2]  # every request of a view: no policy lookup
        generation = conf.generation  # read first: a change while building makes it stale
        rule = resolve_rule(functools.partial(self._rule, view_name))
        if isinstance(rule, Rule):
            self._last = (generation, view_name, rule)
        return rule

    def _rule(self, view_name: str) -> Rule:
        if self.policy_name is not None:
            policy = get_policy(self.policy_name)
            overrides = self.options
        else:
            name = self.group or inline_policy_name(view_name, self.digest)
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

    # Its own specs, then those of @ratelimit wrappers further down ``view``'s chain
    # (:func:`specs_of`): the chain is made before this wrapper, so it is walked once, here.
    all_specs: tuple[Spec, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "all_specs", (*self.specs, *specs_of(self.view)))


def _own_stack(fn: object) -> Stack | None:
    stack = getattr(fn, _STACK_ATTR, None)
    if isinstance(stack, Stack) and stack.owner is fn:
        return stack
    return None


def specs_of(fn: object) -> list[Spec]:
    """Specs of @ratelimit wrappers further down the ``__wrapped__`` chain (behind other
    decorators, or applied by a separate ``method_decorator``), decided with this level.

    A stack copied onto another wrapper by ``functools.wraps`` counts too: ``method_decorator``
    applies the decorator anew on every call, and only such a copy says it will.
    """
    return [spec for spec, _view_name in named_specs_of(fn)]


def named_specs_of(fn: object) -> list[tuple[Spec, str]]:
    """:func:`specs_of`, each with the name of the view it limits (inline policies' names)."""
    found: dict[int, tuple[Spec, str]] = {}
    seen: set[int] = set()
    current: object = fn
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        stack = getattr(current, _STACK_ATTR, None)
        if isinstance(stack, Stack):
            # A copied stack (method_decorator copies it from a dummy function) carries the
            # dummy's name; the wrapper carrying it has the view's, as at request time.
            name = stack.view_name if stack.owner is current else _view_name(current)
            found.update((id(spec), (spec, name)) for spec in stack.specs)
        current = getattr(current, "__wrapped__", None) or getattr(current, "func", None)
    return list(found.values())


def inline_policy_name(view_name: str, digest: str) -> str:
    """The name of an inline policy (no ``group=``): short and stable, and public, since it
    appears in the RateLimit headers. The view's qualified name without its module (a module
    path tells clients how the code is laid out), plus a digest of the full view name and the
    options, so views of the same name in two modules, or two stacked inline rules, differ:
    ``"LoginView.post-3fa9c2b1"``."""
    qualname = view_name.partition(":")[2].rpartition("<locals>.")[2]
    qualname = ".".join(qualname.split(".")[-2:])[-40:] or "view"
    digest = hashlib.sha256(f"{view_name}|{digest}".encode()).hexdigest()[:8]
    return f"{qualname}-{digest}"


def _view_name(fn: Any) -> str:
    target = getattr(fn, "func", fn)  # functools.partial (method_decorator) -> the method
    module = getattr(fn, "__module__", None) or getattr(target, "__module__", "")
    qualname = getattr(fn, "__qualname__", None) or getattr(target, "__qualname__", repr(fn))
    return f"{module}:{qualname}"


def _pending(request: HttpRequest, specs: Sequence[Spec], view_name: str) -> list[RuleOrError]:
    """Rules of ``specs`` not yet decided for this request; marks them decided."""
    done: set[int] = request.__dict__.setdefault(_DONE_ATTR, set())
    rules = []
    for spec in specs:
        if id(spec) not in done:
            done.add(id(spec))
            rules.append(spec.rule(view_name))
    return rules


# -- guarding a view call ----------------------------------------------------------------------
def guard(
    stack: Stack, request: HttpRequest, call: Callable[[], HttpResponseBase]
) -> HttpResponseBase:
    rules = _pending(request, stack.all_specs, stack.view_name)
    return request_layer.guard(request, rules, ratelimit, call)


def aguard(
    stack: Stack, request: HttpRequest, call: Callable[[], Awaitable[HttpResponseBase]]
) -> Awaitable[HttpResponseBase]:
    rules = _pending(request, stack.all_specs, stack.view_name)
    return request_layer.aguard(request, rules, ratelimit, call)


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
    name = f"{cls.__module__}:{cls.__qualname__}"
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


# Arguments of other rate limiters' decorators, and what this one calls them.
RENAMED = {"method": "methods", "ratelimit_key": "key", "keys": "key", "scope": "group"}


def _unknown_arguments(unknown: dict[str, Any]) -> str:
    hints = []
    for name in sorted(unknown):
        known = RENAMED.get(name)
        if name == "method":
            value = unknown[name]
            methods = [value] if isinstance(value, str) else value
            hints.append(f"method={value!r} is django-ratelimit's spelling: write "
                         f"methods={list(methods)!r} (or use django_redislua.compat.ratelimit, "
                         "which takes django-ratelimit's arguments as they are)")
        elif known is not None:
            hints.append(f"{name}= is called {known}= here")
        else:
            hints.append(f"{name}= is not an argument of ratelimit()")
    arguments = ("policy, rate, key, algorithm, methods, block, cost, burst, limit, timeout, "
                 "fallback_rate, normalize, count_failures, group")
    return f"ratelimit(): {'; '.join(hints)}. Its arguments: {arguments}."


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
    fallback_rate: str | None = None,
    normalize: bool | None = None,
    count_failures: CountFailures = None,
    group: str | None = None,
    **unknown: Any,
) -> Callable[[ViewT], ViewT]:
    """Limit a view by a policy from ``REDISLUA["POLICIES"]`` or an inline one.

    ``@ratelimit("login")`` uses the configured policy (``key``, ``methods``, ``block`` and
    ``cost`` may be overridden here). ``@ratelimit(rate="10/m", key="user_or_ip",
    algorithm="gcra", ...)`` defines one inline, named after the view (or ``group``: views
    sharing a group share the counter); ``count_failures=[401]`` (or True, or a callable
    ``(request, response) -> bool``) counts only the requests whose response is a failure, for
    a login. Works on sync and ``async def`` views, on class-based views (decorate the class,
    or ``method_decorator``), and stacked: one script call decides every ``@ratelimit`` of the
    view, all-or-nothing.

    A mistake a check could only find at request time is refused here, when the view module is
    imported: ``@ratelimit`` without its parentheses, and an argument it does not take
    (django-ratelimit's ``method=``, for one).
    """
    if callable(policy):
        raise TypeError(
            f"@ratelimit needs its arguments: it was applied bare to {policy!r}. Write "
            "@ratelimit(\"policy-name\") for a policy in REDISLUA['POLICIES'], or an inline "
            "one such as @ratelimit(rate=\"10/m\", key=\"ip\")."
        )
    if unknown:
        raise TypeError(_unknown_arguments(unknown))
    given = {
        "rate": rate, "key": key, "algorithm": algorithm, "methods": methods, "block": block,
        "cost": cost, "burst": burst, "limit": limit, "timeout": timeout,
        "fallback_rate": fallback_rate, "normalize": normalize, "count_failures": count_failures,
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
