"""The admin shows profiles and versions and offers no way to change a version."""

from __future__ import annotations

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth import get_user_model
from django.test import Client

from apps.profiles.models import AgentProfile, ProfileVersion
from apps.profiles.services import profile_publish
from tests.profiles.test_schema import BASE

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def test_pages_render_with_pretty_recipe(alice, admin_client):
    version, _ = profile_publish(org=alice.org, name="cc", recipe=BASE, created_by=None)
    pages = [
        "/admin/profiles/agentprofile/",
        f"/admin/profiles/agentprofile/{version.profile_id}/change/",
        "/admin/profiles/profileversion/",
        "/admin/profiles/profileversion/?q=cc",
        f"/admin/profiles/profileversion/{version.pk}/change/",
    ]
    for page in pages:
        assert admin_client.get(page).status_code == 200, page
    detail = admin_client.get(f"/admin/profiles/profileversion/{version.pk}/change/").content.decode()
    assert "&quot;timeout_sec&quot;: 1800" in detail  # indented, escaped, read-only
    assert 'name="_save"' not in detail


def test_versions_are_read_only(rf, admin_client):
    request = rf.get("/")
    request.user = get_user_model().objects.get(username="root")
    model_admin = site._registry[ProfileVersion]
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert not model_admin.has_delete_permission(request)
    assert not site._registry[AgentProfile].has_delete_permission(request)
