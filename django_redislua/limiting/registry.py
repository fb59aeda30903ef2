"""Policies from ``REDISLUA["POLICIES"]``, built once and rebuilt when settings change."""

from __future__ import annotations

import functools
from typing import Any

from django_redislua.conf import on_change, settings
from django_redislua.limiting.policy import POLICY_OPTIONS, Policy, PolicyError


def build_policy(name: str, options: Any) -> Policy:
    if not isinstance(options, dict):
        raise PolicyError(
            "redislua.E004", f"policy {name!r} must be a dict of options, not {options!r}"
        )
    known = {k: v for k, v in options.items() if k in POLICY_OPTIONS}
    return Policy(name, **known)


@functools.cache
def _policies() -> dict[str, Policy]:
    return {name: build_policy(name, options) for name, options in settings.POLICIES.items()}


on_change(_policies.cache_clear)


def get_policy(name: str) -> Policy:
    """The policy ``name`` from ``REDISLUA["POLICIES"]``; KeyError names the known ones."""
    try:
        return _policies()[name]
    except KeyError:
        known = ", ".join(sorted(settings.POLICIES)) or "none"
        raise KeyError(f"no REDISLUA policy named {name!r} (known: {known})") from None
