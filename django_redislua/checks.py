"""System checks: every configuration mistake has a stable id, listed in the docs' checks page.

They cover ``settings.REDISLUA``, the connection (URL or cache alias with its LOCATION), every
``@ratelimit`` on a view the URLconf reaches, and this app's DRF throttles as the views and
``REST_FRAMEWORK`` use them. They run offline: ``manage.py check`` never connects to Redis.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import redis
from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Info, Tags, Warning, register

from django_redislua.conf import DEFAULTS, SCHEMA
from django_redislua.exchange import ASYNC_CLUSTER_PUBSUB, POLL_INTERVAL
from django_redislua.jobs.gate import known_gates
from django_redislua.limiting.decision import PolicyError
from django_redislua.limiting.definition import POLICY_OPTIONS
from django_redislua.limiting.registry import broken_in_settings, build_policy
from django_redislua.links import check_url
from django_redislua.plans import plan_problems
from django_redislua.request_layer import rule_for_name
from django_redislua.urlconf import url_views, view_targets

# What to do about each check, said in its hint before the link to its docs entry (as Django's
# own checks do); docs/checks.md has the same fixes, longer.
FIXES = {
    "redislua.E001": "Write REDISLUA = {...} (a dict) in your settings.",
    "redislua.E002": "Name a CACHES alias, or use a URL: redis://host:port/db, rediss://, "
                     "unix:///path, redis+cluster://host:port or "
                     "redis+sentinel://host:port/service.",
    "redislua.E003": "Point it at a cache whose BACKEND is "
                     "django.core.cache.backends.redis.RedisCache or "
                     "django_redis.cache.RedisCache, or use a URL.",
    "redislua.E004": "Give each policy a name and a dict of options, e.g. "
                     "\"POLICIES\": {\"api\": {\"rate\": \"100/m\"}}.",
    "redislua.E005": "Use one of fixed_window, sliding_log, sliding_window, token_bucket, "
                     "leaky_bucket, gcra, concurrency, calendar.",
    "redislua.E006": "Write a rate as \"5/m\", \"100/10s\", \"1000/day\" or \"3/15m\" "
                     "(units s, m, h, d, w, or sec, min, hour, day, week; a calendar policy "
                     "counts per hour, day, week or month: \"10000/month\"), or give a "
                     "callable (request) -> str | None or its dotted path.",
    "redislua.E007": "Give burst (a whole number >= 1) to token_bucket, leaky_bucket or gcra "
                     "only, small enough for the bucket to count exactly.",
    "redislua.E008": "Use ip, user, user_or_ip, header:<name>, get:<param>, post:<param>, a "
                     "callable or its dotted path.",
    "redislua.E009": "Write a duration in seconds (30) or as \"500ms\", \"30s\", \"10m\", "
                     "\"1h\", \"1d\"; it must be longer than zero.",
    "redislua.E010": "A concurrency policy takes limit (and timeout): {\"algorithm\": "
                     "\"concurrency\", \"limit\": 2, \"timeout\": \"10m\"}; rate policies "
                     "take rate, and a cost no larger than their capacity.",
    "redislua.E011": "List HTTP method names: \"methods\": [\"POST\"].",
    "redislua.E012": "Use \"ietf\", \"legacy\", \"both\" or None.",
    "redislua.E013": "Use True (allow requests when Redis is down) or False (answer 503).",
    "redislua.E014": "Give the number of proxies that append to X-Forwarded-For (0 uses "
                     "REMOTE_ADDR).",
    "redislua.E015": "Use a prefix length: IPV4_MASK 1-32 (e.g. 32), IPV6_MASK 1-128 (e.g. 64).",
    "redislua.E016": "Use a non-empty string without braces or whitespace, e.g. \"rl\" or "
                     "\"myapp:rl\".",
    "redislua.E017": "Write a list of dicts, each with \"policy\" and \"path\" or \"name\": "
                     "[{\"path\": \"/api/\", \"policy\": \"api\"}].",
    "redislua.E018": "Give the dotted path of a view function (request, exception) -> response.",
    "redislua.E019": "Use a number of seconds > 0 (e.g. 0.5) or None; CONNECTION_OPTIONS is a "
                     "dict of redis-py keyword arguments.",
    "redislua.E020": "Use a rate (\"100/day\", \"5/10s\") or None for no limit.",
    "redislua.E021": "Add the policy to REDISLUA[\"POLICIES\"], or fix the name.",
    "redislua.E022": "Add the scope to REST_FRAMEWORK[\"DEFAULT_THROTTLE_RATES\"] with a rate "
                     "(or None for no limit).",
    "redislua.E023": "Use a number of seconds > 0 and at most 60, e.g. 1.0.",
    "redislua.E024": "Use True or False (not a string such as \"false\").",
    "redislua.E025": "Use \"auto\", a list of \"prometheus\" and/or \"opentelemetry\" "
                     "(installed), or [] for none.",
    "redislua.E026": "Use \"mode\": \"enforce\" (the default) or \"shadow\".",
    "redislua.E027": "Use a long random string (secrets.token_urlsafe(32)), read from the "
                     "environment, or None for staff sessions only.",
    "redislua.E028": "Use \"text\" (the default: \"Too Many Requests\") or \"problem\" "
                     "(RFC 9457 application/problem+json).",
    "redislua.E033": "Give a calendar policy a timezone name (\"Europe/Paris\"), a ZoneInfo, "
                     "or a callable (request) -> zone name or its dotted path; other "
                     "algorithms take no timezone.",
    "redislua.E034": "Declare plans as \"PLANS\": {\"free\": {\"api-monthly\": \"1000/month\"}, "
                     "\"pro\": {\"api-monthly\": \"100000/month\"}} (policies of POLICIES with a "
                     "fixed rate; None: unlimited) and \"PLAN\": the dotted path of a callable "
                     "(request) -> plan name or None.",
    "redislua.E029": "Name the policy on the view: throttle_policy = \"api\" (a name or a "
                     "list); or take PolicyThrottle out of its throttle_classes "
                     "(throttle_policy = None says no policy on purpose).",
    "redislua.E032": "Point the task at a backend that supports run_after (django-tasks-db's "
                     "DatabaseBackend does), or limit it some other way.",
    "redislua.E031": "Give the policy a fixed rate (or a policy of its own for the job): a "
                     "background job has no request to take a rate from.",
    "redislua.E030": "Use \"count_failures\": True (a 4xx is a failure), a list of statuses "
                     "such as [401], or a callable (request, response) -> bool; on a rate "
                     "algorithm, with a window period of at least 1 s.",
}


def _error(check_id: str, msg: str, hint: str | None = None) -> Error:
    see = f"See {check_url(check_id)}"
    return Error(msg, hint=f"{hint or FIXES[check_id]} {see}", id=check_id)


def _connection(config: dict[str, Any]) -> list[CheckMessage]:
    from django_redislua.endpoints import ConnectionConfigError, resolve_endpoint

    target = config.get("CONNECTION", DEFAULTS["CONNECTION"])
    if not isinstance(target, str) or not target:
        return [
            _error(
                "redislua.E002",
                f"REDISLUA['CONNECTION'] must be a cache alias or URL, not {target!r}.",
            )
        ]
    caches = getattr(django_settings, "CACHES", {})
    try:
        endpoint = resolve_endpoint(target, caches)
    except ConnectionConfigError as exc:
        return [_error(exc.check_id, str(exc))]
    if endpoint.kind == "cluster" and not ASYNC_CLUSTER_PUBSUB:
        return [Warning(
            f"redis-py {redis.__version__} has no asyncio cluster pub/sub: on this cluster, "
            "asyncio lock, semaphore, run_once and single_flight waits are not woken by a "
            f"release but try again every {POLL_INTERVAL * 1000:g} ms.",
            hint=f"Upgrade redis-py to 8.0 or newer for waits woken on release (sync waits are "
                 f"woken on every version). See {check_url('redislua.W004')}",
            id="redislua.W004",
        )]
    return []


def _policies(config: dict[str, Any]) -> list[CheckMessage]:
    from django_redislua.keys import key_function

    policies = config.get("POLICIES", {})
    if not isinstance(policies, dict):
        return [
            _error(
                "redislua.E004",
                f"REDISLUA['POLICIES'] must be a dict, not {type(policies).__name__}.",
            )
        ]
    messages: list[CheckMessage] = []
    for name, options in policies.items():
        try:
            policy = build_policy(name, options)
            key_function(policy.key)
        except PolicyError as exc:
            messages.append(_error(exc.check_id, str(exc)))
            continue
        messages += _body_key_on_every_method(policy)
        unknown = sorted(set(options) - POLICY_OPTIONS)
        if unknown:
            messages.append(
                Warning(
                    f"policy {name!r} has unknown options {unknown}; they are ignored.",
                    hint=f"Known options: {', '.join(sorted(POLICY_OPTIONS))}. "
                    f"See {check_url('redislua.W002')}",
                    id="redislua.W002",
                )
            )
    return messages


# Methods whose requests carry no form or body a post:<param> key could read.
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE", "TRACE"})


def _body_key_on_every_method(policy: Any) -> list[CheckMessage]:
    """redislua.W007: a ``post:<param>`` key on a policy without ``methods`` (or with a method
    that carries no body): every GET shares the identity of requests lacking the field, so
    one budget for all of them, not a skipped limit (it was before issue 35)."""
    key = policy.key
    if not (isinstance(key, str) and key.startswith("post:")):
        return []
    bodyless = sorted(_BODYLESS if policy.methods is None else policy.methods & _BODYLESS)
    if not bodyless:
        return []
    applies = "every method" if policy.methods is None else f"{', '.join(bodyless)}"
    return [Warning(
        f"policy {policy.name!r} keys by {key!r} and applies to {applies}: those requests carry "
        "no body, so they all share the one identity of requests lacking the field ('#absent') "
        "and one budget.",
        hint=f"Limit it to the methods that post the field, e.g. \"methods\": [\"POST\"]. "
             f"See {check_url('redislua.W007')}",
        id="redislua.W007",
    )]


def _scalars(config: dict[str, Any]) -> list[CheckMessage]:
    """W001 for unknown keys; then every setting given, against its rule in the schema."""
    messages: list[CheckMessage] = []
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        messages.append(
            Warning(
                f"REDISLUA has unknown settings {unknown}; they are ignored.",
                hint=f"Known settings: {', '.join(DEFAULTS)}. See {check_url('redislua.W001')}",
                id="redislua.W001",
            )
        )
    for setting in SCHEMA:
        if setting.name in config and setting.check_id is not None:
            messages += [_error(setting.check_id, problem.message, problem.hint)
                         for problem in setting.problems(config[setting.name])]
    return messages


def _middleware_policies(config: dict[str, Any]) -> list[CheckMessage]:
    rules = config.get("MIDDLEWARE_POLICIES", [])
    policies = config.get("POLICIES", {})
    if not isinstance(rules, (list, tuple)):
        return [_error("redislua.E017", "REDISLUA['MIDDLEWARE_POLICIES'] must be a list of dicts.")]
    messages: list[CheckMessage] = []
    for index, rule in enumerate(rules):
        if (
            not isinstance(rule, dict)
            or "policy" not in rule
            or not ("path" in rule or "name" in rule)
        ):
            messages.append(
                _error(
                    "redislua.E017",
                    f"MIDDLEWARE_POLICIES[{index}] must be a dict with 'policy' and 'path' (a URL "
                    f"prefix) or 'name' (a URL name), not {rule!r}.",
                )
            )
        elif isinstance(policies, dict) and rule["policy"] not in policies:
            messages.append(
                _error(
                    "redislua.E017",
                    f"MIDDLEWARE_POLICIES[{index}] names the policy {rule['policy']!r}, which "
                    "is not in REDISLUA['POLICIES'].",
                )
            )
    return messages


def _rates_checked_globally() -> bool:
    """True when this app's throttles are in DEFAULT_THROTTLE_CLASSES: then _drf_rates checks
    every DEFAULT_THROTTLE_RATES entry, and the per-view walk need not report them again."""
    config = getattr(django_settings, "REST_FRAMEWORK", {})
    if not isinstance(config, dict):
        return False
    classes = config.get("DEFAULT_THROTTLE_CLASSES", [])
    return any(str(c).startswith("django_redislua.") for c in classes)


def _drf_rates() -> list[CheckMessage]:
    """With this app's DRF throttles in use, every DEFAULT_THROTTLE_RATES entry must parse."""
    from django_redislua.limiting.rates import RateError, parse_rate

    if not _rates_checked_globally():
        return []
    config = getattr(django_settings, "REST_FRAMEWORK", {})
    messages: list[CheckMessage] = []
    for scope, rate in (config.get("DEFAULT_THROTTLE_RATES") or {}).items():
        if rate is None:
            continue
        try:
            parse_rate(rate)
        except RateError as exc:
            message = f"REST_FRAMEWORK throttle rate {scope!r}: {exc}"
            messages.append(_error("redislua.E020", message))
    return messages


