"""The order pytest-xdist hands modules out in (tests/scheduling.py): longest first, a module
not yet recorded before all, each module whole and in its own order."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.scheduling import ModuleSecondsRecorder, longest_first, recorded_seconds


def items(*nodeids: str) -> list[pytest.Item]:
    return [cast(pytest.Item, SimpleNamespace(nodeid=nodeid)) for nodeid in nodeids]


def test_modules_go_longest_first_whole_and_in_their_own_order() -> None:
    collected = items("tests/a.py::one", "tests/a.py::two", "tests/b.py::one",
                      "tests/c.py::one", "tests/c.py::two", "tests/d.py::one")
    longest_first(collected, {"tests/a.py": 1.0, "tests/b.py": 30.0, "tests/c.py": 5.0,
                              "tests/d.py": 1.0})
    assert [item.nodeid for item in collected] == [
        "tests/b.py::one", "tests/c.py::one", "tests/c.py::two",
        # equally long: in the order they were collected
        "tests/a.py::one", "tests/a.py::two", "tests/d.py::one"]


def test_a_module_not_recorded_goes_before_every_recorded_one() -> None:
    collected = items("tests/a.py::one", "tests/new.py::one", "tests/new.py::two")
    longest_first(collected, {"tests/a.py": 300.0})
    assert [item.nodeid for item in collected] == [
        "tests/new.py::one", "tests/new.py::two", "tests/a.py::one"]


def test_recorded_seconds_are_what_the_recorder_wrote(tmp_path: Path) -> None:
    path = tmp_path / "seconds.json"
    assert recorded_seconds(path) == {}, "nothing recorded yet: every module unknown"
    recorder = ModuleSecondsRecorder(path)
    for nodeid, duration in (("tests/a.py::one", 1.25), ("tests/a.py::one", 0.5),
                             ("tests/b.py::x[1]", 4.0), ("tests/a.py::two", 0.25)):
        recorder.pytest_runtest_logreport(cast(Any, SimpleNamespace(nodeid=nodeid,
                                                                    duration=duration)))
    recorder.pytest_sessionfinish()
    assert list(json.loads(path.read_text())) == ["tests/b.py", "tests/a.py"], "longest first"
    assert recorded_seconds(path) == {"tests/b.py": 4.0, "tests/a.py": 2.0}


def test_the_recorded_seconds_name_modules_of_this_suite() -> None:
    """The file in the tree is read: each of its modules is a test module here."""
    root = Path(__file__).resolve().parent.parent.parent
    seconds = recorded_seconds()
    assert seconds, "tests/module_seconds.json is missing or empty"
    assert all((root / module).is_file() for module in seconds), sorted(
        module for module in seconds if not (root / module).is_file())
