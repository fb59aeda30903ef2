"""A Celery app, Django tasks and settings for the background-job tests (tests/test_jobs_*.py):
the processes those tests start import them."""
