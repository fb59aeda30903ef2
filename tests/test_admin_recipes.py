"""The admin's Recipes tab against a real Redis (and the real cluster): live instances of every
recipe made by the recipes themselves, permissions, an unreachable Redis, hostile names, paging."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from django.contrib.auth.models import Permission, User
from django.test import Client

from django_redislua import Policy
from django_redislua.limiting import inspect as limiting_inspect
from django_redislua.limiting.identity import bound_identity
from django_redislua.locks import Lock
from django_redislua.recipes import (
    CappedCounter,
    Inventory,
    VersionedCache,
    WindowStats,
    WorkQueue,
    inspect,
)
from tests.test_admin import assert_scan_links, fill

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.testapp.admin_urls"),
              pytest.mark.topologies]

BASE = "/admin/django_redislua/redislua/"
RECIPES_URL = BASE + "recipes/"


def _client(*perms: str, staff: bool = True) -> Client:
    user = User.objects.create_user(f"u{len(perms)}{staff}", password="pw", is_staff=staff)
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_redislua", codename=codename)
        )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer() -> Client:
    return _client("view_redislua")


def _sections(response: Any) -> dict[str, list[Any]]:
    return {s["kind"]: [row["item"] for row in s["rows"]] for s in response.context["sections"]}


def test_every_recipe_is_listed_with_its_live_state(viewer: Client) -> None:
    stock = Inventory("flash-sale", ttl="1h")
    stock.set("sku-1", 20)
    assert stock.take("sku-1", 2, order_id="o-1").reason == "ok"
    assert stock.take("sku-1", 2, order_id="o-1").reason == "duplicate_order"  # a retry
    assert stock.take("sku-1", 1, order_id="o-2").reason == "ok"
    assert stock.give_back("sku-1", "o-2").ok
    stock.set("sku-2", 0)

    emails = WorkQueue("emails", visibility_timeout="5m")
    for n in range(3):
        emails.put({"n": n})
    assert emails.claim() is not None
    stalled = WorkQueue("reports", visibility_timeout=0.05, max_attempts=1)
    stalled.put("a")
    stalled.put("b")
    first = stalled.claim()
    assert first is not None and stalled.release(first)  # its one attempt used: dead
    assert stalled.claim() is not None  # and this claim's worker "dies"

    CappedCounter("downloads", cap=10, ttl="1h").add("user:42", 3)
    cache = VersionedCache("catalog")
    assert cache.set("page:1", {"items": [1, 2]}, version=7, ttl="1h")
    assert cache.get_or_build("page:2", lambda: "built", ttl=0.05, stale_ttl="1h") == "built"
    latency = WindowStats("latency", window="1m")
    for sample in (0.1, 0.2, 0.3):
        latency.add("checkout", sample)
    time.sleep(0.12)  # the "reports" claim and the "page:2" entry run out

    response = viewer.get(RECIPES_URL)
    assert response.status_code == 200
    found = _sections(response)
    assert [(s.name, s.sku, s.left, s.sold, s.orders) for s in found["stock"]] == [
        ("flash-sale", "sku-1", 18, 2, 2), ("flash-sale", "sku-2", 0, 0, 0)]
    assert found["stock"][0].ttl is not None and 3500 < found["stock"][0].ttl <= 3600
    assert [(q.name, q.pending, q.in_flight, q.expired, q.dead) for q in found["queue"]] == [
        ("emails", 2, 1, 0, 0), ("reports", 0, 1, 1, 1)]
    assert emails.stats() == (2, 1, 0, 0)  # the same figures as the recipe's own stats
    [counter] = found["cap"]
    assert (counter.name, counter.subject, counter.value) == ("downloads", "user:42", 3)
    assert counter.ttl is not None and 3500 < counter.ttl <= 3600
    fresh, stale = found["vcache"]
    assert (fresh.name, fresh.cache_key, fresh.version, fresh.fresh) == (
        "catalog", "page:1", 7, True)
    assert (stale.cache_key, stale.version, stale.fresh, stale.building) == (
        "page:2", 0, False, False)
    [window] = found["wstats"]
    assert (window.name, window.subject, window.samples, window.buckets) == (
        "latency", "checkout", 3, 1)

    html = response.content.decode()
    assert f'href="{RECIPES_URL}"' in html and 'aria-current="page">Recipes' in html
    for title in inspect.KINDS.values():
        assert title in html
    assert "fresh for" in html and "stale for" in html
    assert "8 instances on this page" in html
    assert "more…" not in html
    # Read-only: no buttons, no forms that post (the admin's own logout form is above the tab).
    main = html[html.index('id="content-main"'):]
    assert 'method="post"' not in main and "button redislua-danger" not in main
    # The tab is on every page of the admin section.
    assert f'href="{RECIPES_URL}"' in viewer.get(BASE).content.decode()


def test_one_kind_and_nothing_else_of_ours(viewer: Client) -> None:
    WorkQueue("emails").put("x")
    CappedCounter("downloads", cap=5, ttl=60).add("u1")
    # Keys of ours that are not recipes, one of them in a recipe's namespace: a policy named
    # "cap" writes rl:cap:fw:{x}, which has the shape of a counter but not its state.
    Policy("cap", rate="5/m", algorithm="fixed_window").hit("x")
    Policy("stock", rate="5/m", algorithm="sliding_log").hit("y")
    with Lock("nightly", timeout=30):
        every = _sections(viewer.get(RECIPES_URL))
        only = viewer.get(RECIPES_URL, {"kind": "queue"})
    assert {kind: [row.name for row in rows] for kind, rows in every.items()} == {
        "queue": ["emails"], "cap": ["downloads"]}
    assert list(_sections(only)) == ["queue"]
    assert 'value="queue" selected' in only.content.decode()


def test_empty_and_gone(viewer: Client) -> None:
    response = viewer.get(RECIPES_URL)
    assert "No recipe instances in Redis right now." in response.content.decode()
    queue = WorkQueue("emails")
    queue.put("x")
    queue.clear()
    stock = Inventory("sale")
    stock.set("a", 1)
    stock.clear("a")
    assert viewer.get(RECIPES_URL).context["sections"] == []
    none_of_kind = viewer.get(RECIPES_URL, {"kind": "stock"}).content.decode()
    assert "No live instance of this recipe." in none_of_kind


def test_bad_kind_or_cursor_is_a_400(viewer: Client) -> None:
    assert viewer.get(RECIPES_URL, {"kind": "nope"}).status_code == 400
    assert viewer.get(RECIPES_URL, {"cursor": "x-y"}).status_code == 400


def test_permissions() -> None:
    anonymous = Client().get(RECIPES_URL)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/")
    not_staff = _client("view_redislua", "change_redislua", staff=False).get(RECIPES_URL)
    assert not_staff.status_code == 302 and not_staff["Location"].startswith("/admin/login/")
    assert _client().get(RECIPES_URL).status_code == 403  # staff without the permission
    assert _client("change_redislua").get(RECIPES_URL).status_code == 200


def test_redis_down_shows_an_error_not_a_500(viewer: Client, settings: Any) -> None:
    from django_redislua.testing import free_port

    settings.REDISLUA = {**settings.REDISLUA, "CONNECTION": f"redis://127.0.0.1:{free_port()}/0"}
    response = viewer.get(RECIPES_URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Redis did not answer" in html
    assert response.context["page"] is None and "instances on this page" not in html


def test_hostile_names_are_bounded_and_escaped(viewer: Client) -> None:
    script = "<script>alert(1)</script>"
    long_sku = "a long SKU, with spaces " + "x" * 300
    stock = Inventory(script)
    stock.set(long_sku, 5)
    stock.set('"><img/src=x/onerror=alert(2)>', 1)
    CappedCounter("shop:eu", cap=3, ttl=60).add(script)
    response = viewer.get(RECIPES_URL)
    html = response.content.decode()
    assert script not in html and "<img/src" not in html and "&lt;img/src" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    skus = [s.sku for s in _sections(response)["stock"]]
    assert bound_identity(long_sku) in skus and len(bound_identity(long_sku)) == 23
    assert [(c.name, c.subject) for c in _sections(response)["cap"]] == [("shop:eu", script)]


def test_paging_is_bounded_and_finds_every_instance_once(
    viewer: Client, r: redis.Redis, recorder: Any
) -> None:
    fill(r, 20_000)
    counter = CappedCounter("downloads", cap=5, ttl=60)
    for n in range(120):
        counter.add(f"user:{n}")
    queue = WorkQueue("emails")
    queue.put("x")
    assert queue.claim() is not None  # the list of pending ids is gone; the queue is still found

    seen: list[str] = []
    queues: list[str] = []
    url: str | None = RECIPES_URL
    pages = 0
    with recorder:
        while url is not None:
            pages += 1
            assert pages <= 100, "paging must terminate"
            response = viewer.get(url)
            page = response.context["page"]
            assert page.scan_calls <= limiting_inspect.MAX_SCAN_CALLS
            assert page.count <= limiting_inspect.PAGE_SIZE + limiting_inspect.MAX_SCAN_COUNT
            seen += [row.subject for row in page.counters]
            queues += [row.name for row in page.queues]
            url = response.context["more_url"]
            assert_scan_links(response.content.decode(), url, pages)
    assert sorted(seen) == sorted(f"user:{n}" for n in range(120))
    assert queues == ["emails"]
    assert pages > 1
    assert "KEYS" not in recorder.commands
    assert 1 <= recorder.commands.count("SCAN") <= pages * limiting_inspect.MAX_SCAN_CALLS


@pytest.mark.parametrize(("key", "instance"), [
    ("rl:stock:flash-sale:{sku-1}", ("stock", "flash-sale", "sku-1")),
    ("rl:stock:flash-sale:{sku-1}:orders", None),
    ("rl:queue:{emails}:sequence", ("queue", "emails", "")),
    ("rl:queue:{emails}", None),
    ("rl:queue:{emails}:in_flight", None),
    ("rl:cap:shop:eu:{user:42}", ("cap", "shop:eu", "user:42")),
    ("rl:vcache:catalog:{page:1}:building", None),
    ("rl:wstats:latency:{checkout}", ("wstats", "latency", "checkout")),
    ("rl:login:sl:{203.0.113.7}", None),
    ("rl:lock:{report}", None),
    ("other:cap:a:{b}", None),
])
def test_parse_key(key: str, instance: tuple[str, str, str] | None) -> None:
    assert inspect.parse_key(key) == instance
