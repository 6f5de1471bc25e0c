"""The storage contract on the S3 backend, against a real S3-protocol server (moto, loopback)."""

from __future__ import annotations

import base64
import hashlib
import uuid

import httpx
import pytest
from botocore.exceptions import ClientError

from apps.core.errors import NotFound
from apps.objects.contract import ChecksumMismatch, ObjectCorrupt, UploadMissing
from apps.objects.models import StoredObject
from apps.objects.s3 import S3Store
from apps.objects.services import (
    object_commit,
    object_open,
    object_put,
    object_read,
    object_read_grant,
    object_upload_grant,
    objects_read_many,
)
from apps.objects.store import store_get
from tests.objects.conftest import sha

pytestmark = pytest.mark.django_db


def b64(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def head(s3_store, key: str) -> dict | None:
    try:
        return s3_store.server.client().head_object(Bucket=s3_store.server.bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as exc:
        if exc.response["ResponseMetadata"]["HTTPStatusCode"] == 404:
            return None
        raise


def test_what_moto_enforces(s3_store):
    """Pins the server's behaviour the store relies on (or works around); see tests/s3server.py."""
    client, bucket, key = s3_store.server.client(), s3_store.server.bucket, f"{s3_store.prefix}/probe"
    client.put_object(Bucket=bucket, Key=key, Body=b"one", IfNoneMatch="*")
    # Enforced: create-only with If-None-Match.
    with pytest.raises(ClientError) as exc:
        client.put_object(Bucket=bucket, Key=key, Body=b"two", IfNoneMatch="*")
    assert exc.value.response["Error"]["Code"] == "PreconditionFailed"
    # NOT enforced: the SHA-256 claim is stored as sent, not checked against the body
    # (AWS S3 answers 400 BadDigest). Hence SYNTH_S3_VERIFY=download for moto.
    client.put_object(
        Bucket=bucket, Key=f"{key}-2", Body=b"not these bytes", ChecksumAlgorithm="SHA256", ChecksumSHA256=b64(b"x")
    )
    assert head(s3_store, f"{key}-2")["ChecksumSHA256"] == b64(b"x")
    # NOT enforced: presigned signatures. A PUT that leaves out the signed If-None-Match and
    # checksum headers is accepted (AWS S3 answers 403), so it can replace an object.
    url = client.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": key, "IfNoneMatch": "*", "ChecksumSHA256": b64(b"three")}
    )
    assert httpx.put(url, content=b"three").status_code == 200
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == b"three"


def test_put_is_content_addressed_create_only_and_idempotent(s3_store, alice):
    store = store_get()
    assert isinstance(store, S3Store) and store.verify_by == "download"
    obj = object_put(org=alice.org, data=b"hello", content_type="text/plain")
    stored = head(s3_store, s3_store.key(obj.sha256))
    assert stored["ContentLength"] == 5 and stored["ChecksumSHA256"] == b64(b"hello")
    assert object_read(obj=obj) == b"hello"
    with object_open(obj=obj) as stream:
        assert stream.read() == b"hello"

    # Same bytes again: S3 answers 412, the existing object verifies, so "present".
    assert store.put(sha256=obj.sha256, size=5, body=b"hello", content_type="text/plain") == "present"
    assert object_put(org=alice.org, data=b"hello").id == obj.id

    # Other bytes under the key: refused; the object is untouched.
    with pytest.raises(ChecksumMismatch):
        store.put(sha256=obj.sha256, size=5, body=b"HELLO", content_type="text/plain")
    assert object_read(obj=obj) == b"hello"

    # A mismatched put of a new key writes nothing.
    with pytest.raises(ChecksumMismatch):
        store.put(sha256=sha(b"declared"), size=None, body=b"actual", content_type="text/plain")
    assert head(s3_store, s3_store.key(sha(b"declared"))) is None


def test_existing_bytes_that_do_not_match_are_never_overwritten(s3_store, alice):
    digest = sha(b"good")
    s3_store.server.client().put_object(Bucket=s3_store.server.bucket, Key=s3_store.key(digest), Body=b"evil")
    with pytest.raises(ObjectCorrupt):
        object_put(org=alice.org, data=b"good")
    body = s3_store.server.client().get_object(Bucket=s3_store.server.bucket, Key=s3_store.key(digest))["Body"]
    assert body.read() == b"evil"
    assert not StoredObject.objects.exists()


def test_grant_upload_to_the_presigned_url_then_commit(s3_store, alice, bob):
    data = b"payload " * 1000
    r = alice.client.post(
        "/api/objects/uploads", {"sha256": sha(data), "size": len(data), "content_type": "text/plain"}, format="json"
    )
    assert r.status_code == 201
    grant = r.json()
    assert grant["url"].startswith(s3_store.server.endpoint_url)
    assert grant["headers"]["If-None-Match"] == "*"
    assert grant["headers"]["x-amz-checksum-sha256"] == b64(data)
    signed = grant["url"].split("X-Amz-SignedHeaders=")[1].split("&")[0]
    for header in ("if-none-match", "x-amz-checksum-sha256", "content-length", "x-amz-meta-synth-grant"):
        assert header in signed

    r = alice.client.post(f"/api/objects/uploads/{grant['grant_id']}/commit")
    assert r.status_code == 409 and not StoredObject.objects.exists()

    put = httpx.put(grant["url"], content=data, headers=grant["headers"])
    assert put.status_code == 200, put.text
    # Create-only at the provider: the same URL cannot write the key again.
    again = httpx.put(grant["url"], content=data, headers=grant["headers"])
    assert again.status_code == 412

    r = alice.client.post(f"/api/objects/uploads/{grant['grant_id']}/commit")
    assert r.status_code == 201, r.json()
    assert r.json()["key"] == f"sha256/{sha(data)}" and r.json()["size"] == len(data)

    detail = alice.client.get(f"/api/objects/{sha(data)}").json()
    got = httpx.get(detail["read"]["url"])
    assert got.status_code == 200 and got.content == data
    assert got.headers["content-type"] == "text/plain"

    assert bob.client.get(f"/api/objects/{sha(data)}").status_code == 404
    with pytest.raises(NotFound):
        object_read_grant(org=bob.org, sha256=sha(data))


def test_grant_upload_with_the_wrong_bytes_commits_nothing(s3_store, alice):
    data = b"the declared bytes"
    issued = object_upload_grant(org=alice.org, sha256=sha(data), size=len(data))
    # Same size, right headers, wrong bytes. AWS S3 would refuse the PUT (BadDigest); moto
    # stores it with the claimed checksum, so the commit's own hashing must catch it.
    put = httpx.put(issued.request.url, content=b"THE DECLARED BYTES", headers=issued.request.headers)
    assert put.status_code == 200
    with pytest.raises(ChecksumMismatch):
        object_commit(org=alice.org, grant=issued.grant)
    assert not StoredObject.objects.exists()
    # The bad bytes are gone, so the key can still be written correctly.
    assert head(s3_store, s3_store.key(sha(data))) is None
    retry = object_upload_grant(org=alice.org, sha256=sha(data), size=len(data))
    assert httpx.put(retry.request.url, content=data, headers=retry.request.headers).status_code == 200
    assert object_commit(org=alice.org, grant=retry.grant).sha256 == sha(data)


def test_knowing_a_digest_is_not_enough_to_claim_an_object(s3_store, alice, bob):
    data = b"secret of alice"
    object_put(org=alice.org, data=data)
    issued = object_upload_grant(org=bob.org, sha256=sha(data), size=len(data))
    # The key exists, so Bob's grant points at a staging key: a 412 would prove nothing.
    assert "/uploads/" in issued.request.url
    with pytest.raises(UploadMissing):
        object_commit(org=bob.org, grant=issued.grant)
    assert httpx.put(issued.request.url, content=data, headers=issued.request.headers).status_code == 200
    obj = object_commit(org=bob.org, grant=issued.grant)
    assert obj.org == bob.org and object_read(obj=obj) == data
    assert head(s3_store, f"{s3_store.prefix}/uploads/{issued.grant.id}") is None  # staging cleaned


def test_a_grant_overtaken_by_another_upload_asks_for_a_new_one(s3_store, alice, bob):
    data = b"raced"
    issued = object_upload_grant(org=alice.org, sha256=sha(data), size=len(data))
    object_put(org=bob.org, data=data)  # lands first
    put = httpx.put(issued.request.url, content=data, headers=issued.request.headers)
    assert put.status_code == 412  # create-only at the provider
    with pytest.raises(UploadMissing, match="new grant"):
        object_commit(org=alice.org, grant=issued.grant)
    again = object_upload_grant(org=alice.org, sha256=sha(data), size=len(data))
    assert httpx.put(again.request.url, content=data, headers=again.request.headers).status_code == 200
    assert object_commit(org=alice.org, grant=again.grant).org == alice.org


def test_staged_bytes_are_promoted_if_the_object_vanished(s3_store, alice, bob):
    data = b"promote me"
    object_put(org=alice.org, data=data)
    issued = object_upload_grant(org=bob.org, sha256=sha(data), size=len(data))
    s3_store.server.client().delete_object(Bucket=s3_store.server.bucket, Key=s3_store.key(sha(data)))
    assert httpx.put(issued.request.url, content=data, headers=issued.request.headers).status_code == 200
    obj = object_commit(org=bob.org, grant=issued.grant)
    assert object_read(obj=obj) == data


def test_provider_checksum_mode(s3_store, alice, settings):
    """SYNTH_S3_VERIFY=checksum trusts HeadObject's ChecksumSHA256 and hashes only without one."""
    settings.SYNTH_S3_VERIFY = "checksum"
    store = store_get()
    assert store.verify_by == "checksum"
    obj = object_put(org=alice.org, data=b"trusted")
    assert store.stat(sha256=obj.sha256).sha256 == obj.sha256
    assert store.verify(sha256=obj.sha256, size=obj.size) is True

    issued = object_upload_grant(org=alice.org, sha256=sha(b"granted"), size=7)
    assert httpx.put(issued.request.url, content=b"granted", headers=issued.request.headers).status_code == 200
    assert object_commit(org=alice.org, grant=issued.grant).size == 7

    # Objects written without a checksum are hashed instead.
    client, bucket = s3_store.server.client(), s3_store.server.bucket
    client.put_object(Bucket=bucket, Key=s3_store.key(sha(b"plain")), Body=b"plain")
    assert store.stat(sha256=sha(b"plain")).sha256 is None
    assert store.put(sha256=sha(b"plain"), size=5, body=b"plain", content_type="text/plain") == "present"
    client.put_object(Bucket=bucket, Key=s3_store.key(sha(b"other")), Body=b"OTHER")
    with pytest.raises(ObjectCorrupt):
        store.put(sha256=sha(b"other"), size=5, body=b"other", content_type="text/plain")


def test_bucket_is_created_lazily_when_asked(s3_store, settings, alice):
    bucket = f"synth-lazy-{uuid.uuid4().hex[:8]}"
    settings.SYNTH_OBJECT_STORE = f"s3://{bucket}"
    settings.SYNTH_S3_CREATE_BUCKET = True
    obj = object_put(org=alice.org, data=b"in a new bucket")
    assert object_read(obj=obj) == b"in a new bucket"
    assert s3_store.server.client().head_object(Bucket=bucket, Key=obj.key)["ContentLength"] == 15


def test_an_empty_object_round_trips(s3_store, alice):
    issued = object_upload_grant(org=alice.org, sha256=sha(b""), size=0)
    assert httpx.put(issued.request.url, content=b"", headers=issued.request.headers).status_code == 200
    obj = object_commit(org=alice.org, grant=issued.grant)
    assert obj.size == 0 and object_read(obj=obj) == b""


def test_a_batch_is_put_create_only_and_verified(s3_store, alice):
    store = store_get()
    blobs = [f"archive {i}".encode() for i in range(5)]
    assert store.put_many(items=[(sha(b), b) for b in blobs], content_type="application/x-tar") == {
        sha(b): "created" for b in blobs
    }
    assert store.put_many(items=[(sha(b), b) for b in blobs[:2]], content_type="application/x-tar") == {
        sha(b): "present" for b in blobs[:2]
    }
    with pytest.raises(ChecksumMismatch):
        store.put_many(items=[(sha(b"declared"), b"actually")], content_type="x")
    assert all(head(s3_store, s3_store.key(sha(b))) is not None for b in blobs)
    assert head(s3_store, s3_store.key(sha(b"declared"))) is None


def test_a_batch_is_read_by_the_org_and_verified(s3_store, alice, bob):
    """objects_read_many: each object's bytes by sha256 (repeats read once), only through
    the org's own references, and never bytes that do not match their digest."""
    blobs = [f"payload {i}".encode() * (i + 1) for i in range(6)]
    for blob in blobs:
        object_put(org=alice.org, data=blob)
    wanted = [sha(b) for b in blobs] + [sha(blobs[0])]
    assert objects_read_many(org=alice.org, sha256s=wanted) == {sha(b): b for b in blobs}
    assert objects_read_many(org=alice.org, sha256s=[]) == {}
    # Another org that knows the digests has no reference: not found, nothing read.
    with pytest.raises(NotFound) as missing:
        objects_read_many(org=bob.org, sha256s=[sha(blobs[1])])
    assert sha(blobs[1]) in str(missing.value)
    # Bytes changed under a key behind the store's back are refused, whichever read fails.
    s3_store.server.client().put_object(Bucket=s3_store.server.bucket, Key=s3_store.key(sha(blobs[3])), Body=b"evil")
    with pytest.raises(ObjectCorrupt):
        objects_read_many(org=alice.org, sha256s=[sha(b) for b in blobs])
    assert objects_read_many(org=alice.org, sha256s=[sha(blobs[2])]) == {sha(blobs[2]): blobs[2]}
