"""The filesystem backend of the object store: files under one root, linked into place.

Grants are URLs to our own endpoints (apps.objects.apis), signed with SECRET_KEY.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlencode

from django.conf import settings
from django.core import signing
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse

from apps.core.errors import Forbidden, NotFound
from apps.objects.contract import (
    ChecksumMismatch,
    ObjectCorrupt,
    ObjectStat,
    ObjectStore,
    PresignedRequest,
    PutResult,
    UploadMissing,
    copy_hashing,
    digest_check,
    object_key,
)

logger = logging.getLogger(__name__)

_TOKEN_SALT = "synth.objects.{purpose}"


def token_sign(*, purpose: str, payload: dict[str, Any], expires_at: datetime) -> str:
    """A signed grant for our own endpoints (filesystem backend), keyed by SECRET_KEY.

    The expiry travels inside the signed payload rather than as ``max_age`` at check time,
    so each grant keeps the lifetime it was issued with.
    """
    return signing.dumps({**payload, "exp": int(expires_at.timestamp())}, salt=_TOKEN_SALT.format(purpose=purpose))


def token_load(*, purpose: str, token: str | None) -> dict[str, Any]:
    if not token:
        raise Forbidden("a signed grant (?sig=) is required")
    try:
        payload = signing.loads(token, salt=_TOKEN_SALT.format(purpose=purpose))
    except signing.BadSignature as exc:
        raise Forbidden("invalid grant signature") from exc
    if not isinstance(payload, dict) or payload.get("exp", 0) < time.time():
        raise Forbidden("the grant has expired")
    return payload


class FileSystemStore(ObjectStore):
    scheme = "file"

    def __init__(self, root: Path) -> None:
        if not root.is_absolute():
            raise ImproperlyConfigured(f"SYNTH_OBJECT_STORE needs an absolute path, got {root}")
        self.root = root
        # Temporary files live under the same root so os.link stays on one filesystem.
        self._tmp = root / "tmp"

    def path(self, sha256: str) -> Path:
        return self.root / object_key(sha256)

    def put(self, *, sha256: str, size: int | None, body: bytes | IO[bytes], content_type: str) -> PutResult:
        final = self.path(sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp, prefix=f"{sha256[:16]}.")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                got_sha256, got_size = copy_hashing(body, out, limit=size)
                digest_check(sha256=sha256, size=size, got_sha256=got_sha256, got_size=got_size)
                out.flush()
                os.fsync(out.fileno())
            # Read-only on disk too: the inode is shared with the final name by the link.
            os.chmod(tmp, 0o444)
            try:
                # Atomic and create-only: readers never see a partial file, and of two
                # writers of the same key exactly one links; the other verifies below.
                os.link(tmp, final)
            except FileExistsError:
                if self.verify(sha256=sha256, size=got_size):
                    return "present"
                raise ObjectCorrupt(f"{object_key(sha256)} exists with other bytes; it is not overwritten") from None
            _fsync_dir(final.parent)
            return "created"
        finally:
            tmp.unlink(missing_ok=True)

    def open(self, *, sha256: str) -> IO[bytes]:
        try:
            return self.path(sha256).open("rb")
        except FileNotFoundError:
            raise NotFound(f"{object_key(sha256)} is not in the object store") from None

    def stat(self, *, sha256: str) -> ObjectStat | None:
        try:
            return ObjectStat(size=self.path(sha256).stat().st_size, sha256=None)
        except FileNotFoundError:
            return None

    def verify(self, *, sha256: str, size: int) -> bool | None:
        try:
            with self.path(sha256).open("rb") as f:
                if os.fstat(f.fileno()).st_size != size:
                    return False
                got_sha256, got_size = copy_hashing(f, None, limit=None)
        except FileNotFoundError:
            return None
        return got_sha256 == sha256 and got_size == size

    def delete(self, *, sha256: str) -> None:
        self.path(sha256).unlink(missing_ok=True)

    def upload_request(
        self, *, grant_id: str, org_id: str, sha256: str, size: int, content_type: str, expires_at: datetime
    ) -> PresignedRequest:
        token = token_sign(
            purpose="upload", payload={"g": grant_id, "o": org_id, "s": sha256, "n": size}, expires_at=expires_at
        )
        path = reverse("objects:upload-receive", kwargs={"grant_id": grant_id})
        return PresignedRequest(
            url=f"{settings.SYNTH_PUBLIC_URL}{path}?{urlencode({'sig': token})}",
            method="PUT",
            headers={"Content-Type": content_type},
            expires_at=expires_at,
        )

    def upload_verify(self, *, grant_id: str, sha256: str, size: int, received: bool) -> None:
        # Our endpoint verified the bytes while receiving them and recorded that on the
        # grant (received); we still re-check the file, which is what the row will promise.
        if not received:
            raise UploadMissing("nothing was uploaded under this grant")
        ok = self.verify(sha256=sha256, size=size)
        if ok is None:
            raise UploadMissing(f"{object_key(sha256)} is no longer in the object store")
        if not ok:
            _discard_bad(self, sha256)
            raise ChecksumMismatch(f"{object_key(sha256)} does not match its size and SHA-256")

    def download_request(
        self, *, org_id: str, sha256: str, content_type: str, expires_at: datetime
    ) -> PresignedRequest:
        token = token_sign(purpose="read", payload={"o": org_id, "s": sha256}, expires_at=expires_at)
        path = reverse("objects:content", kwargs={"sha256": sha256})
        return PresignedRequest(
            url=f"{settings.SYNTH_PUBLIC_URL}{path}?{urlencode({'sig': token})}",
            method="GET",
            headers={},
            expires_at=expires_at,
        )


def _fsync_dir(path: Path) -> None:
    """Make the new directory entry durable, not only the file's bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard_bad(store: ObjectStore, sha256: str) -> None:
    # Bytes that do not hash to their key must not stay under it: they would be served as
    # that object, and create-only writes would refuse every correct upload forever.
    logger.warning("removing %s: stored bytes do not match the key", object_key(sha256))
    store.delete(sha256=sha256)
