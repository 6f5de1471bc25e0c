"""The input rules on /api (apps.core.inputs): integers are JSON integers, text holds no NUL
or lone surrogate, numbers are finite, nesting is bounded. Each refusal is a 400 in the
API's shape naming the field."""

from __future__ import annotations

import base64
import json

import pytest

from apps.core.inputs import InputProblem, json_loads_strict
from apps.runs.leases import lease_claim
from apps.runs.services import run_schedule
from tests.factories import make_dataset_version

pytestmark = pytest.mark.django_db


def refused(response, field, error_type="invalid_request"):
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["type"], error["field"]) == (error_type, field), error
    return error["message"]


def post_raw(client, path, text, **extra):
    return client.post(path, text, content_type="application/json", **extra)


@pytest.fixture
def lease(alice, inputs, worker_client):
    from apps.accounts.models import WorkerIdentity

    run_schedule(run_id=alice.client.post("/api/runs", inputs["body"], format="json").json()["id"])
    return lease_claim(worker=WorkerIdentity.objects.get(name="test-worker"))


# INTEGERS
# ------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["2.0", "0", "-1", "2_0", " 2", "\u0662", "1e3"])
def test_paging_limits_are_decimal_integers(alice, inputs, limit):
    assert "limit must be" in refused(alice.client.get("/api/runs", {"limit": limit}), "limit")


def test_a_valid_limit_pages_and_an_oversized_one_is_capped(alice, inputs):
    assert alice.client.get("/api/runs?limit=2").status_code == 200
    assert alice.client.get("/api/runs?limit=100000").status_code == 200


def test_dataset_task_paging_takes_decimal_integers(alice):
    dsv = make_dataset_version(org=alice.org)
    path = f"/api/datasets/{dsv.reference}"
    assert alice.client.get(path + "?cursor=1").status_code == 200
    refused(alice.client.get(path + "?cursor=1.5"), "cursor")
    refused(alice.client.get(path + "?limit=2.0"), "limit")


def test_event_cursors_are_integers(alice, inputs):
    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]
    path = f"/api/runs/{run_id}/events"
    assert alice.client.get(path + "?after=0&limit=5").status_code == 200
    refused(alice.client.get(path + "?after=1.5"), "after")
    refused(alice.client.get(path + "?limit=2.0"), "limit")
    refused(alice.client.get(path, HTTP_LAST_EVENT_ID="2.0"), "Last-Event-ID")


@pytest.mark.parametrize("fence", [1.0, "1", True])
def test_the_worker_api_takes_json_integers(lease, worker_client, fence):
    path = f"/api/worker/leases/{lease.id}"
    refused(post_raw(worker_client, f"{path}/heartbeat", json.dumps({"fence": fence})), "fence")
    report = {"fence": 1, "local_seq": 1.0, "events": []}
    refused(post_raw(worker_client, f"{path}/events", json.dumps(report)), "local_seq")
    assert post_raw(worker_client, f"{path}/heartbeat", json.dumps({"fence": 1})).status_code == 200


def test_other_integer_fields_take_json_integers(alice):
    body = json.dumps({"model": "qwen3-8b", "ttl_sec": 3600.0})
    refused(post_raw(alice.client, "/api/model-credentials", body), "ttl_sec")
    body = json.dumps({"sha256": "a" * 64, "size": 10.0})
    refused(post_raw(alice.client, "/api/objects/uploads", body), "size")


# TEXT
# ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({"plan": {"task_names": ["\x00"]}}, "plan.task_names[0]", "the string contains a NUL character (U+0000)"),
        ({"plan": {"sampling": {"x": ["ok", "\ud800"]}}}, "plan.sampling.x[1]", "a lone surrogate (U+D800)"),
        ({"actor": {"profile\x00": "noop"}}, "actor", "an object key contains a NUL character"),
        ({"\udfff": 1}, None, "an object key contains a lone surrogate (U+DFFF)"),
    ],
)
def test_nul_and_lone_surrogates_anywhere_in_a_body_are_refused(alice, inputs, body, field, fragment):
    message = refused(post_raw(alice.client, "/api/runs", json.dumps({**inputs["body"], **body})), field)
    assert fragment in message, message


