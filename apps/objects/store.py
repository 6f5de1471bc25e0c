"""The object store: one create-only, content-addressed contract over two backends.

Contract (ARCHITECTURE.md, "Storage contract"):

* Keys are ``sha256/<hex>``: the name of an object is the SHA-256 of its bytes.
* Writes are create-only. The filesystem links a fully written, verified temporary file
  into place with ``os.link`` (which fails if the name exists); S3 is written with
  ``PutObject(IfNoneMatch="*")`` so the provider refuses to replace an object.
* Checksums are verified before an object becomes visible. The filesystem hashes while
  writing and links nothing on a mismatch; S3 receives ``ChecksumSHA256`` so the provider
  rejects bytes that do not match (and we hash locally first whenever we hold the bytes).
* Putting bytes that are already stored is a success reported as ``"present"`` (content
  addressing makes it the same object), but only after the existing object was verified
  (size and SHA-256). An existing object that does not match its key is never overwritten:
  that is ``ObjectCorrupt``. Bytes that do not hash to the key given are ``ChecksumMismatch``.
* Grants: an upload grant is a presigned PUT (S3) or a URL to our own signed endpoint
  (filesystem); a read grant is a presigned GET or a signed URL to our content endpoint.

Backend by ``settings.SYNTH_OBJECT_STORE``: ``file:///abs/path`` or ``s3://bucket[/prefix]``
(plus ``SYNTH_S3_ENDPOINT_URL``, ``SYNTH_S3_REGION`` and the usual AWS credential variables).
Two switches are read from the environment here (not settings):

* ``SYNTH_S3_CREATE_BUCKET`` (default false): create the bucket on first use.
* ``SYNTH_S3_VERIFY`` = ``checksum`` (default) | ``download``. ``checksum`` trusts the
  ``ChecksumSHA256`` that the provider returns from ``HeadObject(ChecksumMode=ENABLED)``,
  which AWS S3 validated against the bytes on write. ``download`` re-hashes the bytes on
  every verification, for S3-compatible servers that store a client's checksum claim
  without validating it (moto does exactly that, see tests/s3server.py).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any, Literal
from urllib.parse import urlencode, urlsplit

from botocore.exceptions import ClientError, FlexibleChecksumError
from django.conf import settings
from django.core import signing
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse
from django.utils import timezone

from apps.core.errors import Conflict, Forbidden, NotFound, ValidationFailed

logger = logging.getLogger(__name__)

CHUNK_SIZE = 1024 * 1024
# What a single S3 PUT accepts; bigger objects would need multipart uploads (not offered).
MAX_OBJECT_SIZE = 5 * 1024**3
# S3 user metadata naming the upload grant that created an object (see S3Store.upload_verify).
GRANT_METADATA = "synth-grant"

PutResult = Literal["created", "present"]


class ChecksumMismatch(ValidationFailed):
    """The bytes do not have the declared SHA-256 or size; nothing was stored."""

    error_type = "checksum_mismatch"


class ObjectCorrupt(Conflict):
    """Bytes already stored under a key do not hash to it. Create-only: never overwritten."""

    error_type = "object_corrupt"


class UploadMissing(Conflict):
    """A commit found no bytes uploaded under its grant."""

    error_type = "upload_missing"


def object_key(sha256: str) -> str:
    return f"sha256/{sha256}"


def sha256_b64(sha256: str) -> str:
    """The form S3 uses for ``ChecksumSHA256``: base64 of the raw digest, not hex."""
    return base64.b64encode(bytes.fromhex(sha256)).decode()


@dataclass(frozen=True)
class ObjectStat:
    size: int
    sha256: str | None  # hex digest the provider vouches for, when it returns one
    grant_id: str | None = None  # upload grant that created the object (S3 metadata)


@dataclass(frozen=True)
class PresignedRequest:
    """An HTTP request a client may make without our credentials, until expires_at."""

    url: str
    method: str
    headers: dict[str, str]
    expires_at: datetime


def _copy_hashing(body: bytes | IO[bytes], out: IO[bytes] | None, *, limit: int | None) -> tuple[str, int]:
    """Copy body to out (if any) while hashing; stop early once more than limit bytes came.

    Reading at most limit+1 bytes bounds what a client can make us write for a grant of
    a given size: one byte too many already proves the mismatch.
    """
    digest = hashlib.sha256()
    count = 0
    if isinstance(body, (bytes, bytearray, memoryview)):
        data = bytes(body) if limit is None else bytes(body[: limit + 1])
        digest.update(data)
        if out is not None:
            out.write(data)
        return digest.hexdigest(), len(data)
    while True:
        want = CHUNK_SIZE if limit is None else min(CHUNK_SIZE, limit + 1 - count)
        if want <= 0:
            break
        chunk = body.read(want)
        if not chunk:
            break
        digest.update(chunk)
        count += len(chunk)
        if out is not None:
            out.write(chunk)
    return digest.hexdigest(), count


def _check(*, sha256: str, size: int | None, got_sha256: str, got_size: int) -> None:
    if size is not None and got_size != size:
        raise ChecksumMismatch(f"expected {size} bytes, received {got_size if got_size <= size else 'more'}")
    if got_sha256 != sha256:
        raise ChecksumMismatch(f"SHA-256 of the bytes is {got_sha256}, not {sha256}", field="sha256")


class ObjectStore(ABC):
    """The storage contract. Keys are always derived from the SHA-256 (``object_key``)."""

    scheme: str

    @abstractmethod
    def put(self, *, sha256: str, size: int | None, body: bytes | IO[bytes], content_type: str) -> PutResult:
        """Store bytes create-only under sha256/<hex>, verified; ChecksumMismatch/ObjectCorrupt."""

    @abstractmethod
    def open(self, *, sha256: str) -> IO[bytes]:
        """A binary stream of the object (not re-verified; object_read verifies)."""

    @abstractmethod
    def stat(self, *, sha256: str) -> ObjectStat | None:
        """Size (and digest if the provider vouches for one), or None if absent."""

    @abstractmethod
    def verify(self, *, sha256: str, size: int) -> bool | None:
        """Whether the stored object has this size and SHA-256; None if it is absent."""

    @abstractmethod
    def delete(self, *, sha256: str) -> None:
        """Remove an object. Only for bytes that failed verification (see callers)."""

    @abstractmethod
    def upload_request(
        self, *, grant_id: str, org_id: str, sha256: str, size: int, content_type: str, expires_at: datetime
    ) -> PresignedRequest:
        """How a producer uploads the bytes of one grant."""

    @abstractmethod
    def upload_verify(self, *, grant_id: str, sha256: str, size: int, received: bool) -> None:
        """Check that the grant's bytes are in the store under their key, verified.

        Raises UploadMissing when nothing was uploaded under this grant (the grant is also
        the proof that the org holds the bytes, so an object stored by someone else does not
        count), ChecksumMismatch (after removing the bad bytes) when they do not verify.
        """

    @abstractmethod
    def download_request(
        self, *, org_id: str, sha256: str, content_type: str, expires_at: datetime
    ) -> PresignedRequest:
        """A read grant for one object."""


# ---------------------------------------------------------------------------------------
# Filesystem
# ---------------------------------------------------------------------------------------

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
                got_sha256, got_size = _copy_hashing(body, out, limit=size)
                _check(sha256=sha256, size=size, got_sha256=got_sha256, got_size=got_size)
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
                got_sha256, got_size = _copy_hashing(f, None, limit=None)
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


# ---------------------------------------------------------------------------------------
# S3
# ---------------------------------------------------------------------------------------


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


_DIGEST_ERRORS = {"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "InvalidChecksum"}


class S3Store(ObjectStore):
    scheme = "s3"

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str,
        endpoint_url: str | None,
        region: str,
        verify_by: str,
        create_bucket: bool,
    ) -> None:
        import boto3
        from botocore.config import Config

        if verify_by not in ("checksum", "download"):
            raise ImproperlyConfigured(f"SYNTH_S3_VERIFY must be 'checksum' or 'download', got {verify_by!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.verify_by = verify_by
        config = Config(
            # SigV4 so that presigned URLs sign If-None-Match, the checksum, the length and
            # the grant metadata: the client must send exactly those headers or S3 refuses.
            signature_version="s3v4",
            # Custom endpoints (MinIO, moto, ...) rarely resolve bucket subdomains.
            s3={"addressing_style": "path" if endpoint_url else "auto"},
            retries={"max_attempts": 3, "mode": "standard"},
        )
        # A session per store: boto3's default session is not thread-safe, clients are.
        self.client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
        if create_bucket:
            self._bucket_ensure(region)

    def _bucket_ensure(self, region: str) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            if _http_status(exc) != 404:
                raise
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self.client.create_bucket(**kwargs)
        except ClientError as exc:
            if _error_code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def key(self, sha256: str) -> str:
        return f"{self.prefix}/{object_key(sha256)}" if self.prefix else object_key(sha256)

    def staging_key(self, grant_id: str) -> str:
        # Uploads of bytes already stored go here (see upload_request). A bucket lifecycle
        # rule on this prefix should expire what abandoned grants leave behind.
        key = f"uploads/{grant_id}"
        return f"{self.prefix}/{key}" if self.prefix else key

    # -- low level, by key ------------------------------------------------------------------

    def _head(self, key: str) -> ObjectStat | None:
        try:
            r = self.client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as exc:
            if _http_status(exc) == 404:
                return None
            raise
        sha256 = None
        checksum = r.get("ChecksumSHA256")
        # Only a full-object checksum is the SHA-256 of the bytes; multipart composites
        # ("<b64>-<parts>") are checksums of checksums.
        if checksum and "-" not in checksum and r.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
            sha256 = base64.b64decode(checksum).hex()
        return ObjectStat(
            size=int(r["ContentLength"]), sha256=sha256, grant_id=(r.get("Metadata") or {}).get(GRANT_METADATA)
        )

    def _hash(self, key: str) -> tuple[str, int]:
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        try:
            return _copy_hashing(body, None, limit=None)
        finally:
            body.close()

    def _verify_key(self, key: str, *, sha256: str, size: int, stat: ObjectStat | None = None) -> bool | None:
        stat = stat or self._head(key)
        if stat is None:
            return None
        if stat.size != size:
            return False
        if self.verify_by == "checksum" and stat.sha256 is not None:
            return stat.sha256 == sha256
        # No checksum returned (object written without one), or the server is not trusted
        # to have validated it: hash the bytes ourselves.
        try:
            got_sha256, got_size = self._hash(key)
        except FlexibleChecksumError:
            # botocore checks GET bodies against a stored checksum when there is one: the
            # bytes differ from the checksum they were stored with, so they are not ours.
            return False
        return got_sha256 == sha256 and got_size == size

    def _delete_key(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    # -- contract -----------------------------------------------------------------------------

    def put(self, *, sha256: str, size: int | None, body: bytes | IO[bytes], content_type: str) -> PutResult:
        # We hold the bytes, so hash them before sending anything: a mismatch never reaches
        # the bucket. ChecksumSHA256 then makes S3 itself verify what arrived (transport).
        # Streams are spooled while hashing, as the PUT needs a length and a rewindable body.
        with tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024) as spool:
            if isinstance(body, (bytes, bytearray, memoryview)):
                got_sha256, got_size = _copy_hashing(body, None, limit=size)
                payload: bytes | IO[bytes] = bytes(body)
            else:
                got_sha256, got_size = _copy_hashing(body, spool, limit=size)
                payload = spool
            _check(sha256=sha256, size=size, got_sha256=got_sha256, got_size=got_size)
            key = self.key(sha256)
            for attempt in range(4):
                if payload is spool:
                    spool.seek(0)
                try:
                    self.client.put_object(
                        Bucket=self.bucket,
                        Key=key,
                        Body=payload,
                        ContentLength=got_size,
                        ContentType=content_type,
                        IfNoneMatch="*",
                        ChecksumAlgorithm="SHA256",
                        ChecksumSHA256=sha256_b64(sha256),
                    )
                    return "created"
                except ClientError as exc:
                    code = _error_code(exc)
                    if code in _DIGEST_ERRORS:
                        raise ChecksumMismatch(f"the object store rejected the SHA-256 of {key}") from exc
                    if code == "PreconditionFailed":  # 412: the key exists
                        break
                    if code == "ConditionalRequestConflict" and attempt < 3:
                        # 409: a concurrent conditional write of the same key is in flight;
                        # once it settles we get 412 (or succeed if it failed).
                        time.sleep(0.05 * 2**attempt)
                        continue
                    raise
        # The key exists: already present only if what is there verifies.
        if self._verify_key(key, sha256=sha256, size=got_size):
            return "present"
        raise ObjectCorrupt(f"{key} exists with other bytes; it is not overwritten")

    def open(self, *, sha256: str) -> IO[bytes]:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.key(sha256))["Body"]
        except ClientError as exc:
            if _http_status(exc) == 404:
                raise NotFound(f"{object_key(sha256)} is not in the object store") from None
            raise

    def stat(self, *, sha256: str) -> ObjectStat | None:
        return self._head(self.key(sha256))

    def verify(self, *, sha256: str, size: int) -> bool | None:
        return self._verify_key(self.key(sha256), sha256=sha256, size=size)

    def delete(self, *, sha256: str) -> None:
        self._delete_key(self.key(sha256))

    def upload_request(
        self, *, grant_id: str, org_id: str, sha256: str, size: int, content_type: str, expires_at: datetime
    ) -> PresignedRequest:
        # Bytes not yet stored go straight to their key, create-only. If the key already
        # exists, a PUT there could only answer 412, which proves nothing about the caller
        # holding the bytes; such uploads go to a staging key instead and the commit checks
        # them (otherwise knowing a digest would be enough to obtain a read grant for it).
        key = self.key(sha256)
        if self._head(key) is not None:
            key = self.staging_key(grant_id)
        headers = {
            "Content-Type": content_type,
            "If-None-Match": "*",
            "x-amz-checksum-sha256": sha256_b64(sha256),
            "x-amz-sdk-checksum-algorithm": "SHA256",
            f"x-amz-meta-{GRANT_METADATA}": grant_id,
        }
        expires_in = max(1, int((expires_at - timezone.now()).total_seconds()))
        url = self.client.generate_presigned_url(
            "put_object",
            Params={
                "Bucket": self.bucket,
                "Key": key,
                "ContentType": content_type,
                "ContentLength": size,
                "IfNoneMatch": "*",
                "ChecksumAlgorithm": "SHA256",
                "ChecksumSHA256": sha256_b64(sha256),
                "Metadata": {GRANT_METADATA: grant_id},
            },
            ExpiresIn=expires_in,
            HttpMethod="PUT",
        )
        return PresignedRequest(url=url, method="PUT", headers=headers, expires_at=expires_at)

    def upload_verify(self, *, grant_id: str, sha256: str, size: int, received: bool) -> None:
        key = self.key(sha256)
        canonical = self._head(key)
        if canonical is not None and canonical.grant_id == grant_id:
            target, stat = key, canonical
        else:
            staging = self.staging_key(grant_id)
            staged = self._head(staging)
            if staged is None:
                if canonical is not None:
                    raise UploadMissing(
                        "the object was stored by another upload after this grant was issued; "
                        "request a new grant and upload again"
                    )
                raise UploadMissing("nothing was uploaded under this grant")
            target, stat = staging, staged
        if not self._verify_key(target, sha256=sha256, size=size, stat=stat):
            logger.warning("removing %s: uploaded bytes do not match %s", target, key)
            self._delete_key(target)
            raise ChecksumMismatch(f"the uploaded bytes do not match the grant's size and SHA-256 ({key})")
        if target == key:
            return
        # Verified staged bytes: the canonical object normally exists (that is why they were
        # staged) and only has to verify; if it vanished meanwhile, promote the staged copy.
        try:
            if canonical is None or not self._verify_key(key, sha256=sha256, size=size):
                self._promote(staging=target, key=key, sha256=sha256, size=size)
        finally:
            self._delete_key(target)

    def _promote(self, *, staging: str, key: str, sha256: str, size: int) -> None:
        try:
            self.client.copy_object(
                Bucket=self.bucket,
                Key=key,
                CopySource={"Bucket": self.bucket, "Key": staging},
                IfNoneMatch="*",
                ChecksumAlgorithm="SHA256",
            )
        except ClientError as exc:
            if _error_code(exc) != "PreconditionFailed":
                raise
        if not self._verify_key(key, sha256=sha256, size=size):
            raise ObjectCorrupt(f"{key} exists with other bytes; it is not overwritten")

    def download_request(
        self, *, org_id: str, sha256: str, content_type: str, expires_at: datetime
    ) -> PresignedRequest:
        expires_in = max(1, int((expires_at - timezone.now()).total_seconds()))
        url = self.client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self.key(sha256), "ResponseContentType": content_type},
            ExpiresIn=expires_in,
            HttpMethod="GET",
        )
        return PresignedRequest(url=url, method="GET", headers={}, expires_at=expires_at)


# ---------------------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------------------

_stores: dict[tuple[str | None, ...], ObjectStore] = {}
_stores_lock = threading.Lock()


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def store_get() -> ObjectStore:
    """The configured store. Cached per configuration, so a settings change (tests) switches it."""
    url = settings.SYNTH_OBJECT_STORE
    config = (
        url,
        settings.SYNTH_S3_ENDPOINT_URL,
        settings.SYNTH_S3_REGION,
        os.environ.get("SYNTH_S3_VERIFY", "checksum"),
        os.environ.get("SYNTH_S3_CREATE_BUCKET", ""),
        os.environ.get("AWS_ACCESS_KEY_ID"),
    )
    store = _stores.get(config)
    if store is not None:
        return store
    with _stores_lock:
        store = _stores.get(config)
        if store is None:
            store = _stores[config] = _store_build(url)
    return store


def _store_build(url: str) -> ObjectStore:
    parts = urlsplit(url)
    if parts.scheme == "file":
        return FileSystemStore(Path(parts.path))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ImproperlyConfigured(f"SYNTH_OBJECT_STORE needs a bucket: s3://bucket[/prefix], got {url!r}")
        return S3Store(
            bucket=parts.netloc,
            prefix=parts.path,
            endpoint_url=settings.SYNTH_S3_ENDPOINT_URL,
            region=settings.SYNTH_S3_REGION,
            verify_by=os.environ.get("SYNTH_S3_VERIFY", "checksum"),
            create_bucket=_env_bool("SYNTH_S3_CREATE_BUCKET"),
        )
    raise ImproperlyConfigured(f"SYNTH_OBJECT_STORE must be file:///abs/path or s3://bucket[/prefix], got {url!r}")


def grant_expiry() -> datetime:
    return timezone.now() + timedelta(seconds=settings.SYNTH_GRANT_TTL_SECONDS)
