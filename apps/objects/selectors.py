"""Reads of stored objects and upload grants, always scoped to one organization."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.accounts.models import Organization
from apps.core.errors import NotFound
from apps.objects.models import StoredObject, UploadGrant


def object_list(*, org: Organization) -> QuerySet[StoredObject]:
    return StoredObject.objects.filter(org=org)


def object_get(*, org: Organization, sha256: str) -> StoredObject:
    """The org's reference to an object. Another org's object is simply not found (404)."""
    obj = StoredObject.objects.filter(org=org, sha256=sha256).first()
    if obj is None:
        raise NotFound(f"no object sha256/{sha256}", field="sha256")
    return obj


def upload_grant_get(*, org: Organization, grant_id: str) -> UploadGrant:
    grant = UploadGrant.objects.filter(org=org, id=grant_id).first()
    if grant is None:
        raise NotFound(f"no upload grant {grant_id}")
    return grant
