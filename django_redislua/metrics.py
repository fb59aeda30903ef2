"""Metrics of decisions, Redis failures and locks, for ``prometheus_client`` and OpenTelemetry.

``REDISLUA["METRICS"]`` is ``"auto"`` (each of the two that is installed), or a list naming
``"prometheus"`` and/or ``"opentelemetry"``; ``[]`` turns metrics off. With neither installed
(or ``[]``) every recording call finds an empty tuple of sinks and returns: no cost beyond that.

Labels come from the configuration only: a policy's name and algorithm, a result from a fixed
list, an operation (a script's name). Never an identity or a lock name, so the number of series
is bounded by the settings, not by traffic.

Prometheus instruments live in ``prometheus_client``'s default registry (django-prometheus's
``/metrics`` and ``generate_latest()`` show them); OpenTelemetry instruments come from the meter
``django_redislua`` of the global meter provider. Both are created once per process.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Protocol

from django_redislua.conf import on_change, settings
from django_redislua.metric_backends import (
    BACKENDS,
    PROMETHEUS,
    installed,
    valid_setting,
)
from django_redislua.metric_backends import (
    OPENTELEMETRY as OPENTELEMETRY,  # re-exported: metrics.OPENTELEMETRY names a backend
)

ALLOWED, DENIED, SHADOW_DENIED = "allowed", "denied", "shadow_denied"
FAILED_OPEN, UNAVAILABLE = "failed_open", "unavailable"
# A live override's doing (django_redislua.overrides): refused by a block, admitted by an allow.
BLOCKED, ALLOWED_BY_OVERRIDE = "blocked", "allowed_by_override"
DECISION_RESULTS = (ALLOWED, DENIED, SHADOW_DENIED, FAILED_OPEN, UNAVAILABLE, BLOCKED,
                    ALLOWED_BY_OVERRIDE)
ACQUIRED, TIMEOUT = "acquired", "timeout"
LOCK_RESULTS = (ACQUIRED, TIMEOUT, UNAVAILABLE)

# Seconds. A decision is one round trip (tens of microseconds to a few milliseconds; the
# socket timeout bounds a failing one); a lock wait lasts up to its blocking_timeout.
DECISION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# (Prometheus name, OpenTelemetry name, description)
DECISIONS = ("redislua_decisions_total", "redislua.decisions",
             "Rate-limit decisions, by policy, algorithm and result")
DECISION_SECONDS = ("redislua_decision_seconds", "redislua.decision.duration",
                    "Seconds to decide, as the caller sees it (one Redis round trip, or none)")
REDIS_ERRORS = ("redislua_redis_errors_total", "redislua.redis.errors",
                "Script calls that failed in the Redis client, by script")
LOCK_ACQUIRED = ("redislua_lock_acquired_total", "redislua.lock.acquired",
                 "Lock acquisitions, by result")
LOCK_WAIT = ("redislua_lock_wait_seconds", "redislua.lock.wait.duration",
             "Seconds an acquire took (acquired or timed out)")
LOCK_LOST = ("redislua_lock_lost_total", "redislua.lock.lost",
             "Leases lost while held (ran out unrenewed, or taken)")
# A background job's call (django_redislua.jobs): ran, rate_limited (put off), skipped
# (another instance held its singleton). The label is the job's name: code, not traffic.
JOBS = ("redislua_jobs_total", "redislua.jobs", "Background job calls, by job and outcome")


class Sink(Protocol):
    def decided(self, policy: str, algorithm: str, result: str, seconds: float) -> None: ...
    def decision(self, policy: str, algorithm: str, result: str) -> None: ...
    def decision_seconds(self, policy: str, seconds: float) -> None: ...
    def redis_error(self, operation: str) -> None: ...
    def lock_acquired(self, result: str) -> None: ...
    def lock_wait(self, seconds: float) -> None: ...
    def lock_lost(self) -> None: ...
    def job(self, name: str, outcome: str) -> None: ...


def wanted(value: Any) -> list[str]:
    """The backends ``value`` asks for and this environment has (checks report the rest)."""
    names = BACKENDS if value == "auto" or not valid_setting(value) else value
    return [name for name in names if installed(name)]


class _Prometheus:
    def __init__(self) -> None:
        from prometheus_client import Counter, Histogram

        self._decisions = _registered(Counter, DECISIONS, ["policy", "algorithm", "result"])
        self._seconds = _registered(Histogram, DECISION_SECONDS, ["policy"],
                                    buckets=DECISION_BUCKETS)
        self._errors = _registered(Counter, REDIS_ERRORS, ["operation"])
        self._acquired = _registered(Counter, LOCK_ACQUIRED, ["result"])
        self._wait = _registered(Histogram, LOCK_WAIT, [], buckets=WAIT_BUCKETS)
        self._lost = _registered(Counter, LOCK_LOST, [])
        self._jobs = _registered(Counter, JOBS, ["job", "outcome"])
        # Labelled children by instrument and label values: labels() parses its arguments on
        # every call.
        self._children: dict[tuple[Any, ...], Any] = {}
        self._decided: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    def _child(self, metric: Any, *values: str) -> Any:
        key = (metric, *values)
        child = self._children.get(key)
        if child is None:
            child = self._children.setdefault(key, metric.labels(*values))
        return child

    def decided(self, policy: str, algorithm: str, result: str, seconds: float) -> None:
        """One decision and its time: the hot path, one dict lookup for both children."""
        key = (policy, algorithm, result)
        pair = self._decided.get(key)
        if pair is None:
            pair = self._decided.setdefault(key, (
                self._child(self._decisions, policy, algorithm, result),
                self._child(self._seconds, policy)))
        pair[0].inc()
        pair[1].observe(seconds)

    def decision(self, policy: str, algorithm: str, result: str) -> None:
        self._child(self._decisions, policy, algorithm, result).inc()

    def decision_seconds(self, policy: str, seconds: float) -> None:
        self._child(self._seconds, policy).observe(seconds)

    def redis_error(self, operation: str) -> None:
        self._child(self._errors, operation).inc()

    def lock_acquired(self, result: str) -> None:
        self._child(self._acquired, result).inc()

    def lock_wait(self, seconds: float) -> None:
        self._wait.observe(seconds)

    def lock_lost(self) -> None:
        self._lost.inc()

    def job(self, name: str, outcome: str) -> None:
        self._child(self._jobs, name, outcome).inc()


def _registered(kind: Any, names: tuple[str, str, str], labels: Sequence[str],
                **options: Any) -> Any:
    """The instrument in the default registry, created on first use. An instrument of that
    name already there (this module imported twice, e.g. by an autoreloader) is reused."""
    from prometheus_client import REGISTRY

    name, _, description = names
    try:
        return kind(name, description, labels, **options)
    except ValueError as exc:  # "Duplicated timeseries in CollectorRegistry"
        collectors = registered_by_name(REGISTRY)
        if collectors is None:
            from importlib.metadata import version

            raise ValueError(
                f"{name} is registered already, and prometheus_client "
                f"{version('prometheus_client')}'s registry has no _names_to_collectors to find "
                "it by (docs/versions.md, \"Other packages' internals we rely on\")") from exc
        return collectors.get(name.removesuffix("_total")) or collectors[name]


def registered_by_name(registry: Any) -> dict[str, Any] | None:
    """Feature test (docs/versions.md, "Other packages' internals"), at first use: a
    ``CollectorRegistry``'s collectors by metric name, ``_names_to_collectors``. prometheus_client
    has no public lookup by name; None when this one has no such mapping."""
    collectors = getattr(registry, "_names_to_collectors", None)
    return collectors if isinstance(collectors, dict) else None


class _OpenTelemetry:
    def __init__(self) -> None:
        from opentelemetry import metrics

        meter = metrics.get_meter("django_redislua")
        self._decisions = meter.create_counter(
            DECISIONS[1], unit="{decision}", description=DECISIONS[2])
        self._seconds = _histogram(meter, DECISION_SECONDS, DECISION_BUCKETS)
        self._errors = meter.create_counter(
            REDIS_ERRORS[1], unit="{error}", description=REDIS_ERRORS[2])
        self._acquired = meter.create_counter(
            LOCK_ACQUIRED[1], unit="{acquisition}", description=LOCK_ACQUIRED[2])
        self._wait = _histogram(meter, LOCK_WAIT, WAIT_BUCKETS)
        self._lost = meter.create_counter(LOCK_LOST[1], unit="{lease}", description=LOCK_LOST[2])
        self._jobs = meter.create_counter(JOBS[1], unit="{call}", description=JOBS[2])
        self._attributes: dict[tuple[str, ...], dict[str, str]] = {}

    def _attrs(self, *pairs: str) -> dict[str, str]:
        attributes = self._attributes.get(pairs)
        if attributes is None:
            attributes = self._attributes.setdefault(
                pairs, dict(zip(pairs[::2], pairs[1::2], strict=True)))
        return attributes

    def decided(self, policy: str, algorithm: str, result: str, seconds: float) -> None:
        self.decision(policy, algorithm, result)
        self.decision_seconds(policy, seconds)

    def decision(self, policy: str, algorithm: str, result: str) -> None:
        self._decisions.add(
            1, self._attrs("policy", policy, "algorithm", algorithm, "result", result))

    def decision_seconds(self, policy: str, seconds: float) -> None:
        self._seconds.record(seconds, self._attrs("policy", policy))

    def redis_error(self, operation: str) -> None:
        self._errors.add(1, self._attrs("operation", operation))

    def lock_acquired(self, result: str) -> None:
        self._acquired.add(1, self._attrs("result", result))

    def lock_wait(self, seconds: float) -> None:
        self._wait.record(seconds)

    def lock_lost(self) -> None:
        self._lost.add(1)

    def job(self, name: str, outcome: str) -> None:
        self._jobs.add(1, self._attrs("job", name, "outcome", outcome))


def _histogram(meter: Any, names: tuple[str, str, str], buckets: Sequence[float]) -> Any:
    try:  # bucket advice needs opentelemetry-api 1.23+
        return meter.create_histogram(names[1], unit="s", description=names[2],
                                      explicit_bucket_boundaries_advisory=list(buckets))
    except TypeError:
        return meter.create_histogram(names[1], unit="s", description=names[2])


@functools.cache
def _sink(backend: str) -> Sink:
    """One sink per backend and process: instruments are registered once."""
    return _Prometheus() if backend == PROMETHEUS else _OpenTelemetry()


_sinks: tuple[Sink, ...] | None = None


@on_change
def _forget() -> None:
    global _sinks
    _sinks = None


def sinks() -> tuple[Sink, ...]:
    """The sinks ``REDISLUA["METRICS"]`` selects (empty: record nothing)."""
    global _sinks
    found = _sinks
    if found is None:
        found = _sinks = tuple(_sink(name) for name in wanted(settings.METRICS))
    return found


# The recording functions below, for the layers that record one event at a time; the engine
# iterates sinks() itself on the hot path.
def decision(policy: str, algorithm: str, result: str) -> None:
    for sink in sinks():
        sink.decision(policy, algorithm, result)


def redis_error(operation: str) -> None:
    for sink in sinks():
        sink.redis_error(operation)


def lock_acquired(result: str, seconds: float | None) -> None:
    """One acquire's outcome; ``seconds`` it took (None when Redis failed: no wait to show)."""
    for sink in sinks():
        sink.lock_acquired(result)
        if seconds is not None:
            sink.lock_wait(seconds)


def lock_lost() -> None:
    for sink in sinks():
        sink.lock_lost()


def job(name: str, outcome: str) -> None:
    """One call of a background job and what it came to (ran, rate_limited, skipped)."""
    for sink in sinks():
        sink.job(name, outcome)
