"""The storage contract on the filesystem backend, through services and the REST API."""

from __future__ import annotations

import os

import httpx
import pytest

from apps.core.errors import Forbidden, NotFound
from apps.objects.contract import ChecksumMismatch, ObjectCorrupt, UploadMissing, object_key
from apps.objects.models import StoredObject, UploadGrant
from apps.objects.services import (
    object_commit,
    object_open,
    object_put,
    object_read,
    object_read_grant,
    object_upload_grant,
    objects_read_many,
)
from tests.objects.conftest import local, sha

pytestmark = pytest.mark.django_db


def leftovers(store) -> list[str]:
    tmp = store.root / "tmp"
    return os.listdir(tmp) if tmp.exists() else []


def test_put_is_content_addressed_create_only_and_idempotent(fs_store, alice):
    obj = object_put(org=alice.org, data=b"hello", content_type="text/plain")
    assert obj.key == f"sha256/{sha(b'hello')}"
    assert (fs_store.root / obj.key).read_bytes() == b"hello"
    assert object_read(obj=obj) == b"hello"
    with object_open(obj=obj) as stream:
        assert stream.read() == b"hello"

    # Same bytes again: already present, same reference, nothing rewritten.
    inode = (fs_store.root / obj.key).stat().st_ino
    assert fs_store.put(sha256=obj.sha256, size=5, body=b"hello", content_type="text/plain") == "present"
    assert object_put(org=alice.org, data=b"hello").id == obj.id
    assert (fs_store.root / obj.key).stat().st_ino == inode

    # Other bytes under that key: refused before anything is linked; the object is intact.
    with pytest.raises(ChecksumMismatch):
        fs_store.put(sha256=obj.sha256, size=5, body=b"HELLO", content_type="text/plain")
    with pytest.raises(ChecksumMismatch):
        fs_store.put(sha256=obj.sha256, size=None, body=b"hello!", content_type="text/plain")
    assert (fs_store.root / obj.key).read_bytes() == b"hello"
    assert leftovers(fs_store) == []


def test_a_mismatched_put_of_a_new_key_leaves_no_file(fs_store):
    digest = sha(b"declared")
    with pytest.raises(ChecksumMismatch):
        fs_store.put(sha256=digest, size=8, body=b"actually", content_type="text/plain")
    assert not (fs_store.root / object_key(digest)).exists()
    assert leftovers(fs_store) == []


def test_existing_bytes_that_do_not_match_are_never_overwritten(fs_store, alice):
    digest = sha(b"good")
    path = fs_store.root / object_key(digest)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"evil")  # written behind the store's back
    with pytest.raises(ObjectCorrupt):
        object_put(org=alice.org, data=b"good")
    assert path.read_bytes() == b"evil"
    assert not StoredObject.objects.filter(sha256=digest).exists()


def test_grant_upload_then_commit_after_verify(fs_store, alice):
    data = b"x" * 3000
    r = alice.client.post(
        "/api/objects/uploads", {"sha256": sha(data), "size": len(data), "content_type": "text/plain"}, format="json"
    )
    assert r.status_code == 201, r.json()
    grant = r.json()
    assert grant["method"] == "PUT" and grant["url"].startswith("http://") and "sig=" in grant["url"]
    assert set(grant) >= {"grant_id", "url", "method", "headers", "expires_at"}

    # Committing before the upload verifies nothing, so commits nothing.
    r = alice.client.post(f"/api/objects/uploads/{grant['grant_id']}/commit")
    assert r.status_code == 409 and r.json()["error"]["type"] == "upload_missing"
    assert not StoredObject.objects.exists()

    anonymous = alice.client.__class__()  # the signature is the only authority
    r = anonymous.put(local(grant["url"]), data=data, content_type="text/plain")
    assert r.status_code == 201, r.content
    assert r.json() == {"status": "created"}

    r = alice.client.post(f"/api/objects/uploads/{grant['grant_id']}/commit")
    assert r.status_code == 201, r.json()
    assert r.json()["sha256"] == sha(data) and r.json()["size"] == 3000
    assert r.json()["key"] == f"sha256/{sha(data)}"
    # A retried commit is the same object.
    r2 = alice.client.post(f"/api/objects/uploads/{grant['grant_id']}/commit")
    assert r2.status_code == 200 and r2.json()["id"] == r.json()["id"]

    r = alice.client.get(f"/api/objects/{sha(data)}")
    assert r.status_code == 200
    body = r.json()
    assert body["size"] == 3000 and body["content_type"] == "text/plain"
    content = anonymous.get(local(body["read"]["url"]))
    assert content.status_code == 200
    assert b"".join(content.streaming_content) == data
    assert content["Content-Type"] == "text/plain"