def _decorated_views() -> list[CheckMessage]:
    """Every ``@ratelimit`` on a routed view: its policy exists, its inline options are valid."""
    from django_redislua.decorators import specs_of

    messages: list[CheckMessage] = []
    seen: set[int] = set()
    for route, callback in url_views():
        for target in view_targets(callback):
            for spec in specs_of(target):
                if id(spec) in seen:
                    continue
                seen.add(id(spec))
                error = spec.error()
                if error is not None:
                    messages.append(_error(
                        error.check_id, f"@ratelimit on the view at {route or '/'!r}: {error}"
                    ))
    return messages


def _drf_throttles() -> list[CheckMessage]:
    """This app's DRF throttles, on the views that use them and in DEFAULT_THROTTLE_CLASSES:
    every scope has a rate that parses, every throttle_policy exists."""
    from django.apps import apps

    if not apps.is_installed("rest_framework"):
        return []
    from django_redislua import drf

    in_use: dict[tuple[Any, str], Any] = {}  # (throttle class, route) -> view class
    try:
        from rest_framework.settings import api_settings

        for default in api_settings.DEFAULT_THROTTLE_CLASSES:
            in_use[(default, "REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES']")] = None
    except ImportError:
        pass  # DRF's own check names the class that does not import
    for route, callback in url_views():
        view_class = getattr(callback, "cls", None)
        for throttle in getattr(view_class, "throttle_classes", None) or ():
            in_use[(throttle, route or "/")] = view_class
    messages: list[CheckMessage] = []
    reported: set[str] = set()
    rates_checked = _rates_checked_globally()
    for (throttle_class, where), view_class in in_use.items():
        for error in _throttle_errors(drf, throttle_class, view_class):
            from_defaults = getattr(throttle_class, "THROTTLE_RATES", None) is None and getattr(
                throttle_class, "rate", None) is None
            if rates_checked and error.check_id == "redislua.E020" and from_defaults:
                continue  # a DEFAULT_THROTTLE_RATES entry: _drf_rates reports it once
            if str(error) not in reported:  # one line per mistake, not per view repeating it
                reported.add(str(error))
                name = throttle_class.__name__
                messages.append(_error(error.check_id, f"{name} on {where}: {error}"))
    return messages


