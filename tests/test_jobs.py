"""Background jobs on a real server (docs/jobs.md): ``once_per`` under cron on several hosts,
and what :class:`~django_redislua.jobs.JobGate` promises whatever framework runs the job
(the Celery workers are tests/test_jobs_celery.py's, Django's tasks tests/test_jobs_tasks.py's).
What runs in this process runs on the single server and on the cluster (``topologies``): the
singleton's rerun request shares its lock's hash slot, the period reads ``TIME`` from a node.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from django_redislua.jobs import JobGate, once_per
from django_redislua.limiting import clock
from django_redislua.limiting.decision import PolicyError
from django_redislua.limiting.policy import Policy
from django_redislua.locks import Lock

ROOT = Path(__file__).resolve().parent.parent

# A cron job as docs/jobs.md shows it, run by a process of its own as cron would on each host.
CRON = textwrap.dedent("""
    import json, os, sys, time
    import django
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    django.setup()
    from django_redislua.connection import get_client
    from django_redislua.jobs import once_per

    mode = sys.argv[1]

    @once_per("day", name="nightly-report", tz="Europe/Paris", timeout="2s")
    def nightly_report():
        get_client().rpush("cron:runs", os.getpid())
        if mode == "crash":
            raise RuntimeError("the report's database is down")
        time.sleep(float(sys.argv[2]))
        return "sent"

    start_at = float(sys.argv[3])
    time.sleep(max(0.0, start_at - time.time()))  # every host's cron fires at this second
    try:
        outcome = nightly_report()
    except RuntimeError as exc:
        print(json.dumps({"status": "raised", "error": str(exc)}))
    else:
        print(json.dumps({"status": outcome.status, "result": outcome.result,
                          "ran_by": outcome.ran_by, "pid": os.getpid()}))
