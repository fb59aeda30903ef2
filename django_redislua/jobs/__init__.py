"""Background jobs: limits, singletons and once-per-period runs for work outside requests.

- :class:`JobGate`: what a job passes before it runs (policies all-or-nothing, a singleton
  lock); the Celery base class (:mod:`django_redislua.jobs.celery`, extra ``celery``) and
  Django's tasks (:mod:`django_redislua.jobs.tasks`, extra ``tasks`` before Django 6) use it.
- :func:`once_per`: once per calendar hour, day, week or month in a timezone, across hosts.
"""

from django_redislua.jobs.gate import Admission, JobGate
from django_redislua.jobs.periods import PERIODS, once_per, period_of

__all__ = ["PERIODS", "Admission", "JobGate", "once_per", "period_of"]
