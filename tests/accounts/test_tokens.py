from __future__ import annotations

import hashlib
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from apps.accounts.models import ApiToken, Membership
from apps.accounts.services import token_revoke
from tests.conftest import make_client

pytestmark = pytest.mark.django_db


def test_tokens_are_stored_hashed(alice):
    token = ApiToken.objects.get(user__username="alice")
    assert token.token_hash == hashlib.sha256(alice.secret.encode()).hexdigest()
    secret_part = alice.secret.split("_", 2)[2]
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM accounts_apitoken")
        for row in cursor.fetchall():
            assert not any(isinstance(v, str) and secret_part in v for v in row)


def test_create_token_command_prints_a_working_token():
    out = StringIO()
    call_command("create_token", "--org", "acme", "--user", "carol", stdout=out)
    secret = out.getvalue().strip()
    assert secret.startswith("syn_")
    assert make_client(secret).get("/api/runs").status_code == 200
    assert Membership.objects.get(user__username="carol").role == "operator"


def test_worker_token_from_the_command():
    out = StringIO()
    call_command("create_token", "--worker", "w1", stdout=out)
    client = make_client(out.getvalue().strip())
    assert client.post("/api/worker/claims", {}, format="json").status_code == 204
    assert client.get("/api/runs").status_code == 403


def test_expired_and_revoked_tokens_are_refused(alice):
    token = ApiToken.objects.get(user__username="alice")
    token.expires_at = timezone.now() - timedelta(seconds=1)
    token.save()
    assert alice.client.get("/api/runs").status_code == 401
    token.expires_at = None
    token.save()
    assert alice.client.get("/api/runs").status_code == 200
    token_revoke(token=token)
    assert alice.client.get("/api/runs").status_code == 401


def test_removed_member_loses_access(alice):
    Membership.objects.filter(user__username="alice").delete()
    assert alice.client.get("/api/runs").status_code == 401


def test_last_used_is_recorded(alice):
    alice.client.get("/api/runs")
    assert ApiToken.objects.get(user__username="alice").last_used_at is not None