def test_grant_upload_with_the_wrong_bytes_commits_nothing(fs_store, alice):
    data = b"the declared bytes"
    issued = object_upload_grant(org=alice.org, sha256=sha(data), size=len(data), content_type="text/plain")
    url = local(issued.request.url)

    r = alice.client.put(url, data=b"THE DECLARED BYTES", content_type="text/plain")  # same size
    assert r.status_code == 400 and r.json()["error"]["type"] == "checksum_mismatch"
    r = alice.client.put(url, data=data + b"!", content_type="text/plain")  # too long
    assert r.status_code == 400
    assert not (fs_store.root / object_key(sha(data))).exists()
    assert leftovers(fs_store) == []

    with pytest.raises(UploadMissing):
        object_commit(org=alice.org, grant=issued.grant)
    assert not StoredObject.objects.exists()
    assert UploadGrant.objects.get(pk=issued.grant.pk).committed_at is None


def test_upload_endpoint_rejects_bad_and_expired_signatures(fs_store, alice, settings):
    data = b"signed"
    issued = object_upload_grant(org=alice.org, sha256=sha(data), size=len(data))
    other = object_upload_grant(org=alice.org, sha256=sha(b"other"), size=5)
    path, _, query = local(issued.request.url).partition("?")
    sig = query.removeprefix("sig=")

    cases = {
        "no signature": path,
        "tampered": f"{path}?sig={sig[:-2]}xx",
        "another grant's": f"{path}?{local(other.request.url).partition('?')[2]}",
    }
    for name, url in cases.items():
        r = alice.client.put(url, data=data, content_type="application/octet-stream")
        assert r.status_code == 403, name
        assert r.json()["error"]["type"] == "permission_denied"

    settings.SYNTH_GRANT_TTL_SECONDS = -1
    expired = object_upload_grant(org=alice.org, sha256=sha(data), size=len(data))
    r = alice.client.put(local(expired.request.url), data=data, content_type="application/octet-stream")
    assert r.status_code == 403 and "expired" in r.json()["error"]["message"]
    assert not (fs_store.root / object_key(sha(data))).exists()


def test_read_grants_are_per_org(fs_store, alice, bob, settings):
    obj = object_put(org=alice.org, data=b"alice's", content_type="text/plain")
    grant = object_read_grant(org=alice.org, sha256=obj.sha256)

    assert bob.client.get(f"/api/objects/{obj.sha256}").status_code == 404
    with pytest.raises(NotFound):
        object_read_grant(org=bob.org, sha256=obj.sha256)

    path, _, query = local(grant.request.url).partition("?")
    anonymous = bob.client.__class__()
    assert b"".join(anonymous.get(local(grant.request.url)).streaming_content) == b"alice's"
    assert anonymous.get(path).status_code == 403
    assert anonymous.get(f"{path}?{query[:-3]}abc").status_code == 403
    # A read grant names one object: it does not open another.
    other = object_put(org=alice.org, data=b"other")
    assert anonymous.get(f"/api/objects/{other.sha256}/content?{query}").status_code == 403

    settings.SYNTH_GRANT_TTL_SECONDS = -1
    expired = object_read_grant(org=alice.org, sha256=obj.sha256)
    assert anonymous.get(local(expired.request.url)).status_code == 403

    # Deleting the org's reference revokes its outstanding read grants.
    obj.delete()
    assert anonymous.get(local(grant.request.url)).status_code == 404


def test_knowing_a_digest_is_not_enough_to_claim_an_object(fs_store, alice, bob):
    data = b"secret of alice"
    object_put(org=alice.org, data=data)

    r = bob.client.post("/api/objects/uploads", {"sha256": sha(data), "size": len(data)}, format="json")
    grant_id, grant_url = r.json()["grant_id"], r.json()["url"]
    # Bob cannot commit without sending the bytes, although they are in the store...
    r = bob.client.post(f"/api/objects/uploads/{grant_id}/commit")
    assert r.status_code == 409
    assert not StoredObject.objects.filter(org=bob.org).exists()
    # ... nor touch Alice's grants.
    alice_grant = object_upload_grant(org=alice.org, sha256=sha(data), size=len(data))
    assert bob.client.post(f"/api/objects/uploads/{alice_grant.grant.id}/commit").status_code == 404
    with pytest.raises(NotFound):
        object_commit(org=bob.org, grant=alice_grant.grant)

    # Uploading the same bytes proves he holds them: already present, then committed.
    upload = bob.client.put(local(grant_url), data=data, content_type="application/octet-stream")
    assert upload.status_code == 200 and upload.json() == {"status": "present"}
    assert bob.client.post(f"/api/objects/uploads/{grant_id}/commit").status_code == 201
    assert StoredObject.objects.filter(sha256=sha(data)).count() == 2


