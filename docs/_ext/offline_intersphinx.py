"""Let the docs build with ``-W`` on a machine without network (CI has none).

Sphinx's intersphinx logs "failed to reach any of the inventories ..." as a WARNING, with no
type to name in ``suppress_warnings``, so ``-W`` turns a network outage into a failed build.
This filter turns exactly that message into an INFO line (shown without ``-q``): the build goes
on, and references into Python, Django and redis-py render as plain text instead of links. Every
other warning, including a broken reference between our own pages, still fails the build.
Where the inventories can be fetched (Read the Docs), the links are made as usual.
"""

from __future__ import annotations

import logging
from typing import Any

from sphinx.application import Sphinx

UNREACHABLE = "failed to reach any of the inventories"


class InventoryUnreachable(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and UNREACHABLE in str(record.msg):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = f"intersphinx (offline, links left out): {record.msg}"
        return True


def setup(app: Sphinx) -> dict[str, Any]:
    logger = logging.getLogger("sphinx.sphinx.ext.intersphinx")
    if not any(isinstance(f, InventoryUnreachable) for f in logger.filters):
        logger.addFilter(InventoryUnreachable())
    return {"parallel_read_safe": True, "parallel_write_safe": True}
