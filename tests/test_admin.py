"""The "Redis Lua" admin page against a real Redis: permissions, CSRF, the admin log, paging."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import Client
from django.utils.html import escape
from redis.cluster import RedisCluster

from django_redislua import get_policy
from django_redislua.admin import _readable, duration, relative
from django_redislua.connection import primary_nodes
from django_redislua.limiting import inspect
from django_redislua.limiting.definition import ALGORITHMS
from django_redislua.limiting.inspect import PACKED
from django_redislua.locks import Lock
from django_redislua.models import RedisLua

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.testapp.admin_urls"),
              pytest.mark.topologies]

BASE = "/admin/django_redislua/redislua/"
KEYS_URL = BASE
SCRIPTS_URL = BASE + "scripts/"
RESET_URL = BASE + "reset/"
LOCKS_URL = BASE + "locks/"
RELEASE_URL = BASE + "locks/release/"
LOGIN_KEY = "rl:login:sl:{203.0.113.7}"


def _user(name: str, *perms: str, staff: bool = True) -> User:
    user = User.objects.create_user(name, password="pw", is_staff=staff)
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_redislua", codename=codename)
        )
    return user


@pytest.fixture
def login_as() -> Callable[..., Client]:
    def make(*perms: str, staff: bool = True, csrf: bool = False) -> Client:
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(_user(f"u{len(perms)}{staff}{csrf}", *perms, staff=staff))
        return client

    return make


@pytest.fixture
def limited_key() -> str:
    """The "login" policy (sliding_log, 5/m) used up by one IP: remaining 0."""
    policy = get_policy("login")
    for _ in range(5):
        assert policy.hit("203.0.113.7").allowed
    assert not policy.hit("203.0.113.7").allowed
    return LOGIN_KEY


def _csrf_token(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return str(response.context["csrf_token"])


# -- the anchor model --------------------------------------------------------------------------
def test_anchor_model_has_no_table_and_only_view_and_change_permissions() -> None:
    assert RedisLua._meta.db_table not in connection.introspection.table_names()
    codenames = set(
        Permission.objects.filter(content_type__app_label="django_redislua")
        .values_list("codename", flat=True)
    )
    assert codenames == {"view_redislua", "change_redislua"}


def test_admin_index_lists_the_page_for_a_viewer(login_as: Callable[..., Client]) -> None:
    response = login_as("view_redislua").get("/admin/")
    assert response.status_code == 200
    assert f'href="{KEYS_URL}"' in response.content.decode()
    assert "Redis Lua" in response.content.decode()


# -- permissions -------------------------------------------------------------------------------
def test_anonymous_is_sent_to_the_admin_login(r: redis.Redis, limited_key: str) -> None:
    client = Client()
    for url in (KEYS_URL, SCRIPTS_URL, f"{RESET_URL}?key={limited_key}"):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")
    response = client.post(RESET_URL, {"key": limited_key})
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert r.exists(limited_key)


def test_non_staff_user_is_sent_to_the_admin_login(login_as: Callable[..., Client]) -> None:
    response = login_as("view_redislua", "change_redislua", staff=False).get(KEYS_URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_staff_without_permission_gets_403(
    login_as: Callable[..., Client], r: redis.Redis, limited_key: str
) -> None:
    client = login_as()
    assert f'href="{KEYS_URL}"' not in client.get("/admin/").content.decode()
    assert client.get(KEYS_URL).status_code == 403
    assert client.get(SCRIPTS_URL).status_code == 403
    assert client.post(RESET_URL, {"key": limited_key}).status_code == 403
    assert r.exists(limited_key)


def test_view_only_sees_state_but_no_buttons_and_gets_403_on_post(
    login_as: Callable[..., Client], r: redis.Redis, limited_key: str
) -> None:
    client = login_as("view_redislua")
    response = client.get(KEYS_URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert "203.0.113.7" in html
    assert '<meter min="0" max="5"' in html and 'value="0"' in html
    assert RESET_URL not in html and ">Reset<" not in html
    assert client.get(f"{RESET_URL}?key={limited_key}").status_code == 403
    assert client.post(RESET_URL, {"key": limited_key}).status_code == 403
    assert r.exists(limited_key)
    assert not LogEntry.objects.exists()


def test_change_user_confirms_then_resets_and_it_is_logged(
    login_as: Callable[..., Client], r: redis.Redis, limited_key: str
) -> None:
    client = login_as("change_redislua", csrf=True)
    listing = client.get(KEYS_URL).content.decode()
    assert f"{RESET_URL}?key=rl%3Alogin%3Asl%3A%7B203.0.113.7%7D" in listing

    confirm = client.get(RESET_URL, {"key": limited_key})
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert "Yes, reset it" in html and 'method="post"' in html and limited_key in html
    assert "0 of 5 remaining" in html
    assert r.exists(limited_key), "the confirmation page must change nothing"

    response = client.post(RESET_URL, {
        "key": limited_key, "next": KEYS_URL, "csrfmiddlewaretoken": confirm.context["csrf_token"],
    })
    assert response.status_code == 302 and response["Location"] == KEYS_URL
    assert not r.exists(limited_key)
    assert get_policy("login").peek("203.0.113.7").remaining == 5

    entry = LogEntry.objects.get()
    assert entry.action_flag == CHANGE
    assert entry.user.username.startswith("u1")
    assert entry.content_type == ContentType.objects.get_for_model(RedisLua)
    assert entry.object_id == limited_key
    assert "Reset rate-limit key" in entry.get_change_message()
    assert "Reset rl:login:sl:{203.0.113.7}" in client.get(KEYS_URL).content.decode()


def test_reset_refuses_keys_that_are_not_ours(
    login_as: Callable[..., Client], r: redis.Redis
) -> None:
    r.set("session:abc", "x")
    r.set("rl:login:sl:no-braces", "x")
    client = login_as("change_redislua")
    for key in ("session:abc", "rl:login:sl:no-braces"):
        assert client.post(RESET_URL, {"key": key}).status_code == 400
        assert r.exists(key)
    assert not LogEntry.objects.exists()


def test_reset_of_a_key_already_gone_writes_no_log(login_as: Callable[..., Client]) -> None:
    response = login_as("change_redislua").post(RESET_URL, {"key": LOGIN_KEY}, follow=True)
    assert "was already gone" in response.content.decode()
    assert not LogEntry.objects.exists()


def test_next_cannot_redirect_off_the_page(
    login_as: Callable[..., Client], limited_key: str
) -> None:
    response = login_as("change_redislua").post(
        RESET_URL, {"key": limited_key, "next": "https://evil.example/"}
    )
    assert response["Location"] == KEYS_URL


# -- CSRF --------------------------------------------------------------------------------------
def test_reset_post_without_csrf_token_is_refused(
    login_as: Callable[..., Client], r: redis.Redis, limited_key: str
) -> None:
    client = login_as("change_redislua", csrf=True)
    assert client.post(RESET_URL, {"key": limited_key}).status_code == 403
    forged = {"key": limited_key, "csrfmiddlewaretoken": "x" * 64}
    assert client.post(RESET_URL, forged).status_code == 403
    assert r.exists(limited_key)
    token = _csrf_token(client, f"{RESET_URL}?key={limited_key}")
    signed = {"key": limited_key, "csrfmiddlewaretoken": token}
    assert client.post(RESET_URL, signed).status_code == 302
    assert not r.exists(limited_key)


# -- what the page shows -----------------------------------------------------------------------
def test_empty_redis(login_as: Callable[..., Client], r: redis.Redis) -> None:
    assert keys_in(r) == 0
    client = login_as("view_redislua")
    response = client.get(KEYS_URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert "No rate-limit keys in Redis right now" in html
    assert "more…" not in html
    assert response.context["page"].cursor == ""
    assert "0 keys" in html  # the server line: DBSIZE
    scripts = client.get(SCRIPTS_URL).content.decode()
    assert "django_redislua.ratelimit" in scripts and "not loaded" in scripts


def test_every_algorithm_shows_remaining_reset_ttl_and_fields(
    login_as: Callable[..., Client], r: redis.Redis
) -> None:
    # Buckets refill fast and their keys expire when full: take enough to keep them a few seconds.
    costs = {"login": 1, "api": 10, "search": 40, "export": 1}
    for name, cost in costs.items():
        get_policy(name).hit("user:42", cost=cost)
    client = login_as("view_redislua")
    before = {name: get_policy(name).peek("user:42").remaining for name in costs}
    response = client.get(KEYS_URL, {"q": "user:42"})
    after = {name: get_policy(name).peek("user:42").remaining for name in costs}
    rows = {row["state"].policy_name: row for row in response.context["rows"]}
    assert set(rows) == {"login", "api", "search", "export"}
    assert before["login"] == 4 and before["export"] == 1
    assert 10 <= before["api"] < 20 and 10 <= before["search"] < 50
    for name, row in rows.items():
        state = row["state"]
        # Buckets refill between the peeks; what the page saw lies between them.
        assert state.remaining is not None
        assert before[name] <= state.remaining <= after[name], name
        assert state.limit == get_policy(name).limit
        assert state.ttl is not None and state.ttl > 0
        assert row["reset"].startswith("in ")
        assert state.fields, name
        code = ALGORITHMS[state.algorithm]
        if code in PACKED:  # packed doubles, shown field by field as whole numbers
            assert [n for n, _v in state.fields] == list(PACKED[code][1]), name
            assert all(v.isdigit() for _n, v in state.fields), state.fields
        assert state.memory and state.memory > 0
    scripts = client.get(SCRIPTS_URL).content.decode()
    assert "✔ loaded" in scripts  # the ratelimit script ran above


def test_search_by_identity_that_the_engine_hashed(login_as: Callable[..., Client]) -> None:
    get_policy("login").hit("a long identity with spaces")
    get_policy("login").hit("someone else")
    client = login_as("view_redislua")
    rows = client.get(KEYS_URL, {"q": "a long identity with spaces"}).context["rows"]
    assert len(rows) == 1
    assert rows[0]["state"].identity.startswith("#")


def test_policy_filter_and_a_policy_no_longer_configured(
    login_as: Callable[..., Client], r: redis.Redis
) -> None:
    get_policy("search").hit("k", cost=40)
    get_policy("login").hit("k")
    r.hset("rl:retired:fw:{k}", mapping={"s": 1, "n": 3})
    client = login_as("view_redislua")
    rows = client.get(KEYS_URL, {"policy": "search"}).context["rows"]
    assert [row["state"].policy_name for row in rows] == ["search"]
    response = client.get(KEYS_URL)
    retired = next(row for row in response.context["rows"] if row["state"].policy_name == "retired")
    assert retired["state"].remaining is None and retired["state"].ttl is None
    assert "not in use" in response.content.decode()


def test_inline_and_drf_policies_are_known_with_quota_and_reset(
    login_as: Callable[..., Client], client: Client
) -> None:
    """Keys of inline @ratelimit policies and of DRF scopes used to read "not configured",
    with no quota and no reset time."""
    from django_redislua import drf
    from django_redislua.discovery import policies_in_use

    client.get("/inline/")
    drf.scope_policy("anon", "1000/m").hit("throttle_anon_1.2.3.4")
    in_use = policies_in_use()
    inline = next(name for name, e in in_use.items() if e.source == "view inline/")
    assert in_use["anon"].source == "DRF scope" and in_use["login"].source == "settings"
    response = login_as("view_redislua").get(KEYS_URL)
    by_policy = {row["state"].policy_name: row["state"] for row in response.context["rows"]}
    for name in (inline, "anon"):
        state = by_policy[name]
        assert state.limit is not None and state.remaining is not None
        assert state.reset_after is not None and state.reset_after > 0
    page = response.content.decode()
    assert "view inline/" in page and "DRF scope" in page


def test_a_bad_cursor_is_a_400(login_as: Callable[..., Client]) -> None:
    assert login_as("view_redislua").get(KEYS_URL, {"cursor": "x-y"}).status_code == 400


def test_redis_down_shows_an_error_not_a_500(
    login_as: Callable[..., Client], settings: Any
) -> None:
    from django_redislua.testing import free_port

    settings.REDISLUA = {**settings.REDISLUA, "CONNECTION": f"redis://127.0.0.1:{free_port()}/0"}
    client = login_as("view_redislua")
    response = client.get(KEYS_URL)
    assert response.status_code == 200
    assert "Redis did not answer" in response.content.decode()
    assert client.get(SCRIPTS_URL).status_code == 200


@pytest.mark.parametrize(("seconds", "text"), [
    (0.25, "250 ms"), (4.24, "4.2 s"), (42, "42 s"), (185, "3 min 5 s"), (3600, "1 h"),
    (7800, "2 h 10 min"), (90000, "1 d 1 h"),
])
def test_durations_read_like_text(seconds: float, text: str) -> None:
    assert duration(seconds) == text
    assert relative(seconds) == f"in {text}"
    assert relative(-seconds) == f"{text} ago"


def test_stored_instants_read_relative_to_the_server_clock() -> None:
    now = 1_795_312_102.5
    assert _readable("1795312105500000", now) == "in 3.0 s"
    assert _readable("15:1795312100000000", now) == "15 · 2.5 s ago"
    assert _readable("7", now) == "7"
    assert _readable("abc:1795312105500000", now) == "abc · in 3.0 s"


# -- locks -------------------------------------------------------------------------------------
@pytest.fixture
def held_lock() -> Iterator[Lock]:
    lock = Lock("report:daily", timeout=30, reentrant=True)
    assert lock.acquire(blocking=False) and lock.acquire(blocking=False)  # entered twice
    yield lock
    if lock.owned():
        lock.release()
        lock.release()


def test_view_only_sees_held_locks_without_buttons(
    login_as: Callable[..., Client], held_lock: Lock
) -> None:
    client = login_as("view_redislua")
    response = client.get(LOCKS_URL)
    assert response.status_code == 200
    [row] = response.context["rows"]
    lock = row["lock"]
    assert (lock.name, lock.owner, lock.fencing_token, lock.reentry_count, lock.waiters) == (
        "report:daily", held_lock.owner, held_lock.token, 2, 0
    )
    assert row["ttl"].endswith(" s") and 25 <= lock.ttl <= 30  # type: ignore[operator]
    html = response.content.decode()
    assert "report:daily" in html and "Force release" not in html and RELEASE_URL not in html
    assert client.get(RELEASE_URL, {"name": "report:daily"}).status_code == 403
    assert client.post(RELEASE_URL, {"name": "report:daily"}).status_code == 403
    assert held_lock.owned()


def test_change_user_force_releases_a_lock_and_wakes_its_waiter(
    login_as: Callable[..., Client], held_lock: Lock
) -> None:
    waiter = Lock("report:daily", timeout=30)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire(blocking_timeout=10)))
    thread.start()
    client = login_as("change_redislua", csrf=True)
    deadline = time.monotonic() + 5
    while client.get(LOCKS_URL).context["rows"][0]["lock"].waiters != 1:
        assert time.monotonic() < deadline, "the waiter never showed up"
        time.sleep(0.05)
    assert "Force release" in client.get(LOCKS_URL).content.decode()

    confirm = client.get(RELEASE_URL, {"name": "report:daily"})
    assert confirm.status_code == 200 and "Yes, release it" in confirm.content.decode()
    assert confirm.context["held"].owner == held_lock.owner
    assert f"fencing token {held_lock.token}" in confirm.content.decode()
    assert "1 waiter." in confirm.content.decode()
    assert held_lock.owned(), "the confirmation page must change nothing"
    assert client.post(RELEASE_URL, {"name": "report:daily"}).status_code == 403  # no CSRF token
    assert held_lock.owned()
    response = client.post(RELEASE_URL, {
        "name": "report:daily", "csrfmiddlewaretoken": confirm.context["csrf_token"],
    })
    assert response.status_code == 302 and response["Location"] == LOCKS_URL
    thread.join(10)
    assert got == [True], "the waiter is woken and takes the lock"
    assert waiter.owned() and not held_lock.owned()
    assert waiter.token is not None and held_lock.token is not None
    assert waiter.token > held_lock.token
    waiter.release()

    entry = LogEntry.objects.get()
    assert entry.action_flag == CHANGE and entry.object_id == "rl:lock:{report:daily}"
    assert entry.get_change_message() == "Force-released lock report:daily."


def test_force_release_of_a_lock_not_held(login_as: Callable[..., Client]) -> None:
    response = login_as("change_redislua").post(RELEASE_URL, {"name": "nobody"}, follow=True)
    assert "was not held" in response.content.decode()
    assert not LogEntry.objects.exists()


def test_no_locks(login_as: Callable[..., Client]) -> None:
    response = login_as("view_redislua").get(LOCKS_URL)
    assert "No locks are held right now." in response.content.decode()
    assert response.context["more_url"] is None


# -- paging over a big keyspace ----------------------------------------------------------------
NOISE = 100_000
OURS = 300
# Keys one fill script writes: each call stays far below the test client's socket timeout
# on a loaded machine (10,000 SETs in one call, on a six-node cluster sharing two busy cores,
# outlasted it once in CI).
FILL_BATCH = 1_000
_FILL = """
for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
  redis.call('SET', ARGV[1] .. i, 'x')
