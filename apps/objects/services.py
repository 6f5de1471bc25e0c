"""Writes to the object store and the references (StoredObject rows) that grant reads.

Invariant: a StoredObject row exists only for bytes verified in the store under their key
(size and SHA-256), so any reference is readable. Two ways in:

* ``object_put``: the control plane holds the bytes; the store verifies while writing.
* ``object_upload_grant`` -> the producer PUTs to the grant's URL -> ``object_commit``,
  which verifies what is in the store and only then writes the row ("commit after verify").

Content addressing makes a second put of the same bytes a no-op success ("present"); bytes
that do not match their declared digest are refused and nothing is committed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Organization
from apps.core.bulk import rows_copy
from apps.core.errors import Forbidden, NotFound, ValidationFailed
from apps.objects.contract import MAX_OBJECT_SIZE, PresignedRequest, PutResult
from apps.objects.filesystem import FileSystemStore, token_load
from apps.objects.models import StoredObject, UploadGrant
from apps.objects.selectors import object_get
from apps.objects.store import grant_expiry, store_get

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_CONTENT_TYPE = "application/octet-stream"


@dataclass(frozen=True)
class UploadGrantIssued:
    grant: UploadGrant
    request: PresignedRequest


@dataclass(frozen=True)
class ReadGrant:
    obj: StoredObject
    request: PresignedRequest


def _validate(*, sha256: str, size: int, content_type: str) -> None:
    if not _SHA256.match(sha256):
        raise ValidationFailed("sha256 must be 64 lower-case hex digits", field="sha256")
    if size < 0 or size > MAX_OBJECT_SIZE:
        raise ValidationFailed(f"size must be between 0 and {MAX_OBJECT_SIZE} bytes", field="size")
    if not content_type or len(content_type) > 100:
        raise ValidationFailed("content_type must be 1 to 100 characters", field="content_type")


def _reference(*, org: Organization, sha256: str, size: int, content_type: str) -> StoredObject:
    # get_or_create: a second commit of the same bytes by the same org is the same reference
    # (the unique (org, sha256) constraint settles concurrent commits).
    obj, _ = StoredObject.objects.get_or_create(
        org=org, sha256=sha256, defaults={"size": size, "content_type": content_type}
    )
    return obj


def object_put(*, org: Organization, data: bytes, content_type: str = DEFAULT_CONTENT_TYPE) -> StoredObject:
    """Store bytes create-only under sha256/<hex>, verified, and commit the org's reference.

    Returns the org's StoredObject whether the bytes were new or already present.
    """
    sha256 = hashlib.sha256(data).hexdigest()
    _validate(sha256=sha256, size=len(data), content_type=content_type)
    store_get().put(sha256=sha256, size=len(data), body=data, content_type=content_type)
    return _reference(org=org, sha256=sha256, size=len(data), content_type=content_type)


def objects_put_many(
    *, org: Organization, blobs: list[bytes], content_type: str = DEFAULT_CONTENT_TYPE
) -> dict[str, StoredObject]:
    """``object_put`` for many blobs (a dataset's task archives): the org's references by
    sha256. The store writes the batch as it writes best (ObjectStore.put_many); the
    references take a few statements, not a few per blob."""
    by_sha = {hashlib.sha256(data).hexdigest(): data for data in blobs}
    for sha256, data in by_sha.items():
        _validate(sha256=sha256, size=len(data), content_type=content_type)
    store_get().put_many(items=list(by_sha.items()), content_type=content_type)
    found: dict[str, StoredObject] = {}
    shas = list(by_sha)
    for start in range(0, len(shas), 1000):
        chunk = shas[start : start + 1000]
        found.update({o.sha256: o for o in StoredObject.objects.filter(org=org, sha256__in=chunk)})
        missing = [sha for sha in chunk if sha not in found]
        if missing:
            # ignore_conflicts: a concurrent put of the same bytes by this org may have won;
            # its row is read back like ours.
            rows_copy(
                objs=[
                    StoredObject(org=org, sha256=sha, size=len(by_sha[sha]), content_type=content_type)
                    for sha in missing
                ],
                ignore_conflicts=True,
            )
            found.update({o.sha256: o for o in StoredObject.objects.filter(org=org, sha256__in=missing)})
    return found


def object_open(*, obj: StoredObject) -> IO[bytes]:
    """A binary stream of an object (close it after use). Not re-hashed: see object_read."""
    return store_get().open(sha256=obj.sha256)


def object_read(*, obj: StoredObject) -> bytes:
    """All bytes of an object, checked against its digest (cheap once they are in memory)."""
    return store_get().read_verified(sha256=obj.sha256, size=obj.size)


def objects_read(*, objs: Sequence[StoredObject]) -> dict[str, bytes]:
    """``object_read`` of many references at once, by sha256: read together
    (ObjectStore.read_many), each checked against its digest."""
    return store_get().read_many(sizes={obj.sha256: obj.size for obj in objs})


def objects_read_many(*, org: Organization, sha256s: Sequence[str]) -> dict[str, bytes]:
    """``object_read`` of many of the org's objects, by sha256: their references in one
    statement per thousand, their bytes read together (ObjectStore.read_many), each checked
    against its digest. NotFound names the first the org has no reference to."""
    wanted = list(dict.fromkeys(sha256s))
    sizes: dict[str, int] = {}
    for start in range(0, len(wanted), 1000):
        chunk = wanted[start : start + 1000]
        sizes.update(StoredObject.objects.filter(org=org, sha256__in=chunk).values_list("sha256", "size"))
    for sha256 in wanted:
        if sha256 not in sizes:
            raise NotFound(f"no object sha256/{sha256}", field="sha256")
    return store_get().read_many(sizes={sha256: sizes[sha256] for sha256 in wanted})


def object_upload_grant(
    *, org: Organization, sha256: str, size: int, content_type: str = DEFAULT_CONTENT_TYPE
) -> UploadGrantIssued:
    """Permission to upload one object of this digest and size, as a request to make.

    The request is create-only and bound to the digest (S3: signed If-None-Match and
    x-amz-checksum-sha256 headers; filesystem: our endpoint verifies while receiving).
    """
    sha256 = sha256.lower()
    _validate(sha256=sha256, size=size, content_type=content_type)
    grant = UploadGrant.objects.create(
        org=org, sha256=sha256, size=size, content_type=content_type, expires_at=grant_expiry()
    )
    request = store_get().upload_request(
        grant_id=grant.id,
        org_id=org.id,
        sha256=sha256,
        size=size,
        content_type=content_type,
        expires_at=grant.expires_at,
    )
    return UploadGrantIssued(grant=grant, request=request)


def object_upload_receive(
    *, grant_id: str, token: str | None, body: IO[bytes], content_length: int | None
) -> PutResult:
    """The filesystem store's upload endpoint: the signed token is the only authority.

    Streams the body into the store, hashing as it goes; a wrong size or digest leaves
    no file behind. Records on the grant that verified bytes arrived, which the commit
    requires (proof that this org holds the bytes, even when they were already stored).
    """
    payload = token_load(purpose="upload", token=token)
    if payload.get("g") != grant_id:
        raise Forbidden("the signature is for another grant")
    store = store_get()
    if not isinstance(store, FileSystemStore):
        raise NotFound("this object store takes uploads at its own presigned URLs")
    grant = UploadGrant.objects.filter(id=grant_id, org_id=payload.get("o")).first()
    if grant is None:
        raise NotFound(f"no upload grant {grant_id}")
    if grant.expires_at <= timezone.now():
        raise Forbidden("the grant has expired")
    if content_length is not None and content_length != grant.size:
        raise ValidationFailed(f"Content-Length must be the granted size, {grant.size}", field="size")
    result = store.put(sha256=grant.sha256, size=grant.size, body=body, content_type=grant.content_type)
    UploadGrant.objects.filter(pk=grant.pk, uploaded_at__isnull=True).update(uploaded_at=timezone.now())
    return result


def object_commit(*, org: Organization, grant: UploadGrant) -> StoredObject:
    """Verify the grant's bytes in the store, then (only then) commit the org's reference.

    Retry-safe: committing a committed grant returns the same object. The grant's expiry
    bounds the upload, not the commit; the bytes are verified either way.
    """
    if grant.org_id != org.id:
        raise NotFound(f"no upload grant {grant.id}")
    # The caller's instance may predate the upload (our endpoint records it on the row).
    grant.refresh_from_db(fields=["uploaded_at", "committed_at"])
    if grant.committed_at is not None:
        return object_get(org=org, sha256=grant.sha256)
    # Verification reads the store (possibly the whole object), so it runs before the
    # transaction: no row lock is held across network or disk IO.
    store_get().upload_verify(
        grant_id=grant.id, sha256=grant.sha256, size=grant.size, received=grant.uploaded_at is not None
    )
    with transaction.atomic():
        locked = UploadGrant.objects.select_for_update().get(pk=grant.pk)
        obj = _reference(org=org, sha256=grant.sha256, size=grant.size, content_type=grant.content_type)
        if locked.committed_at is None:
            locked.committed_at = timezone.now()
            locked.save(update_fields=["committed_at"])
    grant.committed_at = locked.committed_at
    return obj


def object_read_grant(*, org: Organization, sha256: str) -> ReadGrant:
    """A time-limited URL to read one object, only for an org holding a reference to it."""
    obj = object_get(org=org, sha256=sha256.lower())
    request = store_get().download_request(
        org_id=org.id, sha256=obj.sha256, content_type=obj.content_type, expires_at=grant_expiry()
    )
    return ReadGrant(obj=obj, request=request)


def object_content_open(*, sha256: str, token: str | None) -> tuple[StoredObject, IO[bytes]]:
    """The filesystem store's read endpoint: a signed read grant opens the object.

    The org's reference is looked up again, so deleting it revokes outstanding grants.
    """
    payload = token_load(purpose="read", token=token)
    if payload.get("s") != sha256:
        raise Forbidden("the signature is for another object")
    obj = StoredObject.objects.filter(org_id=payload.get("o"), sha256=sha256).first()
    if obj is None:
        raise NotFound(f"no object sha256/{sha256}")
    return obj, store_get().open(sha256=sha256)
