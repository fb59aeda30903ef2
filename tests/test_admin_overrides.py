"""The admin's live overrides: the Overrides tab, the keys tab's "Block 1 h", permissions, CSRF,
the admin log with the reason, hostile values escaped."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.utils.html import escape

from django_redislua import get_policy, overrides
from tests.test_admin import BASE, KEYS_URL, LOGIN_KEY, limited_key, login_as  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.testapp.admin_urls"),
              pytest.mark.topologies]

OVERRIDES_URL = BASE + "overrides/"
SET_URL = OVERRIDES_URL + "set/"
CLEAR_URL = OVERRIDES_URL + "clear/"


def test_block_from_the_keys_tab_then_clear_it(login_as: Callable[..., Client],  # noqa: F811
                                               limited_key: str) -> None:  # noqa: F811
    client = login_as("change_redislua", csrf=True)
    listing = client.get(KEYS_URL).content.decode()
    block_link = (f"{SET_URL}?policy=login&amp;tag=203.0.113.7&amp;kind=block&amp;ttl=1h"
                  f"&amp;next=")
    assert block_link in listing and ">Block 1 h<" in listing

    form = client.get(SET_URL, {"policy": "login", "tag": "203.0.113.7", "kind": "block",
                                "ttl": "1h", "next": KEYS_URL})
    assert form.status_code == 200
    html = form.content.decode()
    assert 'method="post"' in html and "203.0.113.7" in html and 'value="1h"' in html
    assert overrides.get("login", "203.0.113.7") is None, "the form must change nothing"

    done = client.post(SET_URL, {
        "policy": "login", "tag": "203.0.113.7", "kind": "block", "ttl": "1h",
        "reason": "credential stuffing", "next": KEYS_URL,
        "csrfmiddlewaretoken": form.context["csrf_token"]})
    assert done.status_code == 302 and done["Location"] == KEYS_URL
    decision = get_policy("login").hit("203.0.113.7")
    assert decision.override == "block" and 3590 < decision.retry_after <= 3600
    entry = LogEntry.objects.get()
    message = entry.get_change_message()
    assert entry.user.username.startswith("u1") and entry.object_id == "rl:ov:{203.0.113.7}"
    assert "block" in message and "203.0.113.7" in message and "credential stuffing" in message
    assert ">block<" in client.get(KEYS_URL).content.decode()  # marked in the keys tab

    listed = client.get(OVERRIDES_URL).content.decode()
    assert "credential stuffing" in listed and "u1" in listed
    confirm = client.get(CLEAR_URL, {"policy": "login", "tag": "203.0.113.7"})
    assert confirm.status_code == 200 and "Yes, clear it" in confirm.content.decode()
    assert overrides.get("login", "203.0.113.7") is not None
    cleared = client.post(CLEAR_URL, {"policy": "login", "tag": "203.0.113.7",
                                      "csrfmiddlewaretoken": confirm.context["csrf_token"]})
    assert cleared.status_code == 302
    assert get_policy("login").hit("203.0.113.7").override is None
    assert LogEntry.objects.count() == 2
    assert "Cleared the override" in LogEntry.objects.order_by("-id")[0].get_change_message()


def test_the_overrides_tab_adds_every_kind(login_as: Callable[..., Client]) -> None:  # noqa: F811
    client = login_as("change_redislua")
    for kind, extra in (("allow", {}), ("rate", {"rate": "500/m"})):
        response = client.post(SET_URL, {"policy": "api", "identity": f"user:{kind}",
                                         "kind": kind, "ttl": "30d", "reason": kind, **extra})
        assert response.status_code == 302, response.content.decode()[:500]
    response = client.post(SET_URL, {"policy": "*", "identity": "198.51.100.1",
                                     "kind": "block", "ttl": "10m"})
    assert response.status_code == 302
    assert get_policy("api").hit("user:allow").override == "allow"
    assert get_policy("api").hit("user:rate").override == "rate"
    assert get_policy("search").hit("198.51.100.1").override == "block"
    listed = client.get(OVERRIDES_URL).content.decode()
    assert listed.count('class="redislua-override redislua-override-') == 3
    only_star = client.get(OVERRIDES_URL, {"policy": "*"}).content.decode()
    assert "198.51.100.1" in only_star and "user:allow" not in only_star
    assert "user:rate" in client.get(OVERRIDES_URL, {"q": "rate"}).content.decode()


def test_mistakes_re_show_the_form_with_the_reason(
        login_as: Callable[..., Client]) -> None:  # noqa: F811
    client = login_as("change_redislua")
    for data, said in (({"policy": "nope", "identity": "x", "ttl": "1h"}, "No policy named"),
                       ({"policy": "api", "identity": "x", "ttl": "ever"}, "duration"),
                       ({"policy": "api", "identity": "", "ttl": "1h"}, "Which identity"),
                       ({"policy": "*", "identity": "x", "kind": "rate", "rate": "5/m",
                         "ttl": "1h"}, "has no rate"),
                       ({"policy": "api", "identity": "x", "kind": "rate", "rate": "lots",
                         "ttl": "1h"}, "not a rate")):
        response = client.post(SET_URL, data)
        assert response.status_code == 400 and said in response.content.decode(), data
    assert not list(overrides.scan()) and not LogEntry.objects.exists()


def test_without_change_permission_nothing_can_be_set_or_cleared(
        login_as: Callable[..., Client]) -> None:  # noqa: F811
    overrides.block("login", "192.0.2.9", ttl="1h", reason="seen")
    viewer = login_as("view_redislua")
    page = viewer.get(OVERRIDES_URL).content.decode()
    assert "192.0.2.9" in page and ">Clear<" not in page and "Add an override" not in page
    assert viewer.get(SET_URL).status_code == 403
    assert viewer.post(SET_URL, {"policy": "login", "identity": "x", "ttl": "1h"}).status_code \
        == 403
    assert viewer.post(CLEAR_URL, {"policy": "login", "tag": "192.0.2.9"}).status_code == 403
    assert overrides.get("login", "192.0.2.9") is not None
    assert not LogEntry.objects.exists()


def test_a_post_without_csrf_token_is_refused(login_as: Callable[..., Client]) -> None:  # noqa: F811
    client = login_as("change_redislua", csrf=True)
    response = client.post(SET_URL, {"policy": "login", "identity": "x", "ttl": "1h"})
    assert response.status_code == 403
    assert overrides.get("login", "x") is None


def test_hostile_identity_and_reason_are_bounded_and_escaped(
        login_as: Callable[..., Client]) -> None:  # noqa: F811
    client = login_as("change_redislua")
    identity = "<script>alert(1)</script>{}\n" * 40_000  # about 1 MB
    reason = '<img src=x onerror="alert(2)">\n' * 35_000
    # "*": every policy, so any text is an identity ("api" keys by user or address, and
    # refuses what it could never yield: tests/test_override_identities.py)
    response = client.post(SET_URL, {"policy": "*", "identity": identity, "kind": "block",
                                     "ttl": "1h", "reason": reason})
    assert response.status_code == 302
    html = client.get(OVERRIDES_URL).content.decode()
    assert "<script>alert(1)" not in html and '<img src=x' not in html
    assert escape("<script>alert(1)</script>") in html
    [made] = overrides.scan()
    assert len(made.tag) <= 64 and len(made.reason) <= overrides.MAX_REASON
    message = LogEntry.objects.get().get_change_message()
    assert len(message) < 2_000
    # cleared from the tab by its key form, as shown
    assert client.post(CLEAR_URL, {"policy": "*", "tag": made.tag}).status_code == 302
    assert not list(overrides.scan())