def test_a_surrogate_pair_is_ordinary_text(alice, inputs):
    body = {**inputs["body"], "plan": {"task_names": ["smile \ud83d\ude00"]}}
    response = post_raw(alice.client, "/api/runs", json.dumps(body))
    assert response.status_code == 201, response.content
    assert response.json()["plan"]["task_names"] == ["smile \U0001f600"]


@pytest.mark.parametrize(
    ("path", "extra", "field"),
    [
        ("/api/runs?status=%00", {}, "status"),
        ("/api/runs/run%00x", {}, None),
        ("/api/runs", {"HTTP_IDEMPOTENCY_KEY": "k\x00"}, "Idempotency-Key"),
    ],
)
def test_nul_in_a_query_path_or_header_is_refused(alice, path, extra, field):
    assert "NUL" in refused(alice.client.get(path, **extra), field)


def test_a_cursor_hiding_a_nul_is_an_invalid_cursor(alice):
    cursor = base64.b64encode(b"p=run\x00x").decode()
    response = alice.client.get("/api/runs", {"cursor": cursor})
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found"


def test_form_fields_are_held_to_the_same_rule(alice):
    response = alice.client.post("/api/datasets", {"name": "a\x00b", "version": "1"}, format="multipart")
    assert response.status_code == 400 and response.json()["error"]["field"] == "name"


# NUMBERS AND NESTING
# ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"plan": {"agent_timeout_sec": 1e400}}',
        '{"plan": {"attempts_per_task": ' + "9" * 5000 + "}}",
        '{"plan": NaN}',
        "[" * 100_000,
    ],
)
def test_numbers_json_cannot_carry_and_runaway_nesting_are_refused(alice, text):
    response = post_raw(alice.client, "/api/runs", text)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("JSON parse error - ")


def test_nesting_is_bounded(alice, inputs):
    deep: object = "x"
    for _ in range(70):
        deep = [deep]
    body = {**inputs["body"], "plan": {"task_names": deep}}
    message = refused(post_raw(alice.client, "/api/runs", json.dumps(body)), "plan.task_names" + "[0]" * 62)
    assert "nested deeper than 64 levels" in message


# THE PARSER
# ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"seed": 18446744073709551617, "n": [-9223372036854775809, 123456789012345678]}',
        '{"a": 1, "a": 2.5, "b": [1e-400, -0.0, 5e-324, 1.7976931348623157e308]}',
        '{"text": "\\uD83D\\uDE00 caf\\u00e9 \\/ \\u007f", "ok": [true, false, null]}',
        "[1e19, -1e300, 18446744073709551615]",
        "-12345678901234567890123",
    ],
)
def test_the_parser_reads_what_json_reads(text):
    # The fast path (orjson) must hand over the same value json gives: integers beyond 64
    # bits stay exact integers, the last duplicate key wins, floats round alike.
    value = json_loads_strict(text)
    assert value == json.loads(text) and repr(value) == repr(json.loads(text))


@pytest.mark.parametrize(
    ("text", "path", "fragment"),
    [
        ('{"a": ["\\udc00"]}', ("a", 0), "lone surrogate"),
        ('{"a": "\\u0000"}', ("a",), "NUL"),
        ('{"a": 1e400}', None, "out of range"),
        ('{"a": NaN}', None, "NaN is not valid JSON"),
        ('{"a": 1,}', None, "not valid JSON"),
        ('"\\u0000"', (), "NUL"),
        ("[" * 70 + "]" * 70, (0,) * 64, "nested deeper than 64 levels"),
    ],
)
def test_the_parser_refuses_with_json_s_words_and_paths(text, path, fragment):
    with pytest.raises(InputProblem) as refused_input:
        json_loads_strict(text)
    assert refused_input.value.path == path and fragment in refused_input.value.message
