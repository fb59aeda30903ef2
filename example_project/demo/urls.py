from django.contrib import admin
from django.urls import path

from demo import views

urlpatterns = [
    path("", views.index, name="index"),
    path("limited/", views.limited, name="limited"),
    path("admin/", admin.site.urls),
]
