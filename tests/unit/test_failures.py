"""The protocols are sans-I/O: importing them loads neither Django nor redis-py nor the app's
metrics, and the failure families they match (django_redislua.failures) are the client's."""

from __future__ import annotations

import json
import subprocess
import sys

import redis
from django.core.exceptions import ImproperlyConfigured

from django_redislua import connection, failures

# What a protocol module must not bring with it: Django, any redis-py module (importing one
# runs redis-py's __init__, which loads its clients), the app's settings, metrics, clients.
FORBIDDEN = ("django", "redis", "django_redislua.conf", "django_redislua.metrics",
             "django_redislua.connection", "django_redislua.transport",
             "django_redislua.atransport", "django_redislua.exchange")


def loaded_by(*modules: str) -> list[str]:
    """The modules a fresh interpreter loads to import ``modules``."""
    code = ("import json, sys; before = set(sys.modules)\n"
            + "".join(f"import {name}\n" for name in modules)
            + "print(json.dumps(sorted(set(sys.modules) - before)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return list(json.loads(done.stdout))


def test_the_protocols_and_drivers_import_no_django_redis_py_or_metrics() -> None:
    loaded = loaded_by("django_redislua.protocol", "django_redislua.drivers")
    assert "django_redislua.protocol" in loaded
    found = [name for name in loaded
             if any(name == root or name.startswith(f"{root}.") for root in FORBIDDEN)]
    assert found == []


def test_the_client_family_is_the_request_layer_s() -> None:
    assert set(failures.families().client) == set(connection.CLIENT_ERRORS)


def test_each_family_names_the_classes_it_is_about() -> None:
    known = failures.families()
    assert known.busy == (redis.TimeoutError, connection.TornDown)
    assert known.redirects == (redis.exceptions.MovedError, redis.exceptions.AskError,
                               redis.exceptions.TryAgainError,
                               redis.exceptions.ClusterDownError)
    assert known.redis_or_socket == (redis.RedisError, OSError)
    assert ImproperlyConfigured in known.client


def test_a_family_is_what_is_loaded_until_every_module_it_names_is() -> None:
    code = """
import json, sys
from django_redislua import failures
empty = failures.families()
import redis
partial = failures.families()
import django.core.exceptions, django_redislua.connection
complete = failures.families()
print(json.dumps([len(empty.client), len(partial.client), len(partial.busy),
                  len(complete.client), len(complete.busy), complete is failures.families()]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    # Only OSError before redis-py; then redis-py's two (not Django's ImproperlyConfigured, nor
    # the connection module's TornDown: not loaded yet); then all of them, kept.
    assert json.loads(done.stdout) == [1, 3, 1, 4, 2, True]
