"""Django REST framework's own throttling tests, run against django_redislua.drf's drop-ins.

``tests/drf_reference/drf_test_throttling.py.txt`` is DRF's ``tests/test_throttling.py`` from the
sdist of the DRF version below, unmodified after a header naming its source and licence (the
digest is checked here). It is loaded under a private module name, once per test, with
``rest_framework.throttling``'s ``AnonRateThrottle``, ``UserRateThrottle``,
``ScopedRateThrottle`` and ``SimpleRateThrottle`` replaced by ours while it is imported and
while the test runs: its ``from rest_framework.throttling import ...`` binds ours, so every
throttle it defines (``User3SecRateThrottle(UserRateThrottle)``, the per-test
``XYScopedRateThrottle(ScopedRateThrottle)`` with its ``timer``, ...) is a subclass of ours.
``BaseThrottle`` stays DRF's (ours derive from it too).

Each of DRF's test methods is one pytest test: ``unittest`` runs that ``TestCase(methodName)``
(in a suite, so Django's ``setUpClass`` opens its transaction) and the test asserts it passed,
showing unittest's traceback otherwise. A fresh copy of the module per test and restoring what
DRF's tests assign (``SimpleRateThrottle.scope`` on our class, ``api_settings.NUM_PROXIES``)
keep the tests independent. DRF's suite runs with DRF's default ``REST_FRAMEWORK`` settings (its
conftest sets none), so these run under ``REST_FRAMEWORK={}`` too.

Nothing is left out. A DRF test our classes fail is marked ``xfail(strict=True)`` with its cause,
in :data:`KNOWN_BUGS` (DRF's contract, which ours break) or :data:`DOCUMENTED_DIFFERENCES` (what
docs/drf.md says ours deliberately do otherwise); strict, so a fix turns it into a failure here
until the entry is removed.

:func:`test_drf_module_in_one_run` also runs the whole module the way DRF's suite does: one copy,
DRF's order, one process, nothing reset between tests but DRF's own ``setUp`` (``cache.clear()``,
which here FLUSHDBs the throttles' Redis too: the test settings' default cache is that server).
State carried from one test to the next would fail more tests: :data:`SUITE_ORDER_BUGS` (none).
:func:`test_harness_runs_drf_classes_green` runs the file both ways with DRF's own classes: every
test passes, so a failure with ours is ours, not the harness's.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import types
import unittest
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import rest_framework
from django.test import override_settings
from rest_framework import throttling as drf_throttling
from rest_framework.settings import DEFAULTS, api_settings

from django_redislua import drf

REFERENCE = Path(__file__).parent / "drf_reference" / "drf_test_throttling.py.txt"
REFERENCE_VERSION = "3.18.3"  # the DRF release the file comes from
REFERENCE_SHA256 = "8f2a7c4becc177b28c0faa5944c6377c4db51dc80f883b349db6333b2d6c308f"
HEADER_END = "# ---- end of header: DRF's file, unmodified, follows ----\n"

SUBSTITUTED = ("AnonRateThrottle", "UserRateThrottle", "ScopedRateThrottle", "SimpleRateThrottle")
OURS: dict[str, Any] = {name: getattr(drf, name) for name in SUBSTITUTED}
DRFS: dict[str, Any] = {name: getattr(drf_throttling, name) for name in SUBSTITUTED}


def reference_source() -> str:
    """The vendored file (its header is comments, so line numbers in tracebacks are the file's),
    after checking that what follows the header is DRF's file byte for byte."""
    text = REFERENCE.read_text(encoding="utf-8")
    _header, found, body = text.partition(HEADER_END)
    assert found, f"{REFERENCE}: no end-of-header line"
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    assert digest == REFERENCE_SHA256, f"{REFERENCE} is not DRF {REFERENCE_VERSION}'s file"
    return text


_CODE = compile(reference_source(), str(REFERENCE), "exec")
_copies = itertools.count()


def load_reference(classes: Mapping[str, Any]) -> types.ModuleType:
    """A fresh copy of DRF's test module, imported while ``rest_framework.throttling`` holds
    ``classes``; not put in ``sys.modules``."""
    module = types.ModuleType(f"_drf_reference_test_throttling_{next(_copies)}")
    module.__file__ = str(REFERENCE)
    with mock.patch.multiple(drf_throttling, **classes):
        exec(_CODE, module.__dict__)
    return module


def reference_ids() -> list[str]:
    """``Class.method`` of every test in DRF's module, in its order."""
    suite = unittest.TestLoader().loadTestsFromModule(load_reference(OURS))
    ids: list[str] = []
    stack: list[Any] = [suite]
    while stack:
        item = stack.pop(0)
        if isinstance(item, unittest.TestSuite):
            stack[:0] = list(item)
        else:
            ids.append(f"{type(item).__name__}.{item._testMethodName}")
    return ids


@contextlib.contextmanager
def class_attributes_restored(classes: list[type]) -> Iterator[None]:
    """Undo what a test assigns on these classes (DRF's ``SimpleRateThrottleTests.setUp`` sets
    ``SimpleRateThrottle.scope``: with the substitution, on ours)."""
    saved = [(cls, dict(vars(cls))) for cls in classes]
    try:
        yield
    finally:
        for cls, attrs in saved:
            for name in set(vars(cls)) - set(attrs):
                delattr(cls, name)
            for name, value in attrs.items():
                if vars(cls).get(name) is not value:
                    setattr(cls, name, value)


@contextlib.contextmanager
def api_settings_restored() -> Iterator[None]:
    """Undo ``setattr(api_settings, 'NUM_PROXIES', n)`` (DRF's ``config_proxy``): an instance
    attribute that ``api_settings.reload()`` does not clear, as it never cached it."""
    before = set(vars(api_settings))
    try:
        yield
    finally:
        cached = api_settings._cached_attrs  # reload() deletes these itself
        for name in set(vars(api_settings)) - before - cached:
            delattr(api_settings, name)
        api_settings.reload()


def run_reference_tests(
    test_ids: list[str], classes: Mapping[str, Any]
) -> dict[str, unittest.TestResult]:
    """Run DRF's tests ``Class.method``, in this order, in one copy of the module and one
    unittest suite (as DRF's suite runs them), with ``classes`` as rest_framework.throttling's.
    One result per test."""
    results = {test_id: unittest.TestResult() for test_id in test_ids}
    with contextlib.ExitStack() as stack:
        stack.enter_context(override_settings(REST_FRAMEWORK={}))  # DRF's suite: the defaults
        stack.enter_context(api_settings_restored())
        stack.enter_context(class_attributes_restored(list(classes.values())))
        if classes["SimpleRateThrottle"] is DRFS["SimpleRateThrottle"]:
            # DRF copies DEFAULT_THROTTLE_RATES into this class attribute on import, so it holds
            # this suite's settings; in DRF's suite it holds DRF's defaults.
            stack.enter_context(mock.patch.object(
                drf_throttling.SimpleRateThrottle, "THROTTLE_RATES",
                dict(DEFAULTS["DEFAULT_THROTTLE_RATES"]),
            ))
        module = load_reference(classes)
        stack.enter_context(mock.patch.multiple(drf_throttling, **classes))
        suite = unittest.TestSuite()
        for test_id in test_ids:
            class_name, method = test_id.split(".")
            suite.addTest(getattr(module, class_name)(method))
        # One result per test, class fixtures (Django's setUpClass transaction) shared: the
        # suite's own run() with a result that hands each test its own.
        dispatching = _Dispatching(results)
        suite.run(dispatching)
    for result in results.values():  # a class fixture that failed failed its tests
        result.errors.extend(dispatching.errors)
    return results


class _Dispatching(unittest.TestResult):
    """A result that records each test in ``results[Class.method]``."""

    def __init__(self, results: dict[str, unittest.TestResult]) -> None:
        super().__init__()
        self.results = results

    def _of(self, test: Any) -> unittest.TestResult:
        if isinstance(test, unittest.TestCase):
            return self.results[f"{type(test).__name__}.{test._testMethodName}"]
        return self  # a class fixture's failure (setUpClass): reported below

    def startTest(self, test: Any) -> None:
        self._of(test).startTest(test)

    def stopTest(self, test: Any) -> None:
        self._of(test).stopTest(test)

    def addError(self, test: Any, err: Any) -> None:
        self._of(test).addError(test, err)

    def addFailure(self, test: Any, err: Any) -> None:
        self._of(test).addFailure(test, err)

    def addSkip(self, test: Any, reason: str) -> None:
        self._of(test).addSkip(test, reason)

    def addUnexpectedSuccess(self, test: Any) -> None:
        self._of(test).addUnexpectedSuccess(test)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        self._of(test).addSubTest(test, subtest, err)

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        self._of(test).addExpectedFailure(test, err)


def run_reference_test(test_id: str, classes: Mapping[str, Any]) -> unittest.TestResult:
    """Run DRF's test ``Class.method`` alone, in a fresh copy of the module."""
    return run_reference_tests([test_id], classes)[test_id]


def problems(result: unittest.TestResult) -> str:
    """What went wrong, as unittest reports it; "" when the one test passed."""
    lines = [f"{kind}: {case}\n{text}" for kind, found in (
        ("ERROR", result.errors), ("FAIL", result.failures), ("SKIPPED", result.skipped),
    ) for case, text in found]
    lines += [f"UNEXPECTED SUCCESS: {case}" for case in result.unexpectedSuccesses]
    if result.testsRun != 1:
        lines.append(f"ran {result.testsRun} tests, not 1")
    return "\n".join(lines)


# DRF's contract, broken by ours. Strict: fixing the cause makes the test fail here until the
# entry is removed.
KNOWN_BUGS: dict[str, str] = {}

# What docs/drf.md says ours deliberately do otherwise (strict too: a change shows here).
DOCUMENTED_DIFFERENCES: dict[str, str] = {
    "SimpleRateThrottleTests.test_throttle_raises_error_if_rate_is_missing": (
        "docs/drf.md 'a throttle that cannot be used': DRF raises ImproperlyConfigured from "
        "__init__ for a scope without a rate (a 500 on every request); ours catch it in "
        "SimpleRateThrottle._configure, keep it in throttle.error (redislua.E022, reported by "
        "manage.py check) and follow FAIL_OPEN in allow_request. get_rate() itself still raises "
        "(test_get_rate_raises_error_if_scope_is_missing passes)."
    ),
    "SimpleRateThrottleTests.test_wait_returns_correct_waiting_time_without_history": (
        "docs/drf.md: ours have no history (it lives in Redis) and wait() before any decision "
        "is None (after an admitted request 0.0), not DRF's pacing hint duration / "
        "(num_requests - len(history) + 1) = 60 / 2 = 30.0 computed from the test's "
        "throttle.history = []."
    ),
}
# Passing, but not by DRF's reasoning: test_wait_returns_none_if_there_are_no_available_requests
# sets throttle.history (which ours never read); ours return None because no decision was made.

# DRF tests that fail only when the module runs in one go (test_drf_module_in_one_run), from
# state one test leaves for the next: each passes alone.
SUITE_ORDER_BUGS: dict[str, str] = {}

# DRF tests not run at all, each with its reason. None: every test runs.
EXCLUDED: dict[str, str] = {}

IDS = reference_ids()


def _params() -> list[Any]:
    params = []
    for test_id in IDS:
        if test_id in EXCLUDED:
            continue
        reason = KNOWN_BUGS.get(test_id) or DOCUMENTED_DIFFERENCES.get(test_id)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(test_id, id=test_id, marks=marks))
    return params


