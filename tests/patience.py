"""How long the suite lets Redis take when a test is not about timeouts.

A loaded machine (CI, two test workers per core) delays replies past the production 0.5 s, and a
test not about timeouts then saw a failure, or ``FAIL_OPEN``'s admission, instead of the decision
it checks. Tests of timeout behaviour set short timeouts of their own (``SOCKET_TIMEOUT`` in
tests/test_lost_replies.py, the failover tests' timed phases).
"""

# The test processes: a wait this long is a defect to look at, not load.
PATIENT = {"SOCKET_TIMEOUT": 10.0, "SOCKET_CONNECT_TIMEOUT": 10.0}

# Served processes (gunicorn, uvicorn) and warm-ups that load scripts on a new server: they start
# beside the whole suite and share its cores, and the first call also loads the library.
VERY_PATIENT = {"SOCKET_TIMEOUT": 30.0, "SOCKET_CONNECT_TIMEOUT": 30.0}