def _unnamed_policies() -> list[CheckMessage]:
    """A routed DRF view listing PolicyThrottle (or a subclass) in its own throttle_classes
    without the attribute naming its policies: every request passes, silently (a misspelled
    ``throttle_policies``, or an ``@api_view`` function, which has no way to set it)."""
    from django.apps import apps

    if not apps.is_installed("rest_framework"):
        return []
    from rest_framework.views import APIView

    from django_redislua import drf

    inherited = APIView.throttle_classes  # DEFAULT_THROTTLE_CLASSES, read when DRF loaded
    messages: list[CheckMessage] = []
    seen: set[tuple[Any, ...]] = set()
    for route, callback in url_views():
        view_class = getattr(callback, "cls", None)
        if not isinstance(view_class, type) or not issubclass(view_class, APIView):
            continue
        initkwargs = getattr(callback, "initkwargs", None) or {}
        classes = initkwargs.get("throttle_classes", view_class.throttle_classes)
        if not classes or classes is inherited:
            # The global setting's PolicyThrottle limits the views that name a policy and
            # leaves the others alone, as DRF's ScopedRateThrottle does with throttle_scope.
            continue
        for throttle in classes:
            if not (isinstance(throttle, type) and issubclass(throttle, drf.PolicyThrottle)):
                continue
            attr = throttle.policy_attr
            if attr in initkwargs or hasattr(view_class, attr):
                continue  # named (E021 checks the names), or None on purpose
            if (view_class, throttle) in seen:
                continue  # a router's list and detail routes: one view, one message
            seen.add((view_class, throttle))
            where = f"{_dotted(view_class)} at {route or '/'!r}"
            near = _near_attributes(attr, view_class, initkwargs, classes, drf, APIView)
            guess = (f" Did you mean {attr} (the view has {', '.join(near)})?" if near else "")
            message = (f"{throttle.__name__} on {where} names no policy: the view has no "
                       f"{attr!r} attribute, so every request passes, unthrottled.{guess}")
            hint = FIXES["redislua.E029"].replace("throttle_policy", attr).replace(
                "PolicyThrottle", throttle.__name__)
            if view_class.__qualname__ == "WrappedAPIView":  # @api_view: no decorator sets it
                hint += (f" On an @api_view function, set it after the decorators: "
                         f"{view_class.__name__}.cls.{attr} = \"api\".")
            messages.append(_error("redislua.E029", message, hint=hint))
    return messages


