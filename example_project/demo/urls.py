from django.contrib import admin
from django.urls import include, path

from demo import api, views

urlpatterns = [
    path("", views.index, name="index"),
    path("limited/", views.limited, name="limited"),
    path("api/", include(api.router.urls)),
    path("admin/", admin.site.urls),
]
