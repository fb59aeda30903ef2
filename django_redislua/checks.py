"""System checks for ``settings.REDISLUA``: every mistake has a stable id, listed in docs/checks.md.

They run offline (``manage.py check`` never connects to Redis).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_redislua.conf import DEFAULTS, HEADER_MODES
from django_redislua.limiting.policy import POLICY_OPTIONS, PolicyError
from django_redislua.limiting.registry import build_policy

DOCS = "See docs/checks.md."


def _error(check_id: str, msg: str, hint: str | None = None) -> Error:
    return Error(msg, hint=hint or DOCS, id=check_id)


def _connection(config: dict[str, Any]) -> list[CheckMessage]:
    from django_redislua.connection import REDIS_CACHE_BACKENDS, parse_url

    target = config.get("CONNECTION", DEFAULTS["CONNECTION"])
    caches = getattr(django_settings, "CACHES", {})
    if not isinstance(target, str) or not target:
        return [
            _error(
                "redislua.E002",
                f"REDISLUA['CONNECTION'] must be a cache alias or URL, not {target!r}.",
            )
        ]
    if target in caches:
        backend = caches[target].get("BACKEND", "")
        if backend not in REDIS_CACHE_BACKENDS:
            return [
                _error(
                    "redislua.E003",
                    f"REDISLUA['CONNECTION'] names the cache {target!r}, whose backend "
                    f"{backend!r} is not a Redis backend.",
                    f"Use one of {', '.join(REDIS_CACHE_BACKENDS)}, or a redis:// URL.",
                )
            ]
        return []
    if "://" not in target:
        return [
            _error(
                "redislua.E002",
                f"REDISLUA['CONNECTION'] {target!r} is not a CACHES alias "
                f"(known: {', '.join(caches) or 'none'}) and not a URL.",
            )
        ]
    try:
        parse_url(target)
    except ImproperlyConfigured as exc:
        return [_error("redislua.E002", str(exc))]
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
        unknown = sorted(set(options) - POLICY_OPTIONS)
        if unknown:
            messages.append(
                Warning(
                    f"policy {name!r} has unknown options {unknown}; they are ignored.",
                    hint=f"Known options: {', '.join(sorted(POLICY_OPTIONS))}. {DOCS}",
                    id="redislua.W002",
                )
            )
    return messages


def _scalars(config: dict[str, Any]) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        messages.append(
            Warning(
                f"REDISLUA has unknown settings {unknown}; they are ignored.",
                hint=f"Known settings: {', '.join(DEFAULTS)}. {DOCS}",
                id="redislua.W001",
            )
        )
    if "HEADERS" in config and config["HEADERS"] not in HEADER_MODES:
        messages.append(
            _error(
                "redislua.E012",
                f"REDISLUA['HEADERS'] must be one of {HEADER_MODES}, not {config['HEADERS']!r}.",
            )
        )
    if "FAIL_OPEN" in config and not isinstance(config["FAIL_OPEN"], bool):
        messages.append(_error("redislua.E013", "REDISLUA['FAIL_OPEN'] must be True or False."))
    proxies = config.get("TRUSTED_PROXIES", 0)
    if isinstance(proxies, bool) or not isinstance(proxies, int) or proxies < 0:
        messages.append(
            _error(
                "redislua.E014",
                f"REDISLUA['TRUSTED_PROXIES'] must be a whole number >= 0, not {proxies!r}.",
            )
        )
    for name, top in (("IPV4_MASK", 32), ("IPV6_MASK", 128)):
        mask = config.get(name, DEFAULTS[name])
        if isinstance(mask, bool) or not isinstance(mask, int) or not 0 < mask <= top:
            messages.append(
                _error(
                    "redislua.E015",
                    f"REDISLUA['{name}'] must be between 1 and {top}, not {mask!r}.",
                )
            )
    prefix = config.get("KEY_PREFIX", DEFAULTS["KEY_PREFIX"])
    if not isinstance(prefix, str) or not prefix or any(c in prefix for c in "{} \r\n"):
        messages.append(
            _error(
                "redislua.E016",
                f"REDISLUA['KEY_PREFIX'] must be a non-empty string "
                f"without braces or spaces, not {prefix!r}.",
            )
        )
    for name in ("SOCKET_TIMEOUT", "SOCKET_CONNECT_TIMEOUT"):
        value = config.get(name, DEFAULTS[name])
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
        ):
            messages.append(
                _error(
                    "redislua.E019",
                    f"REDISLUA['{name}'] must be a number of seconds > 0 or None, not {value!r}.",
                )
            )
    options = config.get("CONNECTION_OPTIONS", {})
    if not isinstance(options, dict):
        messages.append(_error("redislua.E019", "REDISLUA['CONNECTION_OPTIONS'] must be a dict."))
    denied = config.get("DENIED_VIEW")
    if denied is not None:
        try:
            target = import_string(denied) if isinstance(denied, str) else denied
        except ImportError as exc:
            target = None
            messages.append(
                _error(
                    "redislua.E018", f"REDISLUA['DENIED_VIEW'] {denied!r} cannot be imported: {exc}"
                )
            )
        else:
            if not callable(target):
                messages.append(
                    _error("redislua.E018", f"REDISLUA['DENIED_VIEW'] {denied!r} is not callable.")
                )
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


def _drf_rates() -> list[CheckMessage]:
    """With this app's DRF throttles in use, every DEFAULT_THROTTLE_RATES entry must parse."""
    from django_redislua.limiting.rates import RateError, parse_rate

    config = getattr(django_settings, "REST_FRAMEWORK", {})
    if not isinstance(config, dict):
        return []
    classes = config.get("DEFAULT_THROTTLE_CLASSES", [])
    if not any(str(c).startswith("django_redislua.") for c in classes):
        return []
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
        *_drf_rates(),
    ]
