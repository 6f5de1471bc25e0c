"""Writes for agent profiles: publishing immutable, content-addressed versions."""

from __future__ import annotations

import math
import re
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Max

from apps.accounts.models import Organization
from apps.core.errors import ValidationFailed
from apps.profiles.models import AgentProfile, ProfileVersion
from apps.profiles.schema import MAX_RECIPE_BYTES, recipe_validate
from synth_common.canonical import canonical_bytes, sha256_hex
from synth_launcher.launcher import LaunchError, recipe_launch_check

# Lower case only, so that "Claude" and "claude" cannot be two profiles; no "/" or "@",
# which separate the parts of references such as team/name@3.
PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
# Integers beyond this are not exact as JSON numbers in most clients (IEEE doubles).
_EXACT_INT = 2**53


def profile_name_validate(*, name: str) -> None:
    if not PROFILE_NAME.fullmatch(name):
        raise ValidationFailed(
            "a profile name is 1-100 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit",
            field="name",
        )


def _numbers_normalize(value: Any) -> Any:
    """1800.0 -> 1800, recursively.

    JavaScript (and so many JSON clients) cannot tell 1800 from 1800.0, yet Python's
    json writes them differently; without this, the same recipe published from two
    clients would get two digests and two versions.
    """
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < _EXACT_INT:
        return int(value)
    if isinstance(value, dict):
        return {key: _numbers_normalize(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_numbers_normalize(item) for item in value]
    return value


def recipe_canonicalize(*, recipe: dict[str, Any]) -> bytes:
    """Validate `recipe` (its schema, and that it can launch at all) and return its canonical
    bytes (synth_common.canonical, integral numbers as integers)."""
    recipe_validate(recipe=recipe)
    try:
        recipe_launch_check(recipe=recipe)
    except LaunchError as exc:
        raise ValidationFailed(f"the recipe can never launch: {exc.message}", field=exc.field) from None
    try:
        data = canonical_bytes(_numbers_normalize(recipe))
    except ValueError as exc:  # NaN or Infinity, which JSON cannot carry
        raise ValidationFailed(f"not representable as JSON: {exc}") from exc
    if len(data) > MAX_RECIPE_BYTES:
        raise ValidationFailed(f"the canonical recipe is {len(data)} bytes; the limit is {MAX_RECIPE_BYTES}")
    return data


def profile_publish(
    *,
    org: Organization,
    name: str,
    recipe: dict[str, Any],
    created_by: AbstractBaseUser | None,
) -> tuple[ProfileVersion, bool]:
    """Publish `recipe` as a version of profile `name`; returns (version, created).

    Identical content (same canonical bytes) returns the existing version with
    created=False; new content becomes version = previous max + 1.
    """
    profile_name_validate(name=name)
    data = recipe_canonicalize(recipe=recipe)
    digest = sha256_hex(data)

    # Republishing is the common case (the CLI publishes-or-finds before every run):
    # answer it without taking the lock.
    existing = ProfileVersion.objects.filter(profile__org=org, profile__name=name, digest=digest).first()
    if existing is not None:
        return existing, False

    with transaction.atomic():
        # get_or_create survives a concurrent first publish: the loser's INSERT hits the
        # (org, name) unique constraint inside a savepoint and it reads the winner's row.
        profile, _ = AgentProfile.objects.get_or_create(org=org, name=name)
        # The row lock serialises publishers of this profile, so "max + 1" cannot be
        # taken twice and a concurrent identical publish sees the other's version.
        AgentProfile.objects.select_for_update().filter(pk=profile.pk).get()
        existing = ProfileVersion.objects.filter(profile=profile, digest=digest).first()
        if existing is not None:
            return existing, False
        latest = ProfileVersion.objects.filter(profile=profile).aggregate(latest=Max("version"))["latest"] or 0
        version = ProfileVersion.objects.create(
            profile=profile, version=latest + 1, canonical=data, digest=digest, created_by=created_by
        )
    return version, True
