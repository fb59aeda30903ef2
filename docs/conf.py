"""Sphinx configuration: the docs are Markdown, read with MyST (``tox -e docs``)."""

project = "django-redislua"
extensions = ["myst_parser", "sphinx.ext.intersphinx"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
intersphinx_mapping = {
    "django": ("https://docs.djangoproject.com/en/5.2/", "https://docs.djangoproject.com/en/5.2/_objects/"),
}
myst_heading_anchors = 3
suppress_warnings = ["myst.xref_missing"]
html_theme = "alabaster"
