"""The unit tier: tests that need no Redis at all (issue 36's test pyramid).

Everything under ``tests/unit/`` runs with no server reachable: the root conftest's per-test
flush is replaced by nothing, and ``REDISLUA["CONNECTION"]`` points at a closed port, so a test
that reaches for Redis by accident fails at once instead of quietly using one. Protocols are
driven by scripted replies and a virtual clock (``tests/unit/scripted.py``); keys, rates,
headers and checks are plain functions.

Run it alone: ``python3 dev.py test --unit`` (or ``pytest tests/unit``), with no Redis server
and no ``redis-server`` binary needed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings

from django_redislua.limiting import denials

NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens on port 1: a connection is refused at once


@pytest.fixture(autouse=True)
def _flush_redis() -> Iterator[None]:
    """No Redis to flush: every connection this tier's settings name is refused."""
    from tests.settings import REDISLUA

    denials.forget()
    with override_settings(REDISLUA={**REDISLUA, "CONNECTION": NOWHERE}):
        yield
