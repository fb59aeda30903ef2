from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]
urlpatterns += [path("rl/", include("tests.testapp.ratelimit_urls"))]
urlpatterns += [path("m/", include("tests.testapp.matrix_urls"))]