def test_members_need_write_access_to_upload(fs_store, viewer):
    r = viewer.client.post("/api/objects/uploads", {"sha256": "a" * 64, "size": 1}, format="json")
    assert r.status_code == 403


def test_grant_input_is_validated(fs_store, alice):
    r = alice.client.post("/api/objects/uploads", {"sha256": "xyz", "size": 1}, format="json")
    assert r.status_code == 400 and r.json()["error"]["field"] == "sha256"
    r = alice.client.post("/api/objects/uploads", {"sha256": "a" * 64, "size": -1}, format="json")
    assert r.status_code == 400 and r.json()["error"]["field"] == "size"
    r = alice.client.post("/api/objects/uploads", {"sha256": "a" * 64, "size": 2 * 1024**4}, format="json")
    assert r.status_code == 400 and r.json()["error"]["field"] == "size"


def test_signed_helpers_refuse_garbage():
    from apps.objects.filesystem import token_load

    with pytest.raises(Forbidden):
        token_load(purpose="upload", token="not-a-token")


@pytest.mark.django_db(transaction=True)
def test_presigned_urls_work_over_real_http(fs_store, alice, live_server, settings):
    """The grant URLs are plain HTTP requests: httpx against a live server, no token."""
    settings.SYNTH_PUBLIC_URL = live_server.url
    data = os.urandom(200_000)
    r = alice.client.post("/api/objects/uploads", {"sha256": sha(data), "size": len(data)}, format="json")
    grant = r.json()
    bad = httpx.put(grant["url"], content=os.urandom(len(data)), headers=grant["headers"])
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "checksum_mismatch"
    ok = httpx.put(grant["url"], content=data, headers=grant["headers"])
    assert ok.status_code == 201, ok.text
    assert alice.client.post(f"/api/objects/uploads/{grant['grant_id']}/commit").status_code == 201
    read = alice.client.get(f"/api/objects/{sha(data)}").json()["read"]
    got = httpx.get(read["url"])
    assert got.status_code == 200 and got.content == data


def test_an_empty_object_round_trips(fs_store, alice):
    issued = object_upload_grant(org=alice.org, sha256=sha(b""), size=0)
    r = alice.client.__class__().put(local(issued.request.url), data=b"", content_type="application/octet-stream")
    assert r.status_code == 201, r.content
    obj = object_commit(org=alice.org, grant=issued.grant)
    assert obj.size == 0 and object_read(obj=obj) == b""


def test_a_large_batch_is_written_bytes_first_then_names_each_made_durable_at_once(fs_store, alice, monkeypatch):
    """put_many of SYNCFS_MIN_OBJECTS or more: every object verified and created, the
    batch's bytes flushed before any name is linked and the names flushed after, objects
    already stored verified rather than rewritten, and nothing left in the scratch folder."""
    from apps.objects import filesystem
    from apps.objects.services import objects_put_many

    blobs = [f"archive {i}".encode() * 10 for i in range(filesystem.SYNCFS_MIN_OBJECTS + 6)]
    stored_before = object_put(org=alice.org, data=blobs[0])
    inode = (fs_store.root / stored_before.key).stat().st_ino
    seen: list[tuple[list[bytes], list[bool]]] = []
    real_syncfs = filesystem._syncfs_path

    def watched(path):
        scratch = fs_store.root / "tmp"
        seen.append(
            (
                sorted(p.read_bytes() for p in scratch.iterdir()),
                [(fs_store.root / object_key(sha(b))).exists() for b in blobs[1:]],
            )
        )
        real_syncfs(path)

    monkeypatch.setattr(filesystem, "_syncfs_path", watched)
    results = fs_store.put_many(items=[(sha(b), b) for b in blobs], content_type="application/x-tar")
    assert results[sha(blobs[0])] == "present"
    assert {results[sha(b)] for b in blobs[1:]} == {"created"}
    assert len(seen) == 2
    assert seen[0] == (sorted(blobs[1:]), [False] * (len(blobs) - 1))  # all bytes written, none linked
    assert seen[1][1] == [True] * (len(blobs) - 1)  # every name linked before the second flush
    assert (fs_store.root / stored_before.key).stat().st_ino == inode
    for b in blobs:
        assert (fs_store.root / object_key(sha(b))).read_bytes() == b
    assert leftovers(fs_store) == []

    # Through the service: the org's references, and a second batch is all "present".
    refs = objects_put_many(org=alice.org, blobs=blobs)
    assert sorted(refs) == sorted(sha(b) for b in blobs) and refs[sha(blobs[0])].id == stored_before.id
    assert set(fs_store.put_many(items=[(sha(b), b) for b in blobs], content_type="x").values()) == {"present"}
    assert len(seen) == 2  # nothing new to flush


