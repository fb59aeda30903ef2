"""The example project (``demo.settings``) as tests/test_http_load.py serves it, with patient
Redis timeouts and ``FAIL_OPEN`` off.

That test counts admissions under load; it is not about timeouts. With the production 0.5 s,
a reply a loaded machine delayed past it was admitted undecided (``FAIL_OPEN``): CI, four
test workers on two cores, saw 9 requests admitted of which Redis had decided 5. Here a Redis
failure is a 503, which the test's counts show, never an admission.
"""

from demo.settings import *  # noqa: F403
from demo.settings import REDISLUA

from tests.patience import VERY_PATIENT

REDISLUA = {**REDISLUA, **VERY_PATIENT, "FAIL_OPEN": False}
