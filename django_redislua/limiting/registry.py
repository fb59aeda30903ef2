"""Policies from ``REDISLUA["POLICIES"]``, each built on first use and rebuilt when settings change.

Built one by one, not all at once: a broken policy (the system checks report it) raises its
PolicyError only where it is used, and never stops the views that use the others.
"""

from __future__ import annotations

import threading
from typing import Any

from django_redislua.conf import on_change, settings
from django_redislua.limiting.decision import PolicyError
from django_redislua.limiting.definition import POLICY_OPTIONS
from django_redislua.limiting.policy import Policy


class UnknownPolicy(PolicyError, KeyError):
    """No policy of that name in ``REDISLUA["POLICIES"]`` (a KeyError too, for ``except``)."""

    def __str__(self) -> str:  # KeyError's own would quote the whole message
        return str(self.args[0])


def build_policy(name: str, options: Any) -> Policy:
    if not isinstance(options, dict):
        raise PolicyError(
            "redislua.E004", f"policy {name!r} must be a dict of options, not {options!r}"
        )
    known = {k: v for k, v in options.items() if k in POLICY_OPTIONS}
    policy = Policy(name, **known)
    plans = settings.PLANS
    if isinstance(plans, dict):  # (checks._plans reports a PLANS that is not)
        named = {plan: rates[name] for plan, rates in plans.items()
                 if isinstance(rates, dict) and name in rates}
        if named:
            policy.plans = named
    return policy


_lock = threading.Lock()
# name -> the built policy, or (check id, message) of the PolicyError building it raised.
_built: dict[str, Policy | tuple[str, str]] = {}
# How many times the settings changed (under _lock): a policy built from settings read before
# a change is not kept after it.
_forgotten = 0


@on_change
def _forget() -> None:
    global _forgotten
    with _lock:
        _built.clear()
        _forgotten += 1


def get_policy(name: str) -> Policy:
    """The policy ``name`` from ``REDISLUA["POLICIES"]``.

    UnknownPolicy (redislua.E021) names the known ones; a policy whose options are wrong raises
    the PolicyError its system check reports, every time it is asked for.
    """
    built = _built.get(name)
    if built is None:
        read_after = _forgotten  # before the settings are read
        policies = settings.POLICIES
        if name not in policies:
            known = ", ".join(sorted(policies)) or "none"
            raise UnknownPolicy(
                "redislua.E021", f"no REDISLUA policy named {name!r} (known: {known})"
            )
        try:
            built = build_policy(name, policies[name])
        except PolicyError as exc:
            built = (exc.check_id, str(exc))
        with _lock:
            if _forgotten == read_after:  # else built from settings changed since: used once
                built = _built.setdefault(name, built)
    if isinstance(built, tuple):
        raise PolicyError(*built)  # a new one each time: re-raising one would grow its traceback
    return built


def broken_in_settings(name: str) -> bool:
    """Whether ``name`` is a policy of ``REDISLUA["POLICIES"]`` that cannot be built: the
    settings check reports it, once, so the checks of the views using it do not again."""
    try:
        get_policy(name)
    except UnknownPolicy:
        return False
    except PolicyError:
        return True
    return False
