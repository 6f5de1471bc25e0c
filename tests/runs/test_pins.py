"""Submission pins cached in the process (apps.runs.pins).

A burst of submissions reads the dataset and profile versions it pins once per check
interval; "the latest" profile is read every time; a version deleted after it was cached
gives the database's answer (404), not a failed insert.
"""

from __future__ import annotations

import copy
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.datasets.models import DatasetVersion
from apps.profiles.models import ProfileVersion
from apps.runs.models import Run, RunSpec
from apps.runs.pins import pins_forget
from tests.factories import NOOP_RECIPE, make_profile_version


@pytest.fixture
def cached(settings):
    settings.SYNTH_API_PIN_CHECK_SECONDS = 60  # fresh for the whole test
    pins_forget()
    yield
    pins_forget()


def submit(member, body, key):
    return member.client.post("/api/runs", json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


def version_reads(member, body, key) -> tuple[int, list[str]]:
    """(status, the pinned-version tables read) of one submission."""
    tables = [DatasetVersion._meta.db_table, ProfileVersion._meta.db_table]
    with CaptureQueriesContext(connection) as queries:
        status = submit(member, body, key).status_code
    return status, [t for t in tables if any(f'FROM "{t}"' in q["sql"] for q in queries.captured_queries)]


@pytest.mark.django_db
def test_fresh_pins_are_not_read_again(cached, alice, inputs):
    assert version_reads(alice, inputs["body"], "k1") == (201, ["datasets_datasetversion", "profiles_profileversion"])
    assert version_reads(alice, inputs["body"], "k2") == (201, [])
    specs = RunSpec.objects.order_by("run__created_at")
    assert [s.dataset_version_id for s in specs] == [inputs["dataset_version"].pk] * 2
    assert [s.actor_version_id for s in specs] == [inputs["actor"].pk] * 2


@pytest.mark.django_db
def test_off_reads_the_pins_on_every_submission(alice, inputs):
    assert version_reads(alice, inputs["body"], "k1")[1] == ["datasets_datasetversion", "profiles_profileversion"]
    assert version_reads(alice, inputs["body"], "k2")[1] == ["datasets_datasetversion", "profiles_profileversion"]


@pytest.mark.django_db
def test_the_latest_profile_is_read_every_time(cached, alice, inputs):
    body = copy.deepcopy(inputs["body"])
    body["actor"] = {"profile": "noop"}
    first = submit(alice, body, "k1")
    assert first.status_code == 201 and first.json()["actor"]["version"] == 1
    make_profile_version(org=alice.org, recipe={**NOOP_RECIPE, "limits": {"timeout_sec": 90}})  # a moment later
    second = submit(alice, body, "k2")
    assert second.status_code == 201 and second.json()["actor"]["version"] == 2


@pytest.mark.django_db(transaction=True)
def test_a_cached_version_deleted_since_answers_not_found(cached, alice, inputs):
    # A submission pins (and caches) the dataset version, then fails on its actor, so no
    # run references the version. PostgreSQL refuses a published version's DELETE
    # (apps.core.immutability), SQLite does not; a deliberate purge truncates.
    body = inputs["body"]
    missing_actor = {**body, "actor": {"profile": "nobody", "version": 1}}
    assert submit(alice, missing_actor, "k1").status_code == 404
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {DatasetVersion._meta.db_table} CASCADE")
        else:
            DatasetVersion.objects.filter(pk=inputs["dataset_version"].pk).delete()
    reply = submit(alice, body, "k2")
    assert reply.status_code == 404, reply.content
    assert "not found" in reply.json()["error"]["message"]
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_a_renamed_organization_s_old_reference_stops_resolving_at_once(cached, alice, inputs):
    # The pins are kept for a minute; who the caller is (and its organization's slug) is read
    # on every request in these tests, as it is within SYNTH_API_LOOKUP_CHECK_SECONDS.
    from apps.accounts.models import Organization

    body = inputs["body"]
    assert submit(alice, body, "k1").status_code == 201
    Organization.objects.filter(pk=alice.org.pk).update(slug="renamed")
    old = submit(alice, body, "k2")
    assert old.status_code == 404, old.content
    renamed = {**body, "dataset": body["dataset"].replace(f"{alice.org.slug}/", "renamed/", 1)}
    assert submit(alice, renamed, "k3").status_code == 201
