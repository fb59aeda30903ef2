from django.urls import path

from tests.testapp import matrix_views as v

urlpatterns = [
    path("sync/", v.sync_view),
    path("async/", v.async_view),
    path("drf/", v.GlobalThrottled.as_view()),
]
