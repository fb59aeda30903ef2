"""The demo's Celery app. ``manage.py demo`` starts a worker of it beside the server when Celery
is installed (``pip install "django-redislua[celery]"``); the broker is the demo's Redis."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo.settings")

app = Celery("demo")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["demo"])
