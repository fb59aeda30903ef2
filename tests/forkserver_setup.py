"""What the fork server of tests/processes.py loads once, before it forks any child: Django set
up on the test settings (the worker's REDIS_URL, exported by tests/settings.py, is in the
environment the server inherits), and the modules whose functions the children run."""

from __future__ import annotations

import importlib
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()
for module in ("tests.test_locks_once_processes", "tests.test_locks_processes",
               "tests.test_recipes_processes"):
    importlib.import_module(module)
