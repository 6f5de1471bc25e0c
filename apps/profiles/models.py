from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.accounts.models import Organization
from apps.core.ids import PrefixedIdField


class AgentProfile(models.Model):
    id = PrefixedIdField(prefix="prf")
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="profiles")
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "name"], name="agentprofile_unique_org_name")]

    def __str__(self) -> str:
        return f"{self.org.slug}/{self.name}"


class ProfileVersion(models.Model):
    """A published recipe: exact canonical JSON bytes and their sha256. Never changes.

    UPDATE and DELETE are refused by a database trigger (see the migration), so not
    even a bulk update, the shell or the admin can alter a version that a run pinned.
    """

    id = PrefixedIdField(prefix="pv")
    profile = models.ForeignKey(AgentProfile, on_delete=models.PROTECT, related_name="versions")
    version = models.PositiveIntegerField()
    canonical = models.BinaryField()
    digest = models.CharField(max_length=64)
    # PROTECT, not SET_NULL: nulling the author is an UPDATE, which the trigger refuses, so
    # deleting a user who published would fail deep in a cascade. Deactivate such users.
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["profile", "version"], name="profileversion_unique_version"),
            models.UniqueConstraint(fields=["profile", "digest"], name="profileversion_unique_digest"),
        ]

    def __str__(self) -> str:
        return f"{self.profile}@{self.version}"
