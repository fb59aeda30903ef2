"""The order pytest-xdist hands modules to its workers: the longest first.

``dev.py test`` runs whole modules per worker (``--dist loadfile``). pytest-xdist's own order
(``--loadscope-reorder``, its default) puts the modules with the most tests first, and the
modules that take longest here have few tests (a Celery run of 30 rate-limited tasks, the
chaos tests, child pytest processes): they were handed out last, and one worker ran on for
about 20 s after the others had finished. Longest first, the workers end within a second of
each other (measured: pytest 323 s -> 306 s, the same tests in the same work tree).

How long each module takes is recorded in ``module_seconds.json`` beside this file: seconds of
setup, call and teardown summed over its tests, from a whole run on two cores. A module it does
not name yet (a new one) goes first: unknown, it may be long, and a short module first costs
nothing. Stale numbers only cost time, never a test. To record them again::

    REDISLUA_RECORD_MODULE_SECONDS=tests/module_seconds.json python3 dev.py test
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

import pytest

MODULE_SECONDS = Path(__file__).resolve().parent / "module_seconds.json"
RECORD_TO = "REDISLUA_RECORD_MODULE_SECONDS"


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def recorded_seconds(path: Path = MODULE_SECONDS) -> dict[str, float]:
    try:
        seconds = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return {str(module): float(taken) for module, taken in seconds.items()}


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Sorts ``items`` in place, whole modules longest first (a module not in ``seconds``
    before every known one); the order of modules of equal length and of the tests within a
    module is kept."""
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(module_of(item.nodeid), index)

    def key(item: pytest.Item) -> tuple[float, int]:
        module = module_of(item.nodeid)
        return -seconds.get(module, math.inf), first_seen[module]

    items.sort(key=key)


class ModuleSecondsRecorder:
    """Sums each module's setup, call and teardown seconds as reports arrive (in pytest-xdist's
    controller: from every worker), and writes them, slowest first, as the session ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        ordered = sorted(self.seconds.items(), key=lambda pair: (-pair[1], pair[0]))
        self.path.write_text(json.dumps({module: round(taken, 1) for module, taken in ordered},
                                        indent=1) + "\n", encoding="utf-8")


def configure(config: pytest.Config) -> None:
    """Records module seconds when asked to, in the process that sees every report (not in a
    pytest-xdist worker)."""
    path = os.environ.get(RECORD_TO)
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(ModuleSecondsRecorder(Path(path)), "module-seconds")
