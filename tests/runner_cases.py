"""unittest test cases for Django's own runner (``python -m django test tests.runner_cases``),
run by tests/test_django_runner.py in a process of its own: what a project that tests with
``manage.py test`` writes. Not collected by pytest (the file name does not start with test_)."""

from __future__ import annotations

from django.test import SimpleTestCase, TestCase

from django_redislua.test import RedisLuaTestMixin, redislua_test


class InlineLimitTests(RedisLuaTestMixin, TestCase):
    """/rl/inline/ is @ratelimit(rate="3/m", key="ip")."""

    def test_the_fourth_request_in_a_minute_is_refused(self) -> None:
        for _ in range(3):
            self.assertEqual(self.client.get("/rl/inline/").status_code, 200)
        response = self.client.get("/rl/inline/")
        self.assertEqual(response.status_code, 429)
        self.redislua.advance(int(response["Retry-After"]))  # no sleeping
        self.assertEqual(self.client.get("/rl/inline/").status_code, 200)

    def test_each_test_starts_with_every_limit_forgotten(self) -> None:
        # Runs after (or before) the test above in the same process: a full quota either way.
        for _ in range(3):
            self.assertEqual(self.client.get("/rl/inline/").status_code, 200)

    def test_reset_forgets_every_limit(self) -> None:
        for _ in range(3):
            self.client.get("/rl/inline/")
        self.assertEqual(self.client.get("/rl/inline/").status_code, 429)
        self.redislua.reset()
        self.assertEqual(self.client.get("/rl/inline/").status_code, 200)

    def test_the_throwaway_server_is_not_the_one_in_the_settings(self) -> None:
        from django.conf import settings

        self.assertEqual(settings.REDISLUA["CONNECTION"], self.redislua.url)
        self.assertNotEqual(self.redislua.url, self.__class__.settings_url)

    @classmethod
    def setUpClass(cls) -> None:
        from django.conf import settings

        cls.settings_url = settings.REDISLUA["CONNECTION"]
        super().setUpClass()


class OwnSetUpTests(RedisLuaTestMixin, SimpleTestCase):
    """A setUp of its own, calling super().setUp() first."""

    def setUp(self) -> None:
        super().setUp()
        self.seen = self.redislua.client.dbsize()

    def test_the_server_is_empty_when_a_test_starts(self) -> None:
        self.assertEqual(self.seen, 0)


@redislua_test
class DecoratedTests(TestCase):
    """The decorator, for a class whose bases stay as they are."""

    def test_limits_and_advance(self) -> None:
        responses = [self.client.get("/rl/inline/") for _ in range(4)]
        self.assertEqual([r.status_code for r in responses], [200, 200, 200, 429])
        self.redislua.advance(int(responses[-1]["Retry-After"]))
        self.assertEqual(self.client.get("/rl/inline/").status_code, 200)
