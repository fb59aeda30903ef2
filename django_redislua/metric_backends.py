"""The metrics backends ``REDISLUA["METRICS"]`` can name, and whether each is installed.

Apart from :mod:`django_redislua.metrics` (which imports the settings) so that the settings
schema (:mod:`django_redislua.conf`) can check the setting without an import cycle.
"""

from __future__ import annotations

import importlib.util
from typing import Any

PROMETHEUS = "prometheus"
OPENTELEMETRY = "opentelemetry"
BACKENDS = (PROMETHEUS, OPENTELEMETRY)
# The module whose presence means the backend is installed.
MODULES = {PROMETHEUS: "prometheus_client", OPENTELEMETRY: "opentelemetry.metrics"}


def valid_setting(value: Any) -> bool:
    """``METRICS``: ``"auto"``, or a list (or tuple) of backend names, each at most once."""
    if value == "auto":
        return True
    return (isinstance(value, (list, tuple)) and all(v in BACKENDS for v in value)
            and len(set(value)) == len(value))


def installed(backend: str) -> bool:
    try:
        return importlib.util.find_spec(MODULES[backend]) is not None
    except ModuleNotFoundError:  # a parent package missing (``opentelemetry``)
        return False
