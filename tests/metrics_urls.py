"""A project URLconf that routes the app's /metrics view (tests/test_metrics_view.py)."""

from django.urls import include, path

urlpatterns = [path("", include("django_redislua.urls"))]
