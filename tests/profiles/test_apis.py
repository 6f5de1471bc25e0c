"""The REST surface: exact bytes and digests, idempotent publishing, roles and tenancy."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
from django.contrib.auth import get_user_model
from django.db.models.deletion import ProtectedError

from tests.profiles.test_schema import BASE

pytestmark = pytest.mark.django_db

URL = "/api/profiles/cc/versions"


def publish(member, recipe=None, *, name="cc", raw: str | None = None):
    body = raw if raw is not None else json.dumps(recipe if recipe is not None else BASE)
    return member.client.post(f"/api/profiles/{name}/versions", data=body, content_type="application/json")


def test_post_returns_the_canonical_text_and_its_digest(alice):
    response = publish(alice)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert set(body) == {"id", "name", "version", "digest", "canonical", "created_at"}
    assert (body["name"], body["version"]) == ("cc", 1)
    assert hashlib.sha256(body["canonical"].encode("utf-8")).hexdigest() == body["digest"]
    assert json.loads(body["canonical"]) == BASE
    assert response["X-Synth-Digest"] == f"sha256:{body['digest']}"
    assert response["ETag"] == f'"{body["digest"]}"'
    assert response["Location"] == "/api/profiles/cc/versions/1"


def test_get_returns_the_exact_bytes_with_the_digest_header(alice):
    posted = publish(alice).json()
    response = alice.client.get("/api/profiles/cc/versions/1")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.content == posted["canonical"].encode("utf-8")
    digest = hashlib.sha256(response.content).hexdigest()
    assert digest == posted["digest"]
    assert response["X-Synth-Digest"] == f"sha256:{digest}"
    assert response["ETag"] == f'"{digest}"'
    assert "immutable" in response["Cache-Control"]
    # A client holding the digest need not fetch the bytes again.
    again = alice.client.get("/api/profiles/cc/versions/1", HTTP_IF_NONE_MATCH=f'"{digest}"')
    assert again.status_code == 304 and again.content == b""


def test_meta_has_the_post_shape_with_the_digest_in_the_body(alice):
    posted = publish(alice).json()
    meta = alice.client.get("/api/profiles/cc/versions/1/meta")
    assert meta.status_code == 200
    assert meta.json() == posted


def test_key_order_and_whitespace_do_not_matter_and_non_ascii_stays_utf8(alice):
    recipe = copy.deepcopy(BASE)
    recipe["files"][0]["content"] = "Grüße ✓ 测试"
    first = publish(alice, recipe)
    assert first.status_code == 201
    shuffled = json.dumps(dict(reversed(list(recipe.items()))), indent=3, ensure_ascii=True)
    second = publish(alice, raw=shuffled)
    assert second.status_code == 200  # the existing version, not a new one
    assert second.json() == first.json()
    raw = alice.client.get("/api/profiles/cc/versions/1").content
    assert "Grüße ✓ 测试".encode() in raw and b"\\u" not in raw


def test_republish_is_200_and_new_content_increments(alice):
    assert publish(alice).status_code == 201
    assert publish(alice).status_code == 200
    changed = copy.deepcopy(BASE)
    changed["limits"]["timeout_sec"] = 60
    response = publish(alice, changed)
    assert response.status_code == 201 and response.json()["version"] == 2
    assert publish(alice).json()["version"] == 1


def test_lists(alice):
    publish(alice)
    changed = copy.deepcopy(BASE)
    changed["args"] = []
    publish(alice, changed)
    publish(alice, name="other")

    profiles = alice.client.get("/api/profiles").json()
    assert {"next", "previous", "results"} <= set(profiles)
    by_name = {row["name"]: row for row in profiles["results"]}
    assert by_name["cc"]["latest_version"] == 2 and by_name["cc"]["versions_count"] == 2

    detail = alice.client.get("/api/profiles/cc").json()
    assert (detail["name"], detail["latest_version"]) == ("cc", 2)
    assert [row["version"] for row in detail["results"]] == [2, 1]
    assert detail["results"][0]["created_by"] == "alice"
    assert "canonical" not in detail["results"][0]

    paged = alice.client.get(f"{URL}?limit=1").json()
    assert [row["version"] for row in paged["results"]] == [2]
    following = alice.client.get(paged["next"]).json()
    assert [row["version"] for row in following["results"]] == [1]


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"ANTHROPIC_BASE_URL": "http://elsewhere"}, "env.ANTHROPIC_BASE_URL"),
        ({"HTTPS_PROXY": "http://p"}, "env.HTTPS_PROXY"),
        ({"SYNTH_TRIAL": "x"}, "env.SYNTH_TRIAL"),
    ],
)
def test_reserved_names_are_400_naming_the_field(alice, env, field):
    recipe = copy.deepcopy(BASE)
    recipe["env"] = env
    response = publish(alice, recipe)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request" and error["field"] == field
    assert "reserved by the platform" in error["message"]


def test_reserved_flag_is_400_naming_the_arg(alice):
    recipe = copy.deepcopy(BASE)
    recipe["args"] = ["--max-turns", "40", "--output-format", "json"]
    error = publish(alice, recipe).json()["error"]
    assert error["field"] == "args[2]"


def test_schema_error_is_400_naming_the_path(alice):
    recipe = copy.deepcopy(BASE)
    recipe["engine"]["name"] = "claude"
    response = publish(alice, recipe)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "engine.name"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (json.dumps({"recipe": BASE}), "recipe"),  # the body is the recipe itself
        (json.dumps([BASE]), None),
        ("{not json", None),
    ],
)
def test_malformed_bodies(alice, raw, field):
    response = publish(alice, raw=raw)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field


def test_bad_profile_name(alice):
    response = publish(alice, name="Bad.Name")
    assert response.status_code == 400 and response.json()["error"]["field"] == "name"


def test_form_upload_is_refused(alice):
    response = alice.client.post(URL, data={"engine": "nop"})
    assert response.status_code == 415


def test_another_org_sees_nothing(alice, bob):
    publish(alice)
    for path in ("/api/profiles/cc", URL, f"{URL}/1", f"{URL}/1/meta"):
        response = bob.client.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["type"] == "not_found"
    assert bob.client.get("/api/profiles").json()["results"] == []
    # bob publishing the same name makes his own profile, version 1, leaving alice's alone.
    assert publish(bob).json()["version"] == 1
    assert alice.client.get("/api/profiles/cc").json()["versions_count"] == 1


def test_viewer_reads_but_cannot_publish(alice, viewer):
    publish(alice)
    response = publish(viewer)
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "permission_denied"
    assert viewer.client.get(f"{URL}/1").status_code == 200
    assert viewer.client.get("/api/profiles").status_code == 200


def test_anonymous_and_workers_are_refused(alice, worker_client):
    from rest_framework.test import APIClient

    publish(alice)
    assert APIClient().get(f"{URL}/1").status_code == 401
    assert worker_client.get(f"{URL}/1").status_code == 403


def test_unknown_version_is_404(alice):
    publish(alice)
    response = alice.client.get(f"{URL}/9")
    assert response.status_code == 404 and response.json()["error"]["field"] == "version"


def test_an_author_cannot_be_deleted_out_from_under_a_version(alice):
    # created_by is PROTECT: SET_NULL would be an UPDATE, which the immutability trigger refuses.
    publish(alice)
    with pytest.raises(ProtectedError):
        get_user_model().objects.get(username="alice").delete()