def test_a_large_batch_refuses_bad_bytes_and_corrupt_objects_and_links_nothing(fs_store):
    from apps.objects import filesystem

    blobs = [f"task {i}".encode() for i in range(filesystem.SYNCFS_MIN_OBJECTS)]
    items = [(sha(b), b) for b in blobs]
    with pytest.raises(ChecksumMismatch):
        fs_store.put_many(items=[*items, (sha(b"declared"), b"actually")], content_type="x")
    assert not any((fs_store.root / object_key(d)).exists() for d, _ in items)
    assert leftovers(fs_store) == []

    corrupt = fs_store.root / object_key(items[-1][0])
    corrupt.parent.mkdir(parents=True, exist_ok=True)
    corrupt.write_bytes(b"evil")  # written behind the store's back
    with pytest.raises(ObjectCorrupt):
        fs_store.put_many(items=items, content_type="x")
    assert corrupt.read_bytes() == b"evil"
    assert not any((fs_store.root / object_key(d)).exists() for d, _ in items[:-1])
    assert leftovers(fs_store) == []


def test_a_small_batch_is_put_object_by_object(fs_store, monkeypatch):
    from apps.objects import filesystem

    def refuse(path):
        raise AssertionError("a small batch does not flush the whole filesystem")

    monkeypatch.setattr(filesystem, "_syncfs_path", refuse)
    blobs = [b"one", b"two", b"three"]
    assert fs_store.put_many(items=[(sha(b), b) for b in blobs], content_type="x") == {sha(b): "created" for b in blobs}
    assert fs_store.put_many(items=[(sha(b"one"), b"one")], content_type="x") == {sha(b"one"): "present"}
    assert leftovers(fs_store) == []


def test_batches_share_the_process_writers_and_a_forked_child_makes_its_own(fs_store):
    """A small batch is written by the process' kept writer threads (none started per
    batch); a forked child (a Celery pool process) writes with threads of its own."""
    import threading

    from apps.objects.contract import PUT_THREADS

    def writers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("object-put")}

    first = [f"first {i}".encode() for i in range(5)]
    assert fs_store.put_many(items=[(sha(b), b) for b in first], content_type="x") == {sha(b): "created" for b in first}
    kept = writers()
    assert 1 <= len(kept) <= PUT_THREADS
    again = [f"again {i}".encode() for i in range(5)]
    assert fs_store.put_many(items=[(sha(b), b) for b in again], content_type="x") == {sha(b): "created" for b in again}
    assert kept <= writers() and len(writers()) <= PUT_THREADS  # the same threads, still there
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports by its exit status
        try:
            blobs = [f"child {i}".encode() for i in range(3)]
            ok = fs_store.put_many(items=[(sha(b), b) for b in blobs], content_type="x") == {
                sha(b): "created" for b in blobs
            }
            os._exit(0 if ok and all(fs_store.verify(sha256=sha(b), size=len(b)) for b in blobs) else 1)
        except BaseException:
            os._exit(2)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0


def test_a_batch_is_read_by_the_org_and_verified(fs_store, alice, bob):
    blobs = [f"payload {i}".encode() * (i + 1) for i in range(5)]
    for blob in blobs:
        object_put(org=alice.org, data=blob)
    assert objects_read_many(org=alice.org, sha256s=[sha(b) for b in reversed(blobs)]) == {sha(b): b for b in blobs}
    with pytest.raises(NotFound):
        objects_read_many(org=bob.org, sha256s=[sha(blobs[0])])
    path = fs_store.root / object_key(sha(blobs[2]))
    os.chmod(path, 0o644)
    path.write_bytes(b"changed on disk")
    with pytest.raises(ObjectCorrupt):
        objects_read_many(org=alice.org, sha256s=[sha(b) for b in blobs])