def test_reference_lists_are_consistent() -> None:
    """Every entry names one of DRF's tests, once. The file runs against whichever DRF is
    installed (``rest_framework.__version__``, other than REFERENCE_VERSION on older combinations
    of the matrix): test_harness_runs_drf_classes_green proves it still describes that DRF."""
    assert rest_framework.__version__
    assert len(IDS) == len(set(IDS)) > 20
    marked = [*KNOWN_BUGS, *DOCUMENTED_DIFFERENCES, *EXCLUDED, *SUITE_ORDER_BUGS]
    assert set(marked) <= set(IDS), "entries naming no DRF test"
    assert len(marked) == len(set(marked)), "a test in two lists"


@pytest.mark.django_db
@pytest.mark.parametrize("test_id", _params())
def test_drf_reference(test_id: str) -> None:
    """DRF's test ``test_id`` passes with our throttles in place of DRF's."""
    report = problems(run_reference_test(test_id, OURS))
    assert not report, report


@pytest.mark.django_db
def test_drf_module_in_one_run() -> None:
    """The whole module in one run, as DRF's suite runs it (state carried between tests, only
    DRF's setUp resetting): exactly the per-test failures plus :data:`SUITE_ORDER_BUGS` fail."""
    results = run_reference_tests(IDS, OURS)
    failed = {test_id for test_id, result in results.items() if problems(result)}
    expected = set(KNOWN_BUGS) | set(DOCUMENTED_DIFFERENCES) | set(SUITE_ORDER_BUGS)
    unexpected = {test_id: problems(results[test_id]) for test_id in sorted(failed - expected)}
    assert not unexpected, "\n\n".join(f"{k}\n{v}" for k, v in unexpected.items())
    fixed = sorted(expected - failed)
    assert not fixed, f"these pass now, remove them from their list: {fixed}"


@pytest.mark.django_db
@pytest.mark.parametrize("one_run", [False, True], ids=["each-alone", "module-in-one-run"])
def test_harness_runs_drf_classes_green(one_run: bool) -> None:
    """The same harness with DRF's own classes passes every test: it reproduces DRF's suite."""
    if one_run:
        results = run_reference_tests(IDS, DRFS)
    else:
        results = {test_id: run_reference_test(test_id, DRFS) for test_id in IDS}
    assert len(results) == len(IDS)
    failed = {test_id: problems(result) for test_id, result in results.items() if problems(result)}
    assert not failed, "\n\n".join(f"{k}\n{v}" for k, v in failed.items())
