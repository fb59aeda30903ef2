"""Sphinx configuration: Markdown pages read with MyST, the Furo theme, autodoc for the API.

Build (as CI does, through tests/test_docs_build.py; also ``tox -e docs``)::

    python -m sphinx -W -q -b html docs docs/_build/html

It needs no network and no Redis: autodoc imports the package under minimal settings configured
here, the algorithm charts are computed in-process (``_ext/algorithm_charts.py``), and the
intersphinx inventories, when they cannot be fetched, cost links, not the build
(``_ext/offline_intersphinx.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

# autodoc imports modules that need Django settings (models, the admin, DRF). These are enough to
# import every public module; nothing connects to Redis while the docs build.
import django  # noqa: E402
from django.conf import settings as django_settings  # noqa: E402

if not django_settings.configured:
    django_settings.configure(
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "rest_framework",
            "django_redislua",
        ],
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        REDISLUA={"CONNECTION": "redis://127.0.0.1:6379/0"},
        USE_TZ=True,
    )
    django.setup()

import django_redislua  # noqa: E402

project = "django-redislua"
author = "the django-redislua authors"
copyright = "the django-redislua authors"
release = django_redislua.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.extlinks",
    "sphinx.ext.viewcode",
    "offline_intersphinx",
    "algorithm_charts",
    "redislua_docs",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
suppress_warnings = [
    # Links to a heading of another page are resolved by myst_heading_anchors; links to source
    # files (tests/..., django_redislua/...) outside the docs are plain text on purpose.
    "myst.xref_missing",
    # The "How-to guides" toctree names recipes* as a glob: the recipes page may not exist yet in
    # every checkout, and an empty glob must not fail the -W build.
    "toc.empty_glob",
]

# -- MyST ------------------------------------------------------------------------------------
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]

# -- autodoc ---------------------------------------------------------------------------------
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autoclass_content = "both"

# -- links to the libraries we build on ------------------------------------------------------
# Django, redis-py and Python publish Sphinx inventories. Django REST framework's documentation
# is built with MkDocs and publishes none, so it is linked with the {drf} role (extlinks).
intersphinx_mapping = {
    "python": ("https://docs.python.org/3", None),
    "django": (
        "https://docs.djangoproject.com/en/stable/",
        "https://docs.djangoproject.com/en/stable/_objects/",
    ),
    "redis": ("https://redis.readthedocs.io/en/stable/", None),
}
intersphinx_timeout = 5
extlinks = {
    "drf": ("https://www.django-rest-framework.org/api-guide/%s", "DRF: %s"),
    "redis-command": ("https://redis.io/docs/latest/commands/%s/", "%s"),
}

# -- HTML ------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"django-redislua {release}"
html_static_path: list[str] = []
