"""The example project's recipe pages, in-process against the suite's real Redis: the flash sale
(an Inventory behind the demo's "flash-sale" policy) and the work queue."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

EXAMPLE = Path(__file__).resolve().parent.parent / "example_project"

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The demo's URLs, templates and policies (on the suite's Redis); yields demo.views."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from demo import settings as demo_settings
    from demo import views

    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "demo"]
    settings.ROOT_URLCONF = "demo.urls"
    settings.REDISLUA = {**settings.REDISLUA, "POLICIES": demo_settings.REDISLUA["POLICIES"]}
    yield views


def _buy(client: Client, order_id: str, qty: int = 1, action: str = "buy") -> Any:
    return client.post("/flash-sale/", {"order_id": order_id, "qty": qty, "action": action})


def test_index_links_both_pages(demo: Any) -> None:
    html = Client().get("/").content.decode()
    assert 'href="/flash-sale/"' in html and 'href="/queue/"' in html


def test_buying_takes_once_per_order_id_and_a_refund_gives_back_once(demo: Any) -> None:
    client = Client()
    page = client.get("/flash-sale/")
    assert page.status_code == 200 and page.context["left"] == 20
    order_id = page.context["order_id"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{16}", order_id)
    assert f'value="{order_id}"' in page.content.decode()
    assert client.get("/flash-sale/").context["order_id"] != order_id  # one per render

    bought = _buy(client, order_id, qty=2)
    assert bought.status_code == 200
    assert (bought.context["reason"], bought.context["ok"], bought.context["left"]) == (
        "ok", True, 18)
    assert "Units left: <strong>18</strong>" in bought.content.decode()
    for _ in range(2):  # a double submit, then a retry of the same form
        again = _buy(client, order_id, qty=2)
        assert (again.context["reason"], again.context["ok"], again.context["left"]) == (
            "duplicate_order", True, 18)
    assert demo.SALE.level(demo.SKU) == 18

    refunded = _buy(client, order_id, action="refund")
    assert (refunded.context["reason"], refunded.context["left"]) == ("refunded", 20)
    # Four of the 5 POSTs a minute this address may make are used: another for the rest.
    other = Client(REMOTE_ADDR="198.51.100.7")
    assert _buy(other, order_id, action="refund").context["reason"] == "already_given_back"
    assert _buy(other, order_id).context["reason"] == "duplicate_order"  # an id is used once
    assert demo.SALE.level(demo.SKU) == 20


def test_the_sale_never_sells_more_than_it_has(demo: Any) -> None:
    client = Client()
    client.get("/flash-sale/")
    demo.SALE.set(demo.SKU, 2)
    assert _buy(client, "order-aaaaaaaa", qty=3).context["reason"] == "insufficient"
    assert _buy(client, "order-bbbbbbbb", qty=2).context["reason"] == "ok"
    sold_out = _buy(client, "order-cccccccc")
    assert (sold_out.context["reason"], sold_out.context["left"]) == ("insufficient", 0)
    assert "Sold out" in sold_out.content.decode()
    restarted = client.post("/flash-sale/", {"action": "restart"})
    assert restarted.context["left"] == 20


def test_orders_are_rate_limited_and_a_denied_order_takes_nothing(demo: Any) -> None:
    client = Client()
    for _ in range(10):  # reading the page is free
        assert client.get("/flash-sale/").status_code == 200
    for n in range(5):
        assert _buy(client, f"order-{n:08d}").context["reason"] == "ok"
    denied = _buy(client, "order-99999999")
    assert denied.status_code == 429
    assert denied.context["reason"] == "rate_limited" and denied.context["left"] == 15
    assert int(denied["Retry-After"]) > 0
    assert "Nothing was taken" in denied.content.decode()
    assert _buy(Client(REMOTE_ADDR="198.51.100.8"), "order-99999999").status_code == 200


@pytest.mark.parametrize("data", [
    {"order_id": "short"}, {"order_id": "x" * 65}, {"order_id": "<script>alert(1)</script>"},
    {"order_id": "order-aaaaaaaa", "qty": "4"}, {"order_id": "order-aaaaaaaa", "qty": "x"},
])
def test_a_bad_order_is_a_400_and_takes_nothing(demo: Any, data: dict[str, str]) -> None:
    response = Client().post("/flash-sale/", data)
    assert response.status_code == 400
    assert response.context["left"] == 20
    assert "<script>alert" not in response.content.decode()


def test_queue_put_claim_ack_release(demo: Any) -> None:
    client = Client()
    page = client.get("/queue/")
    assert page.status_code == 200 and page.context["stats"] == (0, 0, 0, 0)
    for job in ("send the newsletter", "resize the photos"):
        put = client.post("/queue/", {"action": "put", "payload": job})
        assert put.status_code == 200 and put.context["message"].startswith("Put task ")
    assert put.context["stats"] == (2, 0, 0, 0)

    claimed = client.post("/queue/", {"action": "claim"})
    task = claimed.context["task"]
    assert task.payload == {"job": "send the newsletter"} and task.attempts == 1
    assert claimed.context["stats"] == (1, 1, 0, 0)
    assert f'value="{task.token}"' in claimed.content.decode()
    acked = client.post("/queue/", {"action": "ack", "task_id": task.id, "token": task.token})
    assert acked.context["done"] is True and acked.context["stats"] == (1, 0, 0, 0)
    again = client.post("/queue/", {"action": "ack", "task_id": task.id, "token": task.token})
    assert again.context["done"] is False  # the claim is gone: nothing changes
    assert "Nothing changed: this claim no longer holds task" in again.content.decode()

    second = client.post("/queue/", {"action": "claim"}).context["task"]
    released = client.post("/queue/", {"action": "release", "task_id": second.id,
                                       "token": second.token})
    assert released.context["done"] is True and released.context["stats"] == (1, 0, 0, 0)
    assert demo.JOBS.claim().payload == {"job": "resize the photos"}  # back in the queue


def test_queue_claims_at_most_three_and_refuses_a_forged_claim(demo: Any) -> None:
    client = Client()
    for n in range(4):
        client.post("/queue/", {"action": "put", "payload": f"job {n}"})
    for _ in range(3):
        assert client.post("/queue/", {"action": "claim"}).context["task"] is not None
    fourth = client.post("/queue/", {"action": "claim"})
    assert "task" not in fourth.context and "Nothing to claim" in fourth.content.decode()
    assert fourth.context["stats"] == (1, 3, 0, 0)
    forged = client.post("/queue/", {"action": "ack", "task_id": "1", "token": "x" * 32})
    assert forged.status_code == 400
    stolen = client.post("/queue/", {"action": "ack", "task_id": "1", "token": "0" * 32})
    assert stolen.context["done"] is False and stolen.context["stats"] == (1, 3, 0, 0)
    assert client.post("/queue/", {"action": "nope"}).status_code == 400


def test_redis_down_is_a_503_page_not_a_500(demo: Any, settings: Any) -> None:
    from django_redislua.testing import free_port

    settings.REDISLUA = {**settings.REDISLUA, "CONNECTION": f"redis://127.0.0.1:{free_port()}/0"}
    for url in ("/flash-sale/", "/queue/"):
        response = Client().get(url)
        assert response.status_code == 503
        assert "Redis is unavailable" in response.content.decode()
