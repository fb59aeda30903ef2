"""The admin page in a real browser: Debian's headless Chromium driven by Playwright.

Needs the Debian packages ``chromium`` (and ``chromium-driver``); skipped with a reason when
``/usr/bin/chromium`` or the ``playwright`` package is missing. Never ``playwright install``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User

from django_redislua import Policy, get_policy
from django_redislua.connection import get_client
from django_redislua.locks import Lock

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# Set REDISLUA_SCREENSHOTS to a directory to keep the screenshots (docs/admin-screenshot.png
# is one of them); otherwise they go to the test's tmp_path.
SCREENSHOTS = os.environ.get("REDISLUA_SCREENSHOTS")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="no /usr/bin/chromium: apt-get install -y chromium chromium-driver"),
    pytest.mark.urls("tests.testapp.admin_urls"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")


@pytest.fixture
def admin_user(transactional_db: None) -> User:
    """A staff user with the app's change permission (created before the browser starts)."""
    user = User.objects.create_user("ops", password="correct horse", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_redislua"))
    return user


@pytest.fixture
def page(admin_user: User) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1360, "height": 860})
        tab = context.new_page()
        tab.set_default_timeout(10_000)
        try:
            yield tab
        finally:
            context.close()
            browser.close()


def _log_in(page: Any, live_server: Any, next_url: str) -> None:
    """Log in as the admin user through the admin's own form, landing on ``next_url``."""
    page.goto(f"{live_server.url}/admin/login/?next={next_url}")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")


def _shoot(page: Any, tmp_path: Path, name: str) -> Path:
    target = Path(SCREENSHOTS) if SCREENSHOTS else tmp_path
    target.mkdir(parents=True, exist_ok=True)
    path = target / name
    page.screenshot(path=str(path), full_page=True)
    print(f"\nscreenshot: {path}")
    return path


def test_limit_see_reset_lock_see_release(page: Any, live_server: Any, tmp_path: Path) -> None:
    base = live_server.url
    expect = sync_api.expect

    # Log in through the admin's own form.
    _log_in(page, live_server, "/admin/")
    index_link = page.get_by_role("rowheader", name="Redis Lua").get_by_role("link")
    expect(index_link).to_be_visible()

    # Hit the limited view ("login": sliding_log 5/m by IP) until it says no.
    statuses = [page.goto(f"{base}/limited/").status for _ in range(6)]
    assert statuses == [200] * 5 + [429]

    # Some other live state, so the page shows every kind of row.
    get_policy("api").hit("user:42", cost=14)
    get_policy("search").hit("user:42", cost=35)
    get_policy("export").hit("user:42")
    get_policy("login").hit("a visitor with a very long, unsafe identity")

    page.goto(f"{base}/admin/")
    index_link.click()
    row = page.locator("tr[data-key='rl:login:sl:{127.0.0.1}']")
    expect(row).to_be_visible()
    expect(row.locator(".redislua-remaining")).to_have_text(re.compile(r"^0\s*/\s*5$"))
    assert row.locator("meter").get_attribute("value") == "0"
    expect(page.locator("tr[data-key='rl:api:gc:{user:42}']")).to_be_visible()
    _shoot(page, tmp_path, "admin-screenshot.png")

    # Reset it: a confirmation page first, then the POST.
    row.get_by_role("link", name="Reset").click()
    expect(page.locator("#content h1")).to_have_text("Reset a rate-limit key?")
    page.get_by_role("button", name="Yes, reset it").click()
    expect(page.locator(".messagelist .success")).to_contain_text("Reset rl:login:sl:{127.0.0.1}")
    expect(page.locator("tr[data-key='rl:login:sl:{127.0.0.1}']")).to_have_count(0)
    assert page.goto(f"{base}/limited/").status == 200  # a full quota again

    # A held lock: seen on the Locks tab, then force-released.
    lock = Lock("nightly-report", timeout=60)
    assert lock.acquire(blocking=False)
    page.goto(f"{base}/admin/django_redislua/redislua/")
    page.get_by_role("link", name="Locks", exact=True).click()
    lock_row = page.locator("tr[data-lock='nightly-report']")
    expect(lock_row).to_be_visible()
    expect(lock_row).to_contain_text(str(lock.token))
    _shoot(page, tmp_path, "admin-locks-screenshot.png")
    lock_row.get_by_role("link", name="Force release").click()
    page.get_by_role("button", name="Yes, release it").click()
    expect(page.locator(".messagelist .success")).to_contain_text("Released lock nightly-report")
    expect(page.locator("tr[data-lock='nightly-report']")).to_have_count(0)
    assert not lock.owned() and not lock.locked()


