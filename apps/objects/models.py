from __future__ import annotations

from django.db import models

from apps.accounts.models import Organization
from apps.core.ids import PrefixedIdField


class StoredObject(models.Model):
    """A committed, verified object in the object store (key = sha256/<hex>).

    A row exists only after the bytes were verified in the store (size and SHA-256), so a
    reference to one is always readable. Objects are shared by content; each organization
    that committed one has its own row, which is what grants a read.
    """

    id = PrefixedIdField(prefix="obj")
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="objects_stored")
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    content_type = models.CharField(max_length=100, default="application/octet-stream")
    committed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org", "sha256"], name="storedobject_unique_org_sha")]

    @property
    def key(self) -> str:
        return f"sha256/{self.sha256}"

    def __str__(self) -> str:
        return f"{self.key} ({self.size} B)"


class UploadGrant(models.Model):
    """Permission to upload one object of a declared digest and size, until it expires.

    The grant is also the proof that its org holds the bytes: a commit only counts bytes
    uploaded under this grant, never an object some other upload stored under the key.
    """

    id = PrefixedIdField(prefix="upg")
    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="upload_grants")
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    content_type = models.CharField(max_length=100, default="application/octet-stream")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    # Set by our own upload endpoint (filesystem store) once it received verified bytes;
    # S3 uploads bypass us, so there the commit finds them in the bucket instead.
    uploaded_at = models.DateTimeField(null=True, blank=True)
    committed_at = models.DateTimeField(null=True, blank=True)

    @property
    def key(self) -> str:
        return f"sha256/{self.sha256}"

    def __str__(self) -> str:
        return f"{self.id} for {self.key} ({self.size} B)"
