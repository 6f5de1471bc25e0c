"""Publishing and reading versions against the real database (PostgreSQL)."""

from __future__ import annotations

import copy
import threading

import pytest
from django.db import IntegrityError, connection, connections, transaction

from apps.core.errors import NotFound, ValidationFailed
from apps.profiles.models import AgentProfile, ProfileVersion
from apps.profiles.selectors import (
    profile_version_bytes,
    profile_version_get,
    profile_version_latest,
    profile_version_recipe,
)
from apps.profiles.services import profile_publish
from synth_common.canonical import sha256_hex
from tests.profiles.test_schema import BASE

pytestmark = pytest.mark.django_db


def with_timeout(seconds: float) -> dict:
    out = copy.deepcopy(BASE)
    out["limits"]["timeout_sec"] = seconds
    return out


def test_publish_stores_canonical_bytes_and_their_digest(alice):
    version, created = profile_publish(org=alice.org, name="cc", recipe=BASE, created_by=None)
    assert created and version.version == 1
    stored = ProfileVersion.objects.get(pk=version.pk)
    data = profile_version_bytes(profile_version=stored)
    assert sha256_hex(data) == stored.digest == version.digest
    assert profile_version_recipe(profile_version=stored) == BASE


def test_identical_content_returns_the_existing_version(alice):
    first, created = profile_publish(org=alice.org, name="cc", recipe=BASE, created_by=None)
    reordered = dict(reversed(list(BASE.items())))
    again, created_again = profile_publish(org=alice.org, name="cc", recipe=reordered, created_by=None)
    assert created and not created_again
    assert again.pk == first.pk
    assert ProfileVersion.objects.count() == 1


def test_new_content_gets_the_next_version(alice):
    v1, _ = profile_publish(org=alice.org, name="cc", recipe=BASE, created_by=None)
    v2, _ = profile_publish(org=alice.org, name="cc", recipe=with_timeout(60), created_by=None)
    # Publishing v1's content again after v2 is still v1, not a v3.
    v1_again, created = profile_publish(org=alice.org, name="cc", recipe=BASE, created_by=None)
    assert (v1.version, v2.version, v1_again.version, created) == (1, 2, 1, False)
    assert profile_version_latest(org=alice.org, name="cc").pk == v2.pk


def test_same_recipe_in_two_orgs_is_two_profiles(alice, bob):
    a, _ = profile_publish(org=alice.org, name="cc", recipe=BASE, created_by=None)
    b, created = profile_publish(org=bob.org, name="cc", recipe=BASE, created_by=None)
    assert created and a.pk != b.pk and a.digest == b.digest and b.version == 1


def test_invalid_recipe_or_name_writes_nothing(alice):
    with pytest.raises(ValidationFailed):
        profile_publish(org=alice.org, name="cc", recipe={"engine": {"name": "nop"}}, created_by=None)
    with pytest.raises(ValidationFailed) as info:
        profile_publish(org=alice.org, name="Team/CC@1", recipe=BASE, created_by=None)
    assert info.value.field == "name"
    assert not AgentProfile.objects.exists()


def test_selectors_are_scoped_by_org(alice, bob):
    profile_publish(org=alice.org, name="cc", recipe=BASE, created_by=None)
    assert profile_version_get(org=alice.org, name="cc", version=1).version == 1
    with pytest.raises(NotFound):
        profile_version_get(org=bob.org, name="cc", version=1)
    with pytest.raises(NotFound):
        profile_version_latest(org=bob.org, name="cc")
    with pytest.raises(NotFound):
        profile_version_get(org=alice.org, name="cc", version=2)


def test_published_version_cannot_change_in_the_database(alice):
    assert connection.vendor == "postgresql"
    version, _ = profile_publish(org=alice.org, name="cc", recipe=BASE, created_by=None)
    original = bytes(version.canonical)

    with pytest.raises(IntegrityError, match="immutable"), transaction.atomic():
        ProfileVersion.objects.filter(pk=version.pk).update(digest="0" * 64)
    with pytest.raises(IntegrityError, match="immutable"), transaction.atomic():
        version.canonical = b"{}"
        version.save()
    with pytest.raises(IntegrityError, match="immutable"), transaction.atomic():
        ProfileVersion.objects.filter(pk=version.pk).delete()
    with pytest.raises(IntegrityError, match="immutable"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("UPDATE profiles_profileversion SET version = 7")

    stored = ProfileVersion.objects.get(pk=version.pk)
    assert bytes(stored.canonical) == original and stored.version == 1


def _run_concurrently(targets: list) -> list:
    """Run each callable in its own thread (own connection), released together."""
    barrier = threading.Barrier(len(targets))
    results: list = [None] * len(targets)

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = targets[i]()
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(targets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@pytest.mark.django_db(transaction=True)
def test_concurrent_publishes_take_distinct_versions(alice):
    recipes = [with_timeout(10 + i) for i in range(6)]
    results = _run_concurrently(
        [lambda r=r: profile_publish(org=alice.org, name="cc", recipe=r, created_by=None) for r in recipes]
    )
    assert all(isinstance(result, tuple) for result in results), results
    assert sorted(version.version for version, _ in results) == [1, 2, 3, 4, 5, 6]
    assert AgentProfile.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_identical_publishes_make_one_version(alice):
    results = _run_concurrently(
        [lambda: profile_publish(org=alice.org, name="cc", recipe=BASE, created_by=None) for _ in range(6)]
    )
    assert all(isinstance(result, tuple) for result in results), results
    assert {version.pk for version, _ in results} == {ProfileVersion.objects.get().pk}
    assert sum(created for _, created in results) == 1
