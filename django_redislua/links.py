"""Where the published documentation lives: check hints and error messages link to it.

A wheel user has no ``docs/`` folder, so a hint naming a source path would lead nowhere.
"""

from __future__ import annotations

DOCS_URL = "https://django-redislua.readthedocs.io/en/latest/"


def docs_url(page: str, anchor: str = "") -> str:
    """The published page ``page`` (e.g. ``"checks"``), at ``anchor`` if given."""
    return f"{DOCS_URL}{page}.html" + (f"#{anchor}" if anchor else "")


def check_url(check_id: str) -> str:
    """The docs entry of a system check: ``redislua.E002`` -> ``checks.html#redislua-e002``."""
    return docs_url("checks", check_id.lower().replace(".", "-"))
