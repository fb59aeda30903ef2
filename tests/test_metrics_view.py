"""The /metrics view (django_redislua.urls): Prometheus's text format of the default registry,
for staff sessions and the METRICS_TOKEN bearer only."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client, override_settings

from django_redislua import Policy
from django_redislua.checks import check_settings

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.metrics_urls")]
TOKEN = "a-scrape-token-of-32-characters!"


def redislua(**changes: object) -> override_settings:
    return override_settings(REDISLUA={**settings.REDISLUA, **changes})


def test_anonymous_is_refused_before_any_metric_is_read() -> None:
    response = Client().get("/metrics")
    assert response.status_code == 403
    assert b"redislua_" not in response.content


def test_a_staff_session_reads_the_metrics() -> None:
    Policy("mv-staff", rate="5/m").hit("k")
    web = Client()
    web.force_login(User.objects.create_user("ops", is_staff=True))
    response = web.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    assert ('redislua_decisions_total{algorithm="sliding_window",policy="mv-staff",'
            'result="allowed"}') in response.content.decode()
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


def test_a_logged_in_user_who_is_not_staff_is_refused() -> None:
    web = Client()
    web.force_login(User.objects.create_user("someone"))
    assert web.get("/metrics").status_code == 403


@pytest.mark.parametrize(("header", "status"), [
    (f"Bearer {TOKEN}", 200),
    (f"bearer {TOKEN}", 200),
    (f"Bearer {TOKEN[:-1]}", 403),
    (f"Bearer {TOKEN}x", 403),
    (f"Basic {TOKEN}", 403),
    ("Bearer ", 403),
    ("Bearer " + "x" * 1_000_000, 403),  # hostile: refused, no error
])
def test_the_bearer_token(header: str, status: int) -> None:
    with redislua(METRICS_TOKEN=TOKEN):
        assert Client().get("/metrics", HTTP_AUTHORIZATION=header).status_code == status


def test_no_token_configured_means_no_token_admits() -> None:
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 403
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer None").status_code == 403


@pytest.mark.parametrize("token", ["short", 12345, ["x" * 20]])
def test_a_weak_or_malformed_token_is_a_check_and_admits_nobody(token: object) -> None:
    with redislua(METRICS_TOKEN=token):
        assert "redislua.E027" in [m.id for m in check_settings()]
        assert Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 403


def test_only_get() -> None:
    with redislua(METRICS_TOKEN=TOKEN):
        assert Client().post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405