def _dotted(view_class: type) -> str:
    # @api_view's class is named after the function (its __qualname__ stays WrappedAPIView).
    name = (view_class.__name__ if view_class.__qualname__ == "WrappedAPIView"
            else view_class.__qualname__)
    return f"{view_class.__module__}.{name}"


def _near_attributes(attr: str, view_class: type, initkwargs: dict[str, Any],
                     classes: Any, drf: Any, api_view: type) -> list[str]:
    """The view's own attributes that look like a misspelling of ``attr`` (throttle_policies,
    policy, throttle_scope without ScopedRateThrottle...), set and not methods."""
    import difflib

    own: dict[str, Any] = dict(initkwargs)
    for klass in reversed(view_class.__mro__):
        if not klass.__module__.startswith(("rest_framework.", "django.", "builtins")):
            own.update(vars(klass))
    scoped = any(isinstance(c, type) and issubclass(c, drf.ScopedRateThrottle) for c in classes)
    names = {name for name, value in own.items()
             if not name.startswith("_") and not hasattr(api_view, name)  # DRF's own settings
             and value and not callable(value)
             and not isinstance(value, (classmethod, staticmethod, property))}
    close = set(difflib.get_close_matches(attr, names, n=5, cutoff=0.6))
    close |= {name for name in names if "polic" in name.lower()}
    if scoped:
        close.discard("throttle_scope")  # ScopedRateThrottle's own, in use
    elif own.get("throttle_scope"):
        close.add("throttle_scope")
    return sorted(close)