end
return 1
"""


def keys_in(r: Any) -> int:
    """Every primary's key count (a cluster client's DBSIZE asks one node)."""
    return sum(node.dbsize() for _name, node in primary_nodes(r))


def fill(r: Any, count: int) -> None:
    """``count`` keys no policy owns, written server-side ``FILL_BATCH`` at a time; on a
    cluster an equal share on every primary, each share under a hash tag that primary serves
    (a script may only touch its own node's keys)."""
    if not isinstance(r, RedisCluster):
        for start in range(0, count, FILL_BATCH):
            r.eval(_FILL, 0, "other:", start, min(count, start + FILL_BATCH) - 1)
        return
    primaries = r.get_primaries()
    share = -(-count // len(primaries))
    for n, node in enumerate(primaries):
        tag = next(str(t) for t in range(10_000)
                   if r.get_node_from_key(f"{{{t}}}").name == node.name)
        conn = r.get_redis_connection(node)
        stop = min(count, (n + 1) * share)
        for start in range(n * share, stop, FILL_BATCH):
            conn.eval(_FILL, 0, f"other:{{{tag}}}:", start, min(stop, start + FILL_BATCH) - 1)


def assert_scan_links(html: str, more_url: str | None, page_number: int) -> None:
    """The paging links of a SCAN-paged page (scan_links.html): "first page" from the second
    page on, "more…" to exactly the next page's URL while the scan has more."""
    assert ("first page</a>" in html) == (page_number > 1)
    assert ("redislua-more" in html) == (more_url is not None)
    if more_url is not None:
        assert f'<a href="{escape(more_url)}" class="redislua-more">more…</a>' in html


def test_paging_with_100k_keys_present(
    login_as: Callable[..., Client], r: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    fill(r, NOISE)
    api = get_policy("login")  # sliding_log 5/m: keys live a minute
    for i in range(OURS):
        api.hit(f"user:{i}")
    assert keys_in(r) == NOISE + OURS

    client = login_as("view_redislua")
    seen: set[str] = set()
    timings: list[float] = []
    url: str | None = KEYS_URL
    pages = 0
    while url is not None:
        pages += 1
        assert pages <= 200, "paging must terminate"
        started = time.perf_counter()
        response = client.get(url)
        timings.append(time.perf_counter() - started)
        assert response.status_code == 200
        page = response.context["page"]
        assert page.scan_calls <= inspect.MAX_SCAN_CALLS
        assert len(page.keys) <= inspect.PAGE_SIZE + inspect.MAX_SCAN_COUNT
        seen.update(state.key for state in page.keys)
        url = response.context["more_url"]
        assert_scan_links(response.content.decode(), url, pages)
    with capsys.disabled():
        print(
            f"\nadmin paging, {NOISE + OURS} keys: first page {timings[0] * 1000:.0f} ms, "
            f"slowest {max(timings) * 1000:.0f} ms, {pages} pages to cover the keyspace"
        )
    assert seen == {api.redis_key(f"user:{i}") for i in range(OURS)}
    assert timings[0] < 2.0 and max(timings) < 2.0

    held = Lock("needle", timeout=30)
    assert held.acquire(blocking=False)
    url, pages, found = LOCKS_URL, 0, []
    while url is not None:
        pages += 1
        assert pages <= 200, "paging must terminate"
        started = time.perf_counter()
        response = client.get(url)
        assert time.perf_counter() - started < 2.0
        assert response.context["scan_calls"] <= inspect.MAX_SCAN_CALLS
        found += [row["lock"].name for row in response.context["rows"]]
        url = response.context["more_url"]
        assert_scan_links(response.content.decode(), url, pages)
    assert found == ["needle"]
    held.release()

    started = time.perf_counter()
    rows = client.get(KEYS_URL, {"q": api.redis_key("user:7")}).context["rows"]
    assert [row["state"].identity for row in rows] == ["user:7"]
    assert time.perf_counter() - started < 2.0


def test_scan_is_bounded_and_never_uses_keys(
    login_as: Callable[..., Client], r: redis.Redis, recorder: Any
) -> None:
    fill(r, 20_000)
    client = login_as("view_redislua")
    with recorder:
        client.get(KEYS_URL)
    assert "KEYS" not in recorder.commands
    assert 1 <= recorder.commands.count("SCAN") <= inspect.MAX_SCAN_CALLS


def test_scripts_page_shows_the_functions_library_per_node(
    login_as: Callable[..., Client], r: redis.Redis
) -> None:
    from io import StringIO

    from django.core.management import call_command

    from django_redislua.scripts import registry

    client = login_as("view_redislua")
    lib_name = registry.library()[0]
    before = client.get(SCRIPTS_URL)
    primaries = len(primary_nodes(r))
    assert [node.functions for node in before.context["nodes"]] == ["not loaded"] * primaries
    assert lib_name in before.content.decode()
    call_command("redislua_preload", "--functions", stdout=StringIO())
    after = client.get(SCRIPTS_URL)
    assert [node.functions for node in after.context["nodes"]] == ["loaded"] * primaries


def test_scripts_page_shows_each_primarys_eviction_policy(
    login_as: Callable[..., Client], r: Any
) -> None:
    """Issue 35: an evicting maxmemory-policy can drop a held lock; the server tab says so per
    primary (one of a cluster's set to volatile-ttl, the others left at noeviction)."""
    client = login_as("view_redislua")
    nodes = primary_nodes(r)
    evicting_name, evicting = nodes[0]
    evicting.config_set("maxmemory-policy", "volatile-ttl" if len(nodes) > 1 else "allkeys-lru")
    try:
        html = client.get(SCRIPTS_URL).content.decode()
    finally:
        evicting.config_set("maxmemory-policy", "noeviction")
    for name, _node in nodes:
        row = html.split(f'<tr data-node="{name}">', 1)[1].split("</tr>", 1)[0]
        if name == evicting_name:
            policy = "volatile-ttl" if len(nodes) > 1 else "allkeys-lru"
            assert f"⚠ {policy}: can evict locks and limits" in row, row
        else:
            assert "✔ noeviction" in row, row
    assert "✔ noeviction" in client.get(SCRIPTS_URL).content.decode()



def test_the_search_boxes_suggest_identities_the_keys_yield(
        login_as: Callable[..., Client]) -> None:
    """Issue 35: the boxes suggested "user:42", a form no key yields (the user keys yield
    "u42", docs/views.md's identity table)."""
    client = login_as("change_redislua")
    for url in (KEYS_URL, f"{BASE}overrides/", f"{BASE}overrides/set/"):
        html = client.get(url).content.decode()
        assert "user:42" not in html, url
        assert "203.0.113.7 or u42" in html, url
