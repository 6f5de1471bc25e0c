"""The versions a run submission pins, cached in the process while fresh.

A submission names a dataset version (ORG/NAME@VERSION) and a profile version; both are
immutable once written, and reading them (with their organization, dataset or profile,
and the dataset's local-sandbox verdict) was a third of a submission's time. Served from
here while the read is at most SYNTH_API_PIN_CHECK_SECONDS old (synth_common.fresh_cache),
a burst of submissions of one campaign reads them about once per interval per process.
Nothing in them changes, so the interval need not be short; a dataset reference is looked
up under its organization's slug as the caller was authenticated (fresh within
SYNTH_API_LOOKUP_CHECK_SECONDS), so a renamed organization's old references stop resolving
with it, not a pin interval later.

Immutable is not always undeletable: PostgreSQL refuses a published version's DELETE
(apps.core.immutability) but not a deliberate purge's TRUNCATE, and SQLite refuses only
its UPDATE. A run pinned to one that went away meanwhile fails its insert on the foreign
key, and run_submit then admits it again with nothing cached (``pins_forget``), so the
answer is the database's. A profile named without a version ("the latest") is never cached: a version
published a moment ago must be the one a following submission pins.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from apps.accounts.models import Organization
from apps.datasets.models import DatasetVersion
from apps.datasets.services import dataset_version_resolve
from apps.profiles.models import ProfileVersion
from apps.profiles.selectors import profile_version_get, profile_version_recipe
from synth_common.fresh_cache import FreshCache

PIN_ENTRIES = 1024


def _check_seconds() -> float:
    return settings.SYNTH_API_PIN_CHECK_SECONDS


_datasets: FreshCache[tuple[str, str, str, bool], DatasetVersion] = FreshCache(
    maxsize=PIN_ENTRIES, check_seconds=_check_seconds
)
_profiles: FreshCache[tuple[str, str, int], tuple[ProfileVersion, dict[str, Any]]] = FreshCache(
    maxsize=PIN_ENTRIES, check_seconds=_check_seconds
)


def dataset_version_pinned(
    *, org: Organization, reference: str, with_local_support: bool, cached: bool
) -> DatasetVersion:
    """dataset_version_resolve, from the cache when ``cached`` and fresh."""
    found = _datasets.read_through(
        (org.pk, org.slug, reference, with_local_support),
        read=lambda: dataset_version_resolve(org=org, reference=reference, with_local_support=with_local_support),
        cached=cached,
    )
    assert found is not None  # dataset_version_resolve raises NotFound
    return found


def profile_version_pinned(
    *, org: Organization, name: str, version: int, cached: bool
) -> tuple[ProfileVersion, dict[str, Any]]:
    """profile_version_get and its recipe (verified), from the cache when ``cached`` and fresh.
    The recipe is shared: read it, do not change it."""

    def read() -> tuple[ProfileVersion, dict[str, Any]]:
        profile_version = profile_version_get(org=org, name=name, version=version)
        return profile_version, profile_version_recipe(profile_version=profile_version)

    found = _profiles.read_through((org.pk, name, version), read=read, cached=cached)
    assert found is not None  # profile_version_get raises NotFound
    return found


def pins_forget() -> None:
    """Forget every cached pin (a pinned row went away; tests that rewrite rows)."""
    _datasets.clear()
    _profiles.clear()
