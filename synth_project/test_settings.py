"""Settings for the test suite: PostgreSQL and Redis by default (the real services).

Override with DATABASE_URL / CELERY_BROKER_URL; the embedded default (SQLite) has its
own test, which starts the stack with no variables at all.
"""

import os
import tempfile

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/synth")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
# Parallel test processes (pytest-xdist: gw0, gw1, ...) each get their own PostgreSQL test
# database (pytest-django suffixes its name) and here their own Redis database, counting
# down from the one given: tests flush it and start Celery workers on its queues, which
# another process's tests must not see.
# Once per process tree: the servers and workers a test starts inherit both variables and
# load these settings too.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if (
    _worker.startswith("gw")
    and _worker[2:].isdigit()
    and int(_worker[2:])
    and os.environ.get("SYNTH_TEST_BROKER_OF") != _worker
):
    os.environ["SYNTH_TEST_BROKER_OF"] = _worker
    _base, _, _db = os.environ["CELERY_BROKER_URL"].rpartition("/")
    if _base.startswith("redis") and _db.isdigit():
        if int(_db) - int(_worker[2:]) < 0:
            raise RuntimeError(f"no Redis database left for test worker {_worker} below {_db}")
        os.environ["CELERY_BROKER_URL"] = f"{_base}/{int(_db) - int(_worker[2:])}"
# Rows are rewritten between and within tests: the proxy and the API read credentials,
# routes and pinned versions (a trials worker its node and identity) on every call unless a
# test turns their caches on
# (tests/proxy/test_lookups.py, tests/accounts/test_cached_lookups.py).
os.environ.setdefault("SYNTH_PROXY_LOOKUP_CHECK_SECONDS", "0")
os.environ.setdefault("SYNTH_API_LOOKUP_CHECK_SECONDS", "0")
os.environ.setdefault("SYNTH_API_PIN_CHECK_SECONDS", "0")
os.environ.setdefault("SYNTH_WORKER_LOOKUP_CHECK_SECONDS", "0")
os.environ.setdefault("SYNTH_VAR_DIR", tempfile.mkdtemp(prefix="synth-test-var-"))

from synth_project.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
