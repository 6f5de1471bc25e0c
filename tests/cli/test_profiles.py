from __future__ import annotations

import hashlib
import json

import httpx
import pytest

from synth_cli import http as synth_http
from tests.cli.conftest import EXAMPLE_RECIPE, one_line

pytestmark = pytest.mark.django_db(transaction=True)


def test_publish_then_show_with_verified_digests(synth, recipe_file):
    result = synth("profile", "publish", f"@{recipe_file}")
    assert result.exit_code == 0, result.stderr
    name_version, digest = one_line(result.stdout).split()
    assert name_version == "agent@1"  # the file stem names the profile

    body = synth.json("profile", "publish", f"@{recipe_file}", "--name", "agent")
    assert body["version"] == 1  # identical content: the same version
    assert body["digest"] == digest  # one form everywhere: sha256:<hex>
    assert f"sha256:{hashlib.sha256(body['canonical'].encode()).hexdigest()}" == body["digest"]
    assert json.loads(body["canonical"]) == EXAMPLE_RECIPE

    shown = synth.json("profile", "show", "agent")  # latest version
    assert shown == {"name": "agent", "version": 1, "digest": body["digest"], "canonical": body["canonical"]}
    raw = synth("profile", "show", "agent@1", "--raw")
    assert raw.exit_code == 0
    assert f"sha256:{hashlib.sha256(raw.stdout_bytes).hexdigest()}" == body["digest"]
    human = synth("profile", "show", "agent@1")
    assert human.exit_code == 0 and '"engine"' in human.stdout


def test_a_new_recipe_is_a_new_version(synth, recipe_file):
    assert synth("profile", "publish", str(recipe_file), "-n", "coder").exit_code == 0
    recipe_file.write_text(json.dumps({**EXAMPLE_RECIPE, "limits": {"timeout_sec": 60}}))
    assert one_line(synth("profile", "publish", str(recipe_file), "-n", "coder").stdout).startswith("coder@2 ")


def test_invalid_json_file_is_a_usage_error_naming_the_position(synth, tmp_path):
    bad = tmp_path / "agent.json"
    bad.write_text('{\n  "engine": {"name": "nop"},\n    oops\n}\n')
    result = synth("profile", "publish", f"@{bad}")
    assert result.exit_code == 2
    assert (
        one_line(result.stderr)
        == f"synth: {bad}: invalid JSON at line 3 column 5: Expecting property name enclosed in double quotes"
    )
    missing = synth("profile", "publish", "@nope.json")
    assert missing.exit_code == 2 and one_line(missing.stderr) == "synth: nope.json: no such file"


def test_a_recipe_the_server_rejects_exits_1_with_its_message(synth, tmp_path):
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({"engine": {"name": "nop", "version": "1"}}))  # no limits
    result = synth("profile", "publish", f"@{path}")
    assert result.exit_code == 1
    assert "limits" in one_line(result.stderr)


def test_unknown_profile(synth):
    result = synth("profile", "show", "ghost@3")
    assert result.exit_code == 1
    assert one_line(result.stderr) == "synth: no version 3 of profile 'ghost' (404)"
    assert synth("profile", "show", "bad/name").exit_code == 2


@pytest.mark.django_db(transaction=False)
def test_a_digest_that_does_not_match_the_returned_bytes_is_refused(offline, recipe_file, monkeypatch):
    canonical = '{"engine":{"name":"nop","version":"1"},"limits":{"timeout_sec":60}}'

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(201, json={"name": "agent", "version": 1, "digest": "0" * 64, "canonical": canonical})
        # GET: the body is not what the header claims
        return httpx.Response(200, content=canonical.encode(), headers={"X-Synth-Digest": "sha256:" + "0" * 64})

    monkeypatch.setattr(synth_http, "transport_factory", lambda: httpx.MockTransport(handler))
    monkeypatch.setenv("SYNTH_API_URL", "http://synth.test")
    monkeypatch.setenv("SYNTH_TOKEN", "t")
    result = offline("profile", "publish", f"@{recipe_file}")
    assert result.exit_code == 1
    assert "canonical bytes hash to sha256:" in one_line(result.stderr)
    result = offline("profile", "show", "agent@1")
    assert result.exit_code == 1
    assert "the body hashes to sha256:" in one_line(result.stderr)
    # A run start never submits with an unverified actor.
    result = offline("run", "start", "--dataset", "team/x@v1", "--actor", f"@{recipe_file}", "--plan", "{}")
    assert result.exit_code == 1 and result.stdout == ""
