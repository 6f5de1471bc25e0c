"""The REST API's cached principals (apps.accounts.authentication.principals).

A fresh cached principal reads no database; a revocation, an expiry, a removed membership
or a disabled worker, however it was written, is refused once the check interval has
passed since the principal was read. No assertion on time: the interval is waited out
(staleness is measured from the start of the read, so that is true by construction).
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.accounts.authentication import principals
from apps.accounts.models import ApiToken, Membership, WorkerIdentity
from apps.accounts.services import worker_get_or_create, worker_token_issue
from tests.conftest import make_client

pytestmark = pytest.mark.django_db

CHECK_SECONDS = 1.0


@pytest.fixture
def cached(settings):
    settings.SYNTH_API_LOOKUP_CHECK_SECONDS = CHECK_SECONDS
    principals.clear()
    yield
    principals.clear()


def past_the_check_interval() -> None:
    time.sleep(CHECK_SECONDS * 1.5)


def token_queries(client, path: str = "/api/runs") -> tuple[int, int]:
    """(status, queries reading the token table) of one request."""
    with CaptureQueriesContext(connection) as queries:
        status = client.get(path).status_code
    return status, sum(ApiToken._meta.db_table in q["sql"] for q in queries.captured_queries)


def test_a_fresh_principal_reads_no_token(cached, settings, alice):
    settings.SYNTH_API_LOOKUP_CHECK_SECONDS = 60  # fresh for the whole test
    assert token_queries(alice.client)[0] == 200  # read (and its first use recorded)
    assert token_queries(alice.client) == (200, 0)
    assert token_queries(alice.client) == (200, 0)
    # Another secret is its own entry, and an unknown one is never cached.
    stranger = make_client("syn_nope_" + "x" * 40)
    assert stranger.get("/api/runs").status_code == 401
    assert token_queries(stranger) == (401, 1)


def test_off_reads_the_token_on_every_request(alice):
    assert token_queries(alice.client)[0] == 200
    assert token_queries(alice.client) == (200, 1)
    assert token_queries(alice.client) == (200, 1)


@pytest.mark.parametrize(
    "change",
    ["revoked", "expired", "membership removed"],
)
def test_a_change_written_around_the_service_is_refused_past_the_interval(cached, alice, change):
    assert alice.client.get("/api/runs").status_code == 200
    tokens = ApiToken.objects.filter(user__username="alice")
    if change == "revoked":
        tokens.update(revoked_at=timezone.now())
    elif change == "expired":
        tokens.update(expires_at=timezone.now() - timedelta(seconds=1))
    else:
        Membership.objects.filter(user__username="alice").delete()
    past_the_check_interval()
    assert alice.client.get("/api/runs").status_code == 401


def test_a_cached_expiry_is_checked_on_every_use(cached, settings, alice):
    settings.SYNTH_API_LOOKUP_CHECK_SECONDS = 60
    token = ApiToken.objects.get(user__username="alice")
    token.expires_at = timezone.now() + timedelta(seconds=CHECK_SECONDS)
    token.save()
    assert alice.client.get("/api/runs").status_code == 200  # read now, with its expiry
    past_the_check_interval()  # the expiry has passed; the entry itself is still fresh
    assert alice.client.get("/api/runs").status_code == 401


def test_a_disabled_worker_is_refused_past_the_interval(cached):
    worker = worker_get_or_create(name="w-cached")
    client = make_client(worker_token_issue(worker=worker).secret)
    assert client.post("/api/worker/claims", {}, format="json").status_code == 204
    WorkerIdentity.objects.filter(pk=worker.pk).update(disabled_at=timezone.now())
    past_the_check_interval()
    assert client.post("/api/worker/claims", {}, format="json").status_code == 401
