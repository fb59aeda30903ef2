"""django-ratelimit's ``@ratelimit(group, key, rate, method, block)`` on this engine."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.conf import settings as django_settings
from django.http import HttpRequest
from django.utils.module_loading import import_string

from django_redislua.atransport import arun
from django_redislua.compat.core import ALL, UNSAFE, Usage, usage
from django_redislua.compat.exceptions import Ratelimited
from django_redislua.protocol import Invoke, Protocol
from django_redislua.transport import run

ViewT = TypeVar("ViewT", bound=Callable[..., Any])


def _raise(usage: Usage) -> None:
    configured = getattr(django_settings, "RATELIMIT_EXCEPTION_CLASS", None)
    if configured is None:
        decision = usage.get("decision")
        raise Ratelimited([decision] if decision is not None else [])
    # As django-ratelimit: the class (or its dotted path), built without arguments.
    cls = import_string(configured) if isinstance(configured, str) else configured
    raise cls()


def _record(request: HttpRequest, usage: Usage | None) -> bool:
    limited = bool(usage and usage["should_limit"])
    request.limited = limited or getattr(request, "limited", False)  # type: ignore[attr-defined]
    return limited


def ratelimit(
    group: str | None = None, key: Any = None, rate: Any = None,
    method: Sequence[str] | str | tuple[None] = ALL, block: bool = True,
) -> Callable[[ViewT], ViewT]:
    """Count the request; over the limit: raise ``Ratelimited`` (block) or set ``request.limited``.

    As in django-ratelimit, each decorator counts on its own (stacked ones are not combined;
    use :func:`django_redislua.decorators.ratelimit` for one all-or-nothing call).
    """

    def guarded(request: HttpRequest, fn: Any, view: Callable[[], Any]) -> Protocol[Any]:
        found = yield from usage(request, group, fn, key, rate, method, True)
        if _record(request, found) and block and found is not None:
            _raise(found)
        return (yield Invoke(view))

    def decorator(fn: ViewT) -> ViewT:
        if iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def awrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                view = functools.partial(fn, request, *args, **kwargs)
                return await arun(guarded(request, fn, view))

            return cast(ViewT, awrapped)

        @functools.wraps(fn)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return run(guarded(request, fn, functools.partial(fn, request, *args, **kwargs)))

        return cast(ViewT, wrapped)

    return decorator


ratelimit.ALL = ALL  # type: ignore[attr-defined]
ratelimit.UNSAFE = UNSAFE  # type: ignore[attr-defined]
