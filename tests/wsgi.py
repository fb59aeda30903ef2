"""WSGI entry point of the test project, for tests that serve it under gunicorn.

DJANGO_SETTINGS_MODULE comes from the environment (e.g. tests.deploy_settings).
"""

from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
