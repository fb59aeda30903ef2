"""Small helpers for this project's docs.

- ``{command-help} redislua_preload``: the command's ``--help``, as ``manage.py`` prints it, so
  the commands reference cannot drift from the parsers.
- Optional modules: a page may hold an autodoc section between ``<!-- optional-module: NAME -->``
  and ``<!-- /optional-module -->``; when NAME cannot be imported (``django_redislua.recipes``
  while it is being written, say) the section is replaced by a one-line note instead of failing
  the ``-W`` build with an import error. When it can, the section is built as written.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

OPTIONAL = re.compile(
    r"<!-- optional-module: (?P<name>[\w.]+) -->\n(?P<body>.*?)<!-- /optional-module -->\n",
    re.DOTALL,
)


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def drop_missing_modules(app: Sphinx, docname: str, source: list[str]) -> None:
    def replace(match: re.Match[str]) -> str:
        if importable(match["name"]):
            return match["body"]
        return f"*`{match['name']}` is not part of this build.*\n"

    source[0] = OPTIONAL.sub(replace, source[0])


class CommandHelp(SphinxDirective):
    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        from django.core.management import get_commands, load_command_class

        name = self.arguments[0]
        app_name = get_commands().get(name)
        if app_name is None:
            raise self.error(f"no management command {name!r}")
        command = load_command_class(app_name, name)
        parser = command.create_parser("manage.py", name)
        previous = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = "88"  # argparse wraps to the terminal: make it the same everywhere
        try:
            text = parser.format_help()
        finally:
            if previous is None:
                del os.environ["COLUMNS"]
            else:
                os.environ["COLUMNS"] = previous
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", drop_missing_modules)
    app.add_directive("command-help", CommandHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
