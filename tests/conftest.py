"""Shared fixtures: organizations, members with tokens, API clients."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Organization, Role
from apps.accounts.services import (
    membership_set,
    org_get_or_create,
    token_issue,
    worker_get_or_create,
    worker_token_issue,
)


@dataclass
class Member:
    org: Organization
    secret: str
    client: APIClient


def make_client(secret: str | None) -> APIClient:
    client = APIClient()
    if secret:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def make_member(slug: str, username: str, role: str = Role.OPERATOR) -> Member:
    org = org_get_or_create(slug=slug)
    membership = membership_set(org=org, username=username, role=role)
    issued = token_issue(org=org, user=membership.user)
    return Member(org=org, secret=issued.secret, client=make_client(issued.secret))


@pytest.fixture
def alice(db) -> Member:
    """An operator of org "team"."""
    return make_member("team", "alice")


@pytest.fixture
def viewer(db, alice) -> Member:
    return make_member("team", "vera", Role.VIEWER)


@pytest.fixture
def bob(db) -> Member:
    """An operator of another organization, "rival"."""
    return make_member("rival", "bob")


@pytest.fixture
def worker_client(db) -> APIClient:
    worker = worker_get_or_create(name="test-worker")
    return make_client(worker_token_issue(worker=worker).secret)


@pytest.fixture
def inputs(alice) -> dict:
    """A dataset version and an actor profile version of alice's org, and a valid run body."""
    from tests.factories import make_dataset_version, make_profile_version

    dsv = make_dataset_version(org=alice.org)
    actor = make_profile_version(org=alice.org)
    body = {
        "kind": "evaluate",
        "dataset": dsv.reference,
        "actor": {"profile": actor.profile.name, "version": actor.version},
        "judge": None,
        "plan": {"attempts_per_task": 2},
    }
    return {"dataset_version": dsv, "actor": actor, "body": body}
