"""Sphinx configuration: the docs are Markdown, read with MyST (``tox -e docs``)."""

project = "django-redislua"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
suppress_warnings = ["myst.xref_missing"]
html_theme = "alabaster"
