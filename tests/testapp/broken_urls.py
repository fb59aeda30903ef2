from django.urls import include, path

from tests.testapp import broken_views as v

nested = [path("method/", v.MethodDecorated.as_view())]

urlpatterns = [
    path("unknown-policy/", v.unknown_policy),
    path("bad-inline-rate/", v.bad_inline_rate),
    path("bad-inline-algorithm/", v.bad_inline_algorithm),
    path("garbage-rate/", v.garbage_rate_callable),
    path("bad-key/", v.bad_key_override),
    path("nested/", include(nested)),
    path("one-good-one-broken/", v.one_good_one_broken),
    path("uses-another-policy/", v.uses_another_policy),
    path("drf/scope/", v.ScopeWithoutRate.as_view()),
    path("drf/policy/", v.UnknownThrottlePolicy.as_view()),
]
