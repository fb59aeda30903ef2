"""A function tests/test_jobs_tasks.py makes a limited task of for the system checks, then
unloads: the checks pass over a job whose module is gone, so later tests' checks (on other
settings) never see it."""


def notify_partner(n: int) -> int:
    return n
