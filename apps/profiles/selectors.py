"""Reads for agent profiles. Every read is scoped by organization: another org's profile is NotFound."""

from __future__ import annotations

import json
from typing import Any

from django.db.models import Count, Max, QuerySet

from apps.accounts.models import Organization
from apps.core.errors import NotFound
from apps.profiles.models import AgentProfile, ProfileVersion
from synth_common.canonical import sha256_hex


class ProfileIntegrityError(RuntimeError):
    """Stored canonical bytes no longer hash to the stored digest: corruption, never a user error."""


def profile_list(*, org: Organization) -> QuerySet[AgentProfile]:
    return AgentProfile.objects.filter(org=org).annotate(
        latest_version=Max("versions__version"), versions_count=Count("versions")
    )


def profile_get(*, org: Organization, name: str) -> AgentProfile:
    profile = profile_list(org=org).filter(name=name).first()
    if profile is None:
        raise NotFound(f"no profile {name!r}", field="name")
    return profile


def profile_version_list(*, profile: AgentProfile) -> QuerySet[ProfileVersion]:
    # The list shows metadata; the canonical bytes (up to a MiB each) stay in the database.
    return ProfileVersion.objects.filter(profile=profile).defer("canonical").select_related("profile")


def profile_version_get(*, org: Organization, name: str, version: int) -> ProfileVersion:
    versions = ProfileVersion.objects.select_related("profile").filter(
        profile__org=org, profile__name=name, version=version
    )
    found = next(iter(versions[:1]), None)  # unique (profile, version): no ORDER BY to compile
    if found is None:
        raise NotFound(f"no version {version} of profile {name!r}", field="version")
    return found


def profile_version_latest(*, org: Organization, name: str) -> ProfileVersion:
    found = (
        ProfileVersion.objects.select_related("profile")
        .filter(profile__org=org, profile__name=name)
        .order_by("-version")
        .first()
    )
    if found is None:
        raise NotFound(f"no published version of profile {name!r}", field="name")
    return found


def profile_version_bytes(*, profile_version: ProfileVersion) -> bytes:
    """The exact canonical bytes (PostgreSQL hands a BinaryField back as a memoryview)."""
    return bytes(profile_version.canonical)


def profile_version_verify(*, profile_version: ProfileVersion) -> bytes:
    """The canonical bytes, after checking that they still hash to the stored digest."""
    data = profile_version_bytes(profile_version=profile_version)
    if sha256_hex(data) != profile_version.digest:
        raise ProfileIntegrityError(
            f"{profile_version.pk}: canonical bytes do not match digest {profile_version.digest}"
        )
    return data


def profile_version_recipe(*, profile_version: ProfileVersion) -> dict[str, Any]:
    """The recipe as a dict (json.loads of the verified canonical bytes)."""
    return json.loads(profile_version_verify(profile_version=profile_version))
