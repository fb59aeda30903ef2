from django.contrib import admin
from django.urls import include, path

from demo import api, coordination, jobs, quotas, views

urlpatterns = [
    path("", views.index, name="index"),
    path("limited/", views.limited, name="limited"),
    path("login/", views.login_form, name="login-form"),
    path("api/", views.api, name="api"),
    path("stacked/", views.stacked, name="stacked"),
    path("async/", views.async_limited, name="async-limited"),
    path("hello/", views.hello, name="hello"),
    path("shadow/", views.shadow, name="shadow"),
    path("metrics", views.metrics, name="metrics"),
    path("coordination/", coordination.coordination, name="coordination"),
    path("flash-sale/", views.flash_sale, name="flash-sale"),
    path("queue/", views.queue, name="queue"),
    path("jobs/", jobs.jobs, name="jobs"),
    path("quota/", quotas.quota, name="quota"),
    path("quota/usage/", quotas.quota_usage, name="quota-usage"),
    path("api/", include(api.router.urls)),
    path("admin/", admin.site.urls),
]