def _throttle_errors(drf: Any, given: object, view_class: Any) -> list[PolicyError]:
    """What is wrong with throttle class ``given`` as the view class (None: globally) uses it."""
    if not isinstance(given, type):
        return []
    cls: Any = given
    if issubclass(cls, drf.ScopedRateThrottle):
        scope = getattr(view_class, cls.scope_attr, None) if view_class is not None else None
        if not scope:
            return []
        throttle = cls()
        throttle.scope = scope
        throttle._configure()
        return [throttle.error] if throttle.error is not None else []
    if issubclass(cls, drf.SimpleRateThrottle):
        error = cls().error
        return [error] if error is not None else []
    if issubclass(cls, drf.PolicyThrottle) and view_class is not None:
        names = getattr(view_class, cls.policy_attr, None) or ()
        names = [names] if isinstance(names, str) else names
        rules = [rule_for_name(name) for name in names if not broken_in_settings(name)]
        return [rule for rule in rules if isinstance(rule, PolicyError)]
    return []


@register(Tags.compatibility)
def check_settings(**kwargs: Any) -> list[CheckMessage]:
    config = getattr(django_settings, "REDISLUA", {})
    if not isinstance(config, dict):
        return [
            _error(
                "redislua.E001", f"settings.REDISLUA must be a dict, not {type(config).__name__}."
            )
        ]
    return [
        *_scalars(config),
        *_connection(config),
        *_policies(config),
        *_middleware_policies(config),
        *[_error("redislua.E034", message) for message in plan_problems(config)],
        *_drf_rates(),
        *_jobs(),
    ]


