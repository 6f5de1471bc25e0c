"""The object store contract: one create-only, content-addressed interface over two backends.

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

The backends are ``apps.objects.filesystem`` and ``apps.objects.s3``; ``apps.objects.store``
picks the configured one.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Literal

from apps.core.errors import Conflict, ValidationFailed

CHUNK_SIZE = 1024 * 1024
# What a single S3 PUT accepts; bigger objects would need multipart uploads (not offered).
MAX_OBJECT_SIZE = 5 * 1024**3
# S3 user metadata naming the upload grant that created an object (see S3Store.upload_verify).
GRANT_METADATA = "synth-grant"
# Threads writing or reading a batch of objects (ObjectStore.put_many, read_many): a write
# or a read waits on the network or on the disk, not on the interpreter.
PUT_THREADS = 8

PutResult = Literal["created", "present"]

# The process' writers (and readers), made on first use and kept: a trial publishes a few
# objects, and starting threads for each batch cost more than the writes. A forked child (a
# Celery pool process) inherits the object but not its threads, so it makes its own.
_writers: ThreadPoolExecutor | None = None
_writers_lock = threading.Lock()


def _writers_pool() -> ThreadPoolExecutor:
    global _writers
    with _writers_lock:
        if _writers is None:
            _writers = ThreadPoolExecutor(max_workers=PUT_THREADS, thread_name_prefix="object-put")
        return _writers


def _writers_forget() -> None:
    global _writers, _writers_lock
    _writers, _writers_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_writers_forget)


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


def copy_hashing(body: bytes | IO[bytes], out: IO[bytes] | None, *, limit: int | None) -> tuple[str, int]:
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


def digest_check(*, sha256: str, size: int | None, got_sha256: str, got_size: int) -> None:
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

    def put_many(self, *, items: Sequence[tuple[str, bytes]], content_type: str) -> dict[str, PutResult]:
        """``put`` of each (sha256, bytes) pair, by sha256: a batch the caller holds in
        memory (a dataset's task archives, a trial's evidence). Written from a few threads;
        the first failure is raised once every write has ended."""

        def one(item: tuple[str, bytes]) -> PutResult:
            return self.put(sha256=item[0], size=len(item[1]), body=item[1], content_type=content_type)

        if len(items) <= 1:
            results = [one(item) for item in items]
        else:
            futures = [_writers_pool().submit(one, item) for item in items]
            wait(futures)
            results = [future.result() for future in futures]
        return {sha256: result for (sha256, _), result in zip(items, results, strict=True)}

    def read_verified(self, *, sha256: str, size: int) -> bytes:
        """All bytes of an object, checked against its size and digest (cheap once they are
        in memory); ObjectCorrupt if they do not match."""
        with self.open(sha256=sha256) as stream:
            data = stream.read()
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            raise ObjectCorrupt(f"{object_key(sha256)} does not match its digest in the object store")
        return data

    def read_many(self, *, sizes: Mapping[str, int]) -> dict[str, bytes]:
        """``read_verified`` of each object (by sha256, with the size its reference records),
        from a few threads (a learner reads every model call of a group: hundreds of small
        objects, each a round trip to the store). The first failure is raised once every
        read has ended."""
        if len(sizes) <= 1:
            return {sha256: self.read_verified(sha256=sha256, size=size) for sha256, size in sizes.items()}
        futures = {
            sha256: _writers_pool().submit(functools.partial(self.read_verified, sha256=sha256, size=size))
            for sha256, size in sizes.items()
        }
        wait(futures.values())
        return {sha256: future.result() for sha256, future in futures.items()}

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
