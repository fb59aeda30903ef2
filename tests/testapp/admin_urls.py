"""URLs for the admin page's tests: the admin and one rate-limited view, nothing else."""

from django.contrib import admin
from django.urls import path

from tests.testapp.admin_views import inline_limited, limited

urlpatterns = [
    path("admin/", admin.site.urls),
    path("limited/", limited, name="limited"),
    path("inline/", inline_limited, name="inline"),
]