def _jobs() -> list[CheckMessage]:
    """The policies of every background job defined so far (django_redislua.jobs): each one
    in the settings, none taking its rate from a request. Jobs defined later (a task module
    imported after the checks ran) raise the same error when they first run."""
    if not isinstance(getattr(django_settings, "REDISLUA", {}).get("POLICIES", {}), dict):
        return []  # _policies reports it
    errors: list[CheckMessage] = []
    for gate in known_gates():
        names = [n for n in gate.policy_names if isinstance(n, str)]
        if any(broken_in_settings(name) for name in names):
            continue  # _policies reports the policy itself
        try:
            gate.policies()
        except PolicyError as exc:
            said = str(exc)  # E031 names the job itself; E021 is about a name
            errors.append(_error(exc.check_id, f"J{said[1:]}" if exc.check_id == "redislua.E031"
                                 else f"Job {gate.name!r}: {said}"))
    return [*errors, *_deferred_tasks()]


def _deferred_tasks() -> list[CheckMessage]:
    """A Django task limited by policies is put off with ``run_after``: its backend must be
    able to (redislua.E032). Only where django_redislua.jobs.tasks is in use."""
    tasks = sys.modules.get("django_redislua.jobs.tasks")
    if tasks is None:
        return []
    errors: list[CheckMessage] = []
    for task, gate in tasks.limited_tasks():
        if not gate.policy_names:
            continue
        try:
            backend = task.get_backend()
        except Exception:  # a bad TASKS setting: Django's own checks report it
            continue
        if not getattr(backend, "supports_defer", False):
            errors.append(_error(
                "redislua.E032", f"Job {gate.name!r}: its task backend "
                f"{type(backend).__name__} cannot run a task later (run_after), so a run its "
                f"policies deny could not be put off."))
    return errors


@register(Tags.urls)
def check_views(**kwargs: Any) -> list[CheckMessage]:
    """The views' ``@ratelimit`` arguments and DRF throttles (needs the URLconf)."""
    config = getattr(django_settings, "REDISLUA", {})
    if not isinstance(config, dict) or not isinstance(config.get("POLICIES", {}), dict):
        return []  # check_settings reports it; policies cannot be looked up
    return [*_decorated_views(), *_drf_throttles(), *_unnamed_policies()]


