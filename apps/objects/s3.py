"""The S3 backend of the object store: create-only conditional writes, provider checksums.

``verify_by`` (``settings.SYNTH_S3_VERIFY``) is ``checksum`` or ``download``. ``checksum``
trusts the ``ChecksumSHA256`` that the provider returns from
``HeadObject(ChecksumMode=ENABLED)``, which AWS S3 validated against the bytes on write.
``download`` re-hashes the bytes on every verification, for S3-compatible servers that store
a client's checksum claim without validating it (moto does exactly that, see tests/s3server.py).
"""

from __future__ import annotations

import base64
import logging
import tempfile
import time
from datetime import datetime
from typing import IO, Any

from botocore.exceptions import ClientError, FlexibleChecksumError
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from apps.core.errors import NotFound
from apps.objects.contract import (
    GRANT_METADATA,
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
    sha256_b64,
)

logger = logging.getLogger(__name__)


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
            return copy_hashing(body, None, limit=None)
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
                got_sha256, got_size = copy_hashing(body, None, limit=size)
                payload: bytes | IO[bytes] = bytes(body)
            else:
                got_sha256, got_size = copy_hashing(body, spool, limit=size)
                payload = spool
            digest_check(sha256=sha256, size=size, got_sha256=got_sha256, got_size=got_size)
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
