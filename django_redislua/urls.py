"""The app's own URLs: ``path("", include("django_redislua.urls"))`` routes ``metrics``."""

from django.urls import path

from django_redislua import views

app_name = "django_redislua"
urlpatterns = [path("metrics", views.metrics, name="metrics")]