@register(Tags.compatibility, deploy=True)
def check_reachable(**kwargs: Any) -> list[CheckMessage]:
    """``manage.py check --deploy`` only (every other check runs offline): connect to Redis the
    way the app will, and warn with the cause when it cannot. With FAIL_OPEN a wrong password
    or an unreachable server turns every limit off silently, which a deploy should hear of.

    Connected, read every primary's ``maxmemory-policy``: one that evicts can drop a held lock
    (two holders) or a limit's state under memory pressure (W006)."""
    from django_redislua.conf import settings as redislua_settings
    from django_redislua.connection import CLIENT_ERRORS, primary_nodes
    from django_redislua.endpoints import ConnectionConfigError, redacted_url

    config = getattr(django_settings, "REDISLUA", {})
    if not isinstance(config, dict):
        return []  # check_settings reports it
    policies: list[tuple[str, str | None]] = []
    try:
        for name, node in primary_nodes():
            node.ping()
            policies.append((name, eviction_policy(node)))
    except ConnectionConfigError:
        return []  # check_settings reports it
    except CLIENT_ERRORS as exc:
        effect = ("every rate limit is off (FAIL_OPEN=True: requests are allowed and logged)"
                  if redislua_settings.FAIL_OPEN else
                  "every limited request is answered 503 (FAIL_OPEN=False)")
        return [Warning(
            f"Redis cannot be reached at {redacted_url(redislua_settings.CONNECTION)!r} "
            f"({type(exc).__name__}: {exc}); until it can, {effect}, and locks raise "
            "LockUnavailable.",
            hint="Check the address, the password or ACL user, TLS and the firewall of "
                 f"REDISLUA['CONNECTION']. See {check_url('redislua.W005')}",
            id="redislua.W005",
        )]
    return _eviction(policies)


def eviction_policy(client: redis.Redis) -> str | None:
    """The node's ``maxmemory-policy``: ``CONFIG GET``, else the ``maxmemory_policy`` field of
    ``INFO memory`` (a managed Redis often refuses CONFIG but answers INFO); None when both are
    refused (a renamed command, an ACL user without them). Connection failures propagate."""
    value: Any = None
    # An unknown (renamed) command is a ResponseError; so is an ACL's NOPERM.
    with contextlib.suppress(redis.ResponseError):
        value = client.config_get("maxmemory-policy").get("maxmemory-policy")
    if not value:
        try:
            value = client.info("memory").get("maxmemory_policy")
        except redis.ResponseError:
            return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value) if value else None


def evicts(policy: str | None) -> bool:
    """Whether a node with this ``maxmemory-policy`` can drop keys under memory pressure:
    every policy but ``noeviction`` (``volatile-*`` drops exactly the keys with a TTL, which
    every lock and rate-limit key has)."""
    return policy is not None and policy != "noeviction"


def _eviction(policies: list[tuple[str, str | None]]) -> list[CheckMessage]:
    """W006 per evicting policy (naming its nodes), I001 for the nodes that would not say."""
    evicting: dict[str, list[str]] = {}
    for name, policy in policies:
        if evicts(policy):
            evicting.setdefault(str(policy), []).append(name)
    messages: list[CheckMessage] = []
    for policy, names in evicting.items():
        which = ("evicts exactly the keys that have a TTL, and every lock and rate-limit key has "
                 "one" if policy.startswith("volatile-") else "can evict any key")
        messages.append(Warning(
            f"Redis at {', '.join(sorted(names))} has maxmemory-policy {policy!r}: under memory "
            f"pressure it {which}. An evicted lock is taken by a second holder while the first "
            "still works under it; an evicted limit starts again with a full quota.",
            hint="Set maxmemory-policy noeviction on it (a full Redis then refuses writes, which "
                 "limits meet with FAIL_OPEN and locks with LockUnavailable), or give "
                 "REDISLUA['CONNECTION'] a Redis of its own with noeviction and keep the evicting "
                 f"one for the cache. See {check_url('redislua.W006')}",
            id="redislua.W006",
        ))
    unread = [name for name, policy in policies if policy is None]
    if unread:
        messages.append(Info(
            f"Could not read the maxmemory-policy of Redis at {', '.join(sorted(unread))}: "
            "CONFIG GET "
            "and INFO are both refused to this connection. It must be noeviction: an evicting "
            "policy can drop a held lock (two holders) or a limit's state.",
            hint="Check it in your provider's console, or allow this ACL user +config|get or "
                 f"+info for check --deploy to read it. See {check_url('redislua.I001')}",
            id="redislua.I001",
        ))
    return messages
