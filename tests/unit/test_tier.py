"""The unit tier itself: it reaches no Redis."""

from __future__ import annotations

import pytest

from django_redislua.connection import CLIENT_ERRORS
from django_redislua.limiting import Policy


def test_a_decision_in_the_unit_tier_cannot_reach_redis() -> None:
    with pytest.raises(CLIENT_ERRORS):
        Policy("unit", rate="5/m").hit("someone")
