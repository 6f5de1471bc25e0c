"""Database phases that outlive a dropped connection (apps.core.db), on the real server:
the server itself ends the connection (pg_terminate_backend, what a restart does to every
client), nothing is restarted."""

from __future__ import annotations

import psycopg
import pytest
from django.db import IntegrityError, OperationalError, connection, transaction

from apps.accounts.models import Organization
from apps.core.db import db_retry

pytestmark = pytest.mark.django_db(transaction=True)


def _server_ends_this_connection() -> None:
    """ "terminating connection due to administrator command", as in a fast restart."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    s = connection.settings_dict
    with psycopg.connect(
        host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"] or "postgres", dbname=s["NAME"],
        autocommit=True,
    ) as admin:  # fmt: skip
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_write_whose_connection_died_is_repeated_on_a_new_one() -> None:
    calls = []

    def write() -> Organization:
        calls.append(1)
        if len(calls) == 1:
            _server_ends_this_connection()
        return Organization.objects.create(slug="after-drop")

    org = db_retry(write=write, what="test write", seconds=10)
    assert org.slug == "after-drop" and len(calls) == 2
    assert Organization.objects.filter(slug="after-drop").count() == 1


def test_a_write_that_committed_before_its_connection_died_is_not_repeated() -> None:
    calls = []

    def write() -> Organization:
        calls.append(1)
        org = Organization.objects.create(slug="committed-once")  # autocommit: on the server now
        if len(calls) == 1:
            _server_ends_this_connection()
            Organization.objects.count()  # the caller never hears that the write succeeded
        return org

    done = db_retry(
        write=write,
        what="test write",
        seconds=10,
        committed=lambda: Organization.objects.filter(slug="committed-once").exists(),
    )
    assert done is None and len(calls) == 1
    assert Organization.objects.filter(slug="committed-once").count() == 1


def test_errors_of_the_write_itself_are_not_retried() -> None:
    Organization.objects.create(slug="taken")
    calls = []

    def write() -> None:
        calls.append(1)
        Organization.objects.create(slug="taken")

    with pytest.raises(IntegrityError):
        db_retry(write=write, what="test write", seconds=10)
    assert len(calls) == 1


def test_it_gives_up_after_its_bound_with_the_last_error() -> None:
    calls = []

    def write() -> None:
        calls.append(1)
        _server_ends_this_connection()
        Organization.objects.count()

    with pytest.raises(OperationalError):
        db_retry(write=write, what="test write", seconds=0.5)
    assert len(calls) >= 2
    assert Organization.objects.count() == 0  # the connection is usable again afterwards


def test_inside_a_transaction_it_runs_once() -> None:
    calls = []
    with pytest.raises(OperationalError), transaction.atomic():

        def write() -> None:
            calls.append(1)
            _server_ends_this_connection()
            Organization.objects.count()

        db_retry(write=write, what="test write", seconds=10)
    assert len(calls) == 1
