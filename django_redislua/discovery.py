"""Every rate-limit policy this project uses, found without a request: the admin page and
``redislua_reset`` show and reset them all, not only those in ``REDISLUA["POLICIES"]``.

- ``settings``: ``REDISLUA["POLICIES"]`` (a broken one is left out: the checks report it);
- ``view``: an inline ``@ratelimit(rate=...)`` on a view the URLconf routes (its generated name
  or its ``group=``), a fixed rate or a rate callable;
- ``DRF``: a scope of ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` as this app's throttles
  decide it (a sliding log named after the scope).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.apps import apps

from django_redislua.conf import settings
from django_redislua.limiting import Policy, PolicyError
from django_redislua.limiting.registry import get_policy


@dataclass(frozen=True)
class PolicyInUse:
    policy: Policy
    source: str  # "settings", "view <route>" or "DRF scope"


def policies_in_use() -> dict[str, PolicyInUse]:
    """Name -> policy; the settings win over a view or scope of the same name."""
    found: dict[str, PolicyInUse] = {}
    for name, entry in [*_drf_scopes(), *_inline()]:
        found.setdefault(name, entry)
    for name in settings.POLICIES:
        try:
            found[name] = PolicyInUse(get_policy(name), "settings")
        except PolicyError:
            continue
    return dict(sorted(found.items()))


def find_policy(name: str) -> Policy | None:
    entry = policies_in_use().get(name)
    return None if entry is None else entry.policy


def key_specs_of(policy: Policy) -> list[object]:
    """Every key spec a request is keyed by under ``policy``: its own (``user_or_ip`` when it
    sets none), and each one a ``@ratelimit(name, key=...)`` on a routed view or a
    ``MIDDLEWARE_POLICIES`` entry overrides it with. For live overrides: an identity none of
    these can yield would never match."""
    from django_redislua.decorators import named_specs_of
    from django_redislua.urlconf import url_views, view_targets

    found: list[object] = [policy.key if policy.key is not None else "user_or_ip"]
    for entry in settings.MIDDLEWARE_POLICIES:
        if entry.get("policy") == policy.name and "key" in entry:
            found.append(entry["key"])
    for _route, callback in url_views():
        for target in view_targets(callback):
            for spec, _view_name in named_specs_of(target):
                if spec.policy_name == policy.name and spec.options.get("key") is not None:
                    found.append(spec.options["key"])
    unique: list[object] = []
    for key in found:
        if key not in unique:
            unique.append(key)
    return unique


def _inline() -> list[tuple[str, PolicyInUse]]:
    from django_redislua.decorators import named_specs_of
    from django_redislua.urlconf import url_views, view_targets

    found = []
    for route, callback in url_views():
        for target in view_targets(callback):
            for spec, view_name in named_specs_of(target):
                if spec.policy_name is not None:
                    continue  # a settings policy, listed as such
                rule = spec.rule(view_name)
                if isinstance(rule, PolicyError):
                    continue
                found.append((rule.policy.name, PolicyInUse(rule.policy, f"view {route or '/'}")))
    return found


def _drf_scopes() -> list[tuple[str, PolicyInUse]]:
    if not apps.is_installed("rest_framework"):
        return []
    from rest_framework.settings import api_settings

    from django_redislua.drf import scope_policy

    found: list[tuple[str, PolicyInUse]] = []
    for scope, rate in (api_settings.DEFAULT_THROTTLE_RATES or {}).items():
        if isinstance(rate, str):
            try:
                found.append((scope, PolicyInUse(scope_policy(scope, rate), "DRF scope")))
            except PolicyError:
                continue  # the checks report a malformed rate
    return found
