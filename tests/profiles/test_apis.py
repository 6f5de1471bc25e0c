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


# STRICT INPUT; RECIPES THAT CAN NEVER LAUNCH
# ------------------------------------------------------------------------------


def _refused(response, field):
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["type"], error["field"]) == ("invalid_request", field), error
    return error["message"]


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("limits", "max_model_calls"), 5.0, "limits.max_model_calls"),  # a JSON integer, not 5.0
        (("limits", "max_model_calls"), "5", "limits.max_model_calls"),
        (("limits", "max_model_calls"), True, "limits.max_model_calls"),
        (("env", "CLAUDE_CODE_MAX_OUTPUT_TOKENS"), "81\x0092", "env.CLAUDE_CODE_MAX_OUTPUT_TOKENS"),
        (("files", 0, "content"), "lone \udc80 surrogate", "files[0].content"),
    ],
)
def test_float_integers_nul_and_lone_surrogates_are_refused(alice, path, value, field):
    recipe = copy.deepcopy(BASE)
    parent = recipe
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    _refused(publish(alice, recipe), field)


def test_an_integral_number_in_a_number_field_is_still_written_as_an_integer(alice):
    body = publish(alice, {**BASE, "limits": {"timeout_sec": 1800.0}}).json()
    assert json.loads(body["canonical"])["limits"] == {"timeout_sec": 1800}


def test_a_nul_in_an_object_key_names_the_object(alice):
    message = _refused(publish(alice, {**BASE, "env": {"A\x00": "1"}}), "env")
    assert "an object key contains a NUL character" in message


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"setup": ["cd ${task.wrkdir}"]}, "setup[0]", "unknown binding ${task.wrkdir}"),
        ({"args": ["--name", "${model.nickname}"]}, "args[1]", "unknown binding ${model.nickname}"),
        ({"workdir": "/"}, "workdir", "the root directory cannot be writable"),
        ({"workdir": "/usr"}, "workdir", "/usr is inside the host's read-only /usr"),
        ({"workdir": "/etc/${task.name}"}, "workdir", "inside the host's read-only /etc"),
        ({"workdir": "/proc/self"}, "workdir", "which the sandbox provides itself"),
        ({"workdir": "app"}, "workdir", "must be an absolute path"),
        ({"instruction": {"via": "file:/usr/share/task.md"}}, "instruction.via", "read-only /usr"),
        ({"instruction": {"via": "file:/etc/${task.name}.md"}}, "instruction.via", "read-only /etc"),
        ({"outputs": ["/"]}, "outputs[0]", "contains the artifacts directory"),
    ],
)
def test_recipes_that_can_never_launch_are_refused_at_publish(alice, changes, field, fragment):
    message = _refused(publish(alice, {**copy.deepcopy(BASE), **changes}), field)
    assert message.startswith("the recipe can never launch: ") and fragment in message, message


@pytest.mark.parametrize(
    ("recipe", "field"),
    [
        # A model binding where the recipe binds no model, or its engine is given none.
        ({"engine": {"name": "command", "version": "1"}, "command": ["echo", "${model.name}"]}, "command[1]"),
        (
            {"engine": {"name": "nop", "version": "1"}, "model": {"route": "r"}, "setup": ["echo ${model.route}"]},
            "setup[0]",
        ),
        (
            {"engine": {"name": "command", "version": "1"}, "command": ["true"], "env": {"KEY": "${credential}"}},
            "env.KEY",
        ),
    ],
)
def test_bindings_that_can_have_no_value_are_refused(alice, recipe, field):
    message = _refused(publish(alice, {**recipe, "limits": {"timeout_sec": 60}}), field)
    assert "has no value" in message, message


def test_recipes_that_launch_are_published(alice):
    for changes in (
        {"workdir": "/app/${task.name}"},
        {"workdir": "/srv/work"},
        {"instruction": {"via": "file:/tmp/instruction.md"}},
        {"instruction": {"via": "file:notes/task.md"}},
        {"setup": ["echo ${task.workdir} ${HOME} ${X:-y}"], "outputs": ["out.txt", "/logs/agent/x.txt"]},
    ):
        response = publish(alice, {**copy.deepcopy(BASE), **changes})
        assert response.status_code in (200, 201), (changes, response.content)
