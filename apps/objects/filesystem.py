"""The filesystem backend of the object store: files under one root, linked into place.

Grants are URLs to our own endpoints (apps.objects.apis), signed with SECRET_KEY.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Callable, Sequence
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
# From this many new objects on, put_many makes a batch durable with two syncfs calls (the
# bytes, then the names) instead of two fsyncs per object: thousands of fsyncs were most of
# a dataset push's storing time. Below it, the object-by-object path is cheaper than
# flushing the whole filesystem.
SYNCFS_MIN_OBJECTS = 64


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
                if self._present(sha256=sha256, size=got_size):
                    return "present"
                raise ObjectCorrupt(f"{object_key(sha256)} vanished while it was written") from None
            _fsync_dir(final.parent)
            return "created"
        finally:
            tmp.unlink(missing_ok=True)

    def put_many(self, *, items: Sequence[tuple[str, bytes]], content_type: str) -> dict[str, PutResult]:
        """Every object's bytes are verified and written to a temporary file, all of them
        made durable at once (syncfs), then linked into place, and the new names made
        durable at once: the same create-only, verified-before-visible writes as ``put``,
        and no linked name whose bytes a crash could lose. Objects already stored are
        verified, not written again.

        Paths are plain strings and each temporary file is made read-only as it is created:
        pathlib's objects and tempfile's names were a third of a 10,000-object batch."""
        if _syncfs is None or len(items) < SYNCFS_MIN_OBJECTS:
            return super().put_many(items=items, content_type=content_type)
        results: dict[str, PutResult] = {}
        pending: list[tuple[str, int, str, str]] = []  # sha256, size, temporary file, final path
        made: set[str] = set()
        self._tmp.mkdir(parents=True, exist_ok=True)
        tmp_dir, root = str(self._tmp), str(self.root)
        try:
            for sha256, data in items:
                got_sha256, got_size = copy_hashing(data, None, limit=None)
                digest_check(sha256=sha256, size=len(data), got_sha256=got_sha256, got_size=got_size)
                final = os.path.join(root, object_key(sha256))
                if os.path.lexists(final) and self._present(sha256=sha256, size=got_size):
                    results[sha256] = "present"
                    continue
                parent = os.path.dirname(final)
                if parent not in made:
                    os.makedirs(parent, exist_ok=True)
                    made.add(parent)
                # Create-only (O_EXCL) under a random name, read-only from the start: the
                # inode is shared with the final name by the link.
                tmp_name = os.path.join(tmp_dir, f"{sha256[:16]}.{secrets.token_hex(8)}")
                fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
                pending.append((sha256, got_size, tmp_name, final))
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
            if not pending:
                return results
            _syncfs_path(self._tmp)  # every temporary file's bytes, before any is linked
            for sha256, size, tmp_name, final in pending:
                try:
                    os.link(tmp_name, final)
                    results[sha256] = "created"
                except FileExistsError:  # a concurrent writer linked it first
                    if not self._present(sha256=sha256, size=size):
                        raise ObjectCorrupt(f"{object_key(sha256)} vanished while it was written") from None
                    results[sha256] = "present"
            _syncfs_path(self._tmp)  # the new names
            return results
        finally:
            for _, _, tmp_name, _ in pending:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp_name)

    def _present(self, *, sha256: str, size: int) -> bool:
        """Whether the object is stored (verified); ObjectCorrupt if other bytes are."""
        ok = self.verify(sha256=sha256, size=size)
        if ok is False:
            raise ObjectCorrupt(f"{object_key(sha256)} exists with other bytes; it is not overwritten")
        return ok is True

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


def _syncfs_load() -> Callable[[int], int] | None:
    """libc's syncfs(2) (Linux): one call flushes a filesystem's dirty data and metadata and,
    since Linux 5.8, reports a write-back error. Python's os module does not offer it."""
    try:
        function = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_syncfs = _syncfs_load()


def _syncfs_path(path: Path) -> None:
    """syncfs of the filesystem holding ``path``; OSError if the kernel reports a failure."""
    assert _syncfs is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        if _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
    finally:
        os.close(fd)


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