""")


def cron(mode: str, seconds: float, start_at: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CRON, mode, str(seconds), str(start_at)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return dict(json.loads(out))


def test_three_hosts_firing_in_the_same_second_run_a_daily_job_once(r: Any) -> None:
    start_at = time.time() + 2  # past every process's start-up
    hosts = [cron("ok", 0.5, start_at) for _ in range(3)]
    outcomes = [outcome(host) for host in hosts]
    ran = [o for o in outcomes if o["status"] == "ran"]
    assert len(ran) == 1, outcomes
    assert r.lrange("cron:runs", 0, -1) == [str(ran[0]["pid"]).encode()]
    for other in outcomes:
        if other is not ran[0]:
            # Told who ran it: done (with its result), or running still (wait=False).
            assert other["status"] in ("done", "running"), other
            assert other["ran_by"].endswith(f":{ran[0]['pid']}")
            assert other["result"] == ("sent" if other["status"] == "done" else None)
    assert outcome(cron("ok", 0, time.time()))["status"] == "done"  # later that day: done


def test_a_crashed_first_run_leaves_the_day_to_the_next(r: Any) -> None:
    assert outcome(cron("crash", 0, time.time())) == {
        "status": "raised", "error": "the report's database is down"}
    second = outcome(cron("ok", 0, time.time()))
    assert second["status"] == "ran" and second["result"] == "sent"
    # A run killed mid-way (SIGKILL: nothing stored) frees the day when its lease (2 s) ends.
    r.flushall()
    killed = cron("ok", 60, time.time())
    while not r.llen("cron:runs"):
        assert killed.poll() is None
        time.sleep(0.05)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    # Asked at once, in this process: a cron process's start-up on a loaded machine can take
    # longer than the 2 s lease, which would then have run out before it asks.
    key, = r.scan_iter("rl:once:*nightly-report*")
    assert 0 < r.pttl(key) <= 2000  # the lease, renewed, never more

    @once_per("day", name="nightly-report", tz="Europe/Paris", timeout="2s")
    def nightly_report() -> str:
        return "sent"

    assert nightly_report().status == "running"  # its lease holds
    while r.exists(key):  # nobody renews it now: it runs out
        time.sleep(0.05)
    after = outcome(cron("ok", 0, time.time()))
    assert after["status"] == "ran"


@pytest.mark.topologies
def test_the_period_follows_the_redis_clock_into_the_next_day(r: Any) -> None:
    runs: list[int] = []

    @once_per("day", name="rollup", tz="America/New_York")
    def rollup() -> int:
        runs.append(1)
        return len(runs)

    try:
        assert rollup().status == "ran"
        assert rollup().status == "done" and rollup().result == 1
        clock.advance(86_400)  # the pytest plugin's clock: tomorrow
        tomorrow = rollup()
        assert (tomorrow.status, tomorrow.result) == ("ran", 2)
    finally:
        clock.reset()
    assert len(runs) == 2


@pytest.mark.topologies
def test_policies_are_all_or_nothing_and_a_denial_says_when(r: Any) -> None:
    burst = Policy("jobs-burst", rate="2/m", algorithm="sliding_log")
    hourly = Policy("jobs-hourly", rate="3/h", algorithm="fixed_window")
    gate = JobGate("sync", policies=[burst, hourly])
    assert [gate.admit().status for _ in range(3)] == ["run", "run", "limited"]
    denied = gate.admit()
    assert denied.denied_by == ("jobs-burst",)
    assert 59 < denied.retry_in <= 60 + 1  # the burst's wait, plus at most 1 s of jitter
    assert hourly.peek("sync").remaining == 1  # the denied calls took nothing from the hour


@pytest.mark.topologies
def test_a_concurrency_slot_is_given_back_when_the_job_ends_however_it_ends(r: Any) -> None:
    slots = Policy("jobs-slots", limit=1, algorithm="concurrency", timeout="1m")
    gate = JobGate("export", policies=[slots], poll="2s")
    first = gate.admit()
    assert first.status == "run"
    blocked = gate.admit()
    # Its own wait is the lease's end, a minute away: polled every 2 s instead.
    assert blocked.status == "limited" and 2 <= blocked.retry_in <= 2.2
    gate.done(first)
    assert gate.admit().status == "run"


@pytest.mark.topologies
def test_a_held_singleton_skips_and_says_who_holds_it(
        r: Any, caplog: pytest.LogCaptureFixture) -> None:
    gate = JobGate("nightly", singleton=True, singleton_timeout="30s",
                   policies=[Policy("jobs-never", rate="1/h")])
    with Lock("nightly", timeout=30) as held:
        with caplog.at_level(logging.INFO, "django_redislua.jobs"):
            skipped = gate.admit()
        assert skipped.status == "skipped"
        assert f"fencing token {held.token}" in skipped.held_by
        assert "job nightly skipped" in caplog.text
    admitted = gate.admit()
    assert admitted.status == "run" and admitted.lock is not None
    gate.done(admitted)
    assert not Lock("nightly", timeout=1).locked()
    # Denied by its policy, it does not keep the lock it took first.
    again = gate.admit()
    assert again.status == "limited" and not Lock("nightly", timeout=1).locked()


@pytest.mark.topologies
def test_runs_turned_away_by_a_singleton_with_rerun_run_once_more_after_it(r: Any) -> None:
    gate = JobGate("sync", singleton=True, singleton_rerun=True)
    first = gate.admit(("a",), {})
    assert first.status == "run"
    second, third = gate.admit(("b",), {"full": True}), gate.admit(("c",), {})
    assert (second.status, second.rerun_queued) == (third.status, third.rerun_queued) == (
        "skipped", True)
    sent: list[tuple[list[Any], dict[str, Any]]] = []
    gate.done(first, lambda args, kwargs: sent.append((args, kwargs)))
    assert sent == [(["c"], {})]  # once, with the latest turned-away run's arguments
    assert not r.exists("rl:lock:{sync}:rerun")
    alone = gate.admit(("d",), {})
    gate.done(alone, lambda args, kwargs: sent.append((args, kwargs)))
    assert len(sent) == 1  # nobody turned away: nothing sent again


@pytest.mark.topologies
def test_a_rerun_asked_while_the_rerun_is_sent_waits_for_the_next_end(r: Any) -> None:
    gate = JobGate("sync", singleton=True, singleton_rerun=True)
    first = gate.admit(("a",), {})
    assert gate.admit(("b",), {}).rerun_queued
    sent: list[list[Any]] = []
    later: list[Any] = []

    def resend(args: list[Any], kwargs: dict[str, Any]) -> None:
        sent.append(args)
        # Meanwhile another run takes the singleton, and a third is turned away by it.
        later.append(gate.admit(("x",), {}))
        assert gate.admit(("d",), {}).rerun_queued

    gate.done(first, resend)
    assert sent == [["b"]] and later[0].status == "run"
    gate.done(later[0], lambda args, kwargs: sent.append(args))
    assert sent == [["b"], ["d"]]  # the newer request was kept for the next end, then sent


@pytest.mark.topologies
def test_a_rerun_that_runs_at_once_does_not_find_its_request_again(r: Any) -> None:
    """A resend that runs the job right away (Django's ImmediateBackend does): the request is
    claimed before it is sent, so the rerun's own end finds none."""
    gate = JobGate("sync", singleton=True, singleton_rerun=True)
    runs: list[list[Any]] = []

    def job(args: list[Any], kwargs: dict[str, Any]) -> None:
        admission = gate.admit(args, kwargs)
        assert admission.status == "run"
        runs.append(args)
        gate.done(admission, job)

    first = gate.admit(["a"], {})
    assert gate.admit(["b"], {}).rerun_queued
    gate.done(first, job)
    assert runs == [["b"]]


@pytest.mark.topologies
def test_a_rerun_that_cannot_be_sent_is_left_for_the_next_end(
        r: Any, caplog: pytest.LogCaptureFixture) -> None:
    gate = JobGate("sync", singleton=True, singleton_rerun=True)
    first = gate.admit(["a"], {})
    assert gate.admit(["b"], {}).rerun_queued

    def broker_down(args: list[Any], kwargs: dict[str, Any]) -> None:
        raise ConnectionRefusedError("the broker is down")

    with caplog.at_level(logging.WARNING, "django_redislua.jobs"):
        gate.done(first, broker_down)  # the job's own outcome is not changed by it
    assert "a rerun is left for the next run's end: it could not be sent" in caplog.text
    sent: list[list[Any]] = []
    second = gate.admit(["c"], {})
    gate.done(second, lambda args, kwargs: sent.append(args))
    assert sent == [["b"]]


def test_a_cost_above_a_policys_capacity_is_an_error_not_a_wait(r: Any) -> None:
    gate = JobGate("export", policies=[Policy("jobs-small", rate="2/m")], cost=5)
    with pytest.raises(PolicyError, match="cost 5 is above the capacity of 'jobs-small' "
                                          r"\(2\): it could never run"):
        gate.admit()


def test_a_rerun_is_asked_only_of_a_holder_and_only_with_json_arguments(r: Any) -> None:
    from django_redislua.scripts import get_script

    queue = get_script("django_redislua.singleton_queue")
    assert queue(keys=["rl:lock:{free}", "rl:lock:{free}:rerun"], args=["{}", 60_000]) == 0
    assert not r.exists("rl:lock:{free}:rerun")  # a free lock: the caller runs it itself
    gate = JobGate("sync", singleton=True, singleton_rerun=True)
    holder = gate.admit()
    with pytest.raises(TypeError, match=r"singleton_rerun keeps the arguments .* as JSON"):
        gate.admit((object(),), {})
    gate.done(holder)


@pytest.mark.topologies
def test_the_kill_switch_lifts_a_jobs_limits_but_not_its_singleton(r: Any) -> None:
    gate = JobGate("sync", singleton=True, policies=[Policy("jobs-never", rate="1/h")])
    gate.done(gate.admit())  # the hour's one call
    assert gate.admit().status == "limited"
    with override_settings(REDISLUA={**_redislua(), "ENABLED": False}):
        admitted = gate.admit()
        assert admitted.status == "run"  # no policy asked
        assert gate.admit().status == "skipped"  # but two never run at once
        gate.done(admitted)
    assert gate.admit().status == "limited"


def test_redis_failing_follows_fail_open_but_never_runs_a_singleton_unlocked(
        r: Any, caplog: pytest.LogCaptureFixture) -> None:
    limited = JobGate("partner", policies=[Policy("jobs-partner", rate="5/m")], poll="3s")
    singleton = JobGate("nightly", singleton=True, poll="3s")
    down = {"CONNECTION": "redis://127.0.0.1:1/0", "SOCKET_TIMEOUT": 0.2}
    with override_settings(REDISLUA={**_redislua(), **down, "FAIL_OPEN": True}):
        assert limited.admit().status == "run"
        assert singleton.admit().status == "limited"
    with override_settings(REDISLUA={**_redislua(), **down, "FAIL_OPEN": False}):
        put_off = limited.admit()
        assert put_off.status == "limited" and 3 <= put_off.retry_in <= 3.3
        assert put_off.denied_by == ()


def test_a_policy_whose_rate_needs_a_request_is_refused_by_name(r: Any) -> None:
    per_plan = {"per-plan": {"rate": "tests.testapp.ratelimit_views.staff_unlimited"}}
    with (override_settings(REDISLUA={**_redislua(), "POLICIES": per_plan}),
          pytest.raises(PolicyError, match="'per-plan' takes its rate from a request")):
        JobGate("report", policies="per-plan").admit()


def test_the_system_checks_name_a_job_whose_policy_is_unknown_or_needs_a_request(
        r: Any) -> None:
    from django_redislua.checks import check_settings

    per_plan = {"per-plan": {"rate": "tests.testapp.ratelimit_views.staff_unlimited"}}
    with override_settings(REDISLUA={**_redislua(), "POLICIES": per_plan}):
        unknown = JobGate("jobs.sync_crm", policies=["crm"], module=__name__)
        dynamic = JobGate("jobs.report", policies="per-plan", module=__name__)
        unloaded = JobGate("gone.job", policies=["crm"], module="a_module_not_loaded")
        messages = {(m.id, m.msg) for m in check_settings()}
        assert messages == {
            ("redislua.E021", "Job 'jobs.sync_crm': no REDISLUA policy named 'crm' "
                              "(known: per-plan)"),
            ("redislua.E031", "Job 'jobs.report': policy 'per-plan' takes its rate from a "
                              "request; a background job has none (give it a fixed rate)"),
        }
        del unknown, dynamic, unloaded
        assert check_settings() == []  # the gates went with their last reference


def _redislua() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.REDISLUA)