def test_auto_refresh_toggle_reloads_the_page(page: Any, live_server: Any) -> None:
    expect = sync_api.expect
    _log_in(page, live_server, "/admin/django_redislua/redislua/")
    expect(page.locator("tr[data-key]")).to_have_count(0)

    get_policy("login").hit("198.51.100.9")  # appears only once the page reloads by itself
    toggle = page.locator("#redislua-autorefresh")
    expect(toggle).not_to_be_checked()
    toggle.check()
    expect(page.locator("tr[data-key='rl:login:sl:{198.51.100.9}']")).to_be_visible(timeout=8_000)
    expect(page.locator("#redislua-autorefresh")).to_be_checked()  # remembered across reloads
    page.locator("#redislua-autorefresh").uncheck()


def test_recipes_tab_lists_live_instances(page: Any, live_server: Any, tmp_path: Path) -> None:
    from django_redislua.recipes import (
        CappedCounter,
        Inventory,
        VersionedCache,
        WindowStats,
        WorkQueue,
    )

    expect = sync_api.expect
    stock = Inventory("flash-sale", ttl="1h")
    stock.set("sku-1", 20)
    for n in range(7):
        stock.take("sku-1", order_id=f"order-{n}")
    stock.set("sku-2", 0)
    queue = WorkQueue("emails")
    for n in range(5):
        queue.put({"to": f"user{n}@example.com"})
    queue.claim()
    CappedCounter("downloads", cap=1000, ttl="1d").add("user:42", 17)
    VersionedCache("catalog").set("page:1", ["item"], version=7, ttl="1h")
    latency = WindowStats("latency", window="1m")
    for sample in (0.12, 0.3, 0.08):
        latency.add("checkout", sample)
    Inventory("<b>hostile</b>").set("a-very-long-sku-" + "x" * 48, 3)

    _log_in(page, live_server, "/admin/django_redislua/redislua/")
    page.get_by_role("link", name="Recipes", exact=True).click()
    row = page.locator("tr[data-key='rl:stock:flash-sale:{sku-1}']")
    expect(row).to_be_visible()
    expect(row.locator("td").nth(2)).to_have_text("13")
    expect(page.locator("tr[data-key='rl:queue:{emails}'] td").nth(1)).to_have_text("4")
    expect(page.locator("#recipes-cap")).to_contain_text("user:42")
    expect(page.locator("#recipes-vcache")).to_contain_text("fresh for")
    expect(page.locator("#recipes-wstats")).to_contain_text("checkout")
    expect(page.locator("#recipes-stock")).to_contain_text("<b>hostile</b>")  # shown as text
    _shoot(page, tmp_path, "admin-recipes-screenshot.png")


def test_block_an_identity_from_the_keys_tab_then_clear_it(page: Any, live_server: Any,
                                                           tmp_path: Path) -> None:
    """The incident path: a key on the keys tab, "Block 1 h", the next request 429; the
    Overrides tab lists it with the reason; clear it, 200 again; the admin log says who, what
    and why."""
    from django.contrib.admin.models import LogEntry

    base = live_server.url
    expect = sync_api.expect
    _log_in(page, live_server, "/admin/django_redislua/redislua/")
    assert page.goto(f"{base}/limited/").status == 200  # one hit: its key appears

    page.goto(f"{base}/admin/django_redislua/redislua/")
    row = page.locator("tr[data-key='rl:login:sl:{127.0.0.1}']")
    expect(row).to_be_visible()
    row.get_by_role("link", name="Block 1 h").click()
    expect(page.locator("#content h1")).to_have_text("Set a live override")
    page.fill("#id_reason", "credential stuffing <b>drill</b>")
    _shoot(page, tmp_path, "admin-override-form-screenshot.png")
    page.get_by_role("button", name="Set the override").click()
    expect(page.locator(".messagelist .success")).to_contain_text("Block for 127.0.0.1")
    expect(row.locator(".redislua-override-block")).to_be_visible()

    blocked = page.goto(f"{base}/limited/")
    assert blocked.status == 429
    assert 3590 <= int(blocked.headers["retry-after"]) <= 3600

    page.goto(f"{base}/admin/django_redislua/redislua/")
    page.get_by_role("link", name="Overrides", exact=True).click()
    listed = page.locator("tr[data-identity='127.0.0.1']")
    expect(listed).to_contain_text("credential stuffing <b>drill</b>")  # text, not markup
    expect(listed).to_contain_text("ops")
    _shoot(page, tmp_path, "admin-overrides-screenshot.png")
    listed.get_by_role("link", name="Clear").click()
    page.get_by_role("button", name="Yes, clear it").click()
    expect(page.locator(".messagelist .success")).to_contain_text("Cleared the override")
    assert page.goto(f"{base}/limited/").status == 200

    def logged() -> list[tuple[str, str]]:  # the ORM, off Playwright's event-loop thread
        return [(e.user.username, e.get_change_message())
                for e in LogEntry.objects.order_by("id")]

    with ThreadPoolExecutor(1) as thread:
        entries = thread.submit(logged).result()
    assert [who for who, _what in entries] == ["ops", "ops"]
    assert "block" in entries[0][1] and "credential stuffing" in entries[0][1]
    assert "Cleared the override" in entries[1][1]


