"""A policy's options as the settings give them, parsed and checked: whole numbers, callables
or their dotted paths, ``methods`` and ``count_failures``. Each mistake is a PolicyError
carrying the system check's id. No Django request in here."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from django.utils.module_loading import import_string

from django_redislua.limiting.errors import PolicyError

# count_failures: True (4xx), status codes, or a callable (request, response) -> bool (or its
# dotted path); as a Policy holds it, the statuses or the callable.
CountFailures = bool | Sequence[int] | Callable[..., Any] | str | None
FailureRule = frozenset[int] | Callable[..., Any]
CLIENT_ERROR_STATUSES = frozenset(range(400, 500))
# What a rate callable's dotted path looks like ("myapp.limits.rate_for"), unlike "5 per minute".
DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def positive_int(value: object, check_id: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PolicyError(check_id, f"{what} must be a whole number of at least 1, not {value!r}")
    return value


def resolve_callable(spec: object, check_id: str, what: str) -> Callable[..., Any]:
    """A callable, or the callable at a dotted path."""
    if callable(spec):
        return spec
    if isinstance(spec, str):
        try:
            target = import_string(spec)
        except ImportError as exc:
            raise PolicyError(check_id, f"{what} {spec!r} cannot be imported: {exc}") from exc
        if callable(target):
            return target  # type: ignore[no-any-return]
    raise PolicyError(check_id, f"{what} {spec!r} is not callable")


def count_failures_rule(name: str, algorithm: str, spec: object) -> FailureRule | None:
    """The ``count_failures`` option as the Django layers read it (None: off); redislua.E030
    when it is none of its forms, or on a concurrency policy."""
    if spec is None or spec is False:
        return None
    what = f"policy {name!r}: count_failures"
    if algorithm == "concurrency":
        raise PolicyError(
            "redislua.E030", f"{what} does not apply to a concurrency policy (its slot is "
            "given back when the response is done, failed or not)")
    if spec is True:
        return CLIENT_ERROR_STATUSES
    if isinstance(spec, list | tuple | set | frozenset):
        if spec and all(type(s) is int and 100 <= s <= 599 for s in spec):
            return frozenset(spec)
        raise PolicyError(
            "redislua.E030",
            f"{what} must list HTTP status codes (100-599), such as [401, 403], not {spec!r:.60}")
    if callable(spec) or (isinstance(spec, str) and DOTTED_PATH.fullmatch(spec)):
        return resolve_callable(spec, "redislua.E030", what)
    raise PolicyError(
        "redislua.E030",
        f"{what} must be True (a 4xx response is a failure), a list of status codes such as "
        f"[401], or a callable (request, response) -> bool or its dotted path, not {spec!r:.60}")


def methods_of(name: str, methods: Sequence[str] | str | None) -> frozenset[str] | None:
    if methods is None:
        return None
    if isinstance(methods, str):
        methods = [methods]
    try:
        result = frozenset(m.upper() for m in methods)
    except (TypeError, AttributeError):
        raise PolicyError(
            "redislua.E011", f"policy {name!r}: methods must be a list of HTTP method names"
        ) from None
    if not result or not all(m.isalpha() for m in result):
        raise PolicyError(
            "redislua.E011", f"policy {name!r}: methods {sorted(result)!r} are not HTTP methods"
        )
    return result