def test_the_keys_table_fits_1280_px_and_identities_never_wrap_mid_string(
        admin_user: User, live_server: Any, tmp_path: Path) -> None:
    """Issue 35: at 1280 x 800 the keys table overflowed its box (the "Block 1 h" button was cut
    off) and an identity broke mid-string ("127.0.|0.1"). Every row's buttons lie inside the
    table's visible area, nothing scrolls sideways, and each identity and key is one line: whole
    when it fits, cut with an ellipsis otherwise, the whole of it in its title."""
    expect = sync_api.expect
    get_policy("login").hit("127.0.0.1")
    get_policy("login").hit("2001:db8:85a3::8a2e:370:7334")  # longer than the column
    get_policy("login").hit("a visitor with a very long, unsafe identity " + "x" * 40)  # digest
    get_policy("api").hit("user:42", cost=14)
    get_policy("export").hit("user:42")
    # every algorithm's state, whose fields take the most room (a sliding window's three)
    for algorithm in ("fixed_window", "sliding_window", "token_bucket", "leaky_bucket"):
        Policy(f"wide-{algorithm}", rate="5/m", algorithm=algorithm).hit("203.0.113.250")
    # Each state lasts 10 minutes: a loaded machine (CI30, four test workers on two cores) took
    # longer to start the browser and log in than GCRA's 8.4 s or a bucket's 12 s, and a state
    # that had rightly expired was missing from the table.
    client = get_client()
    for key in client.scan_iter("rl:*"):
        if client.pttl(key) > 0:
            client.pexpire(key, 600_000)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(10_000)
            _log_in(page, live_server, "/admin/django_redislua/redislua/")
            expect(page.locator("tr[data-key]")).to_have_count(9)
            _shoot(page, tmp_path, "admin-keys-1280.png")
            results = page.locator("#changelist .results")
            box = results.bounding_box()
            assert box is not None
            left, right = box["x"], min(box["x"] + box["width"], 1280)
            for row in page.locator("tr[data-key]").all():
                for part in (".redislua-identity", ".redislua-key"):
                    text = row.locator(part)
                    assert text.evaluate(LINES) == 1, (text.text_content(), "wraps")
                    assert text.get_attribute("title") == text.text_content()
                for name in ("Reset", "Block 1 h"):
                    button = row.get_by_role("link", name=name).bounding_box()
                    assert button is not None
                    assert left <= button["x"] and button["x"] + button["width"] <= right, (
                        row.get_attribute("data-key"), name, button, box)
            overflow = results.evaluate("e => e.scrollWidth - e.clientWidth")
            assert overflow <= 0, f"the keys table is {overflow} px wider than its box"
            ip = page.locator("tr[data-key='rl:login:sl:{127.0.0.1}'] .redislua-identity")
            assert ip.evaluate("e => e.scrollWidth <= e.clientWidth")  # whole, not cut
            digest = page.locator("tr[data-key^='rl:login:sl:{#'] .redislua-identity")
            assert digest.evaluate("e => e.scrollWidth <= e.clientWidth")  # 23 characters fit
        finally:
            browser.close()


# The lines a text element's characters are laid out on (a Range has one box per line part).
LINES = """e => {
    const range = document.createRange();
    range.selectNodeContents(e);
    return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size;
}"""
