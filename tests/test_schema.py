"""The OpenAPI schema documents every operator-facing path, training and regrade included."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_the_schema_lists_the_training_and_regrade_paths(alice):
    resp = alice.client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert resp.status_code == 200
    paths = set(resp.json()["paths"])
    for path in (
        "/api/runs/{run_id}/updates",
        "/api/runs/{run_id}/checkpoints",
        "/api/checkpoints/{checkpoint_id}",
        "/api/runs/{run_id}/regrade",
        "/api/runs/{run_id}/trials",
    ):
        assert path in paths, sorted(paths)


def _schema(member) -> dict:
    resp = member.client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert resp.status_code == 200
    return resp.json()


def _untyped(schema: dict | None, components: dict, seen: frozenset = frozenset()) -> bool:
    """Whether a body's schema leaves its shape open: missing, or a free-form object."""
    if not schema:
        return True
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return name not in seen and _untyped(components[name], components, seen | {name})
    if schema.get("type") == "array":
        return _untyped(schema.get("items"), components, seen)
    for key in ("allOf", "oneOf", "anyOf"):
        if key in schema:
            return any(_untyped(s, components, seen) for s in schema[key])
    if schema.get("type") == "object" and not schema.get("properties"):
        extra = schema.get("additionalProperties", {})
        return extra in ({}, True) or _untyped(extra, components, seen)
    return False


def test_every_operation_has_typed_bodies_and_an_app_tag(alice):
    schema = _schema(alice)
    components = schema["components"]["schemas"]
    untyped, tags = [], {}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            bodies = [("request", (operation.get("requestBody") or {}).get("content", {}))]
            bodies += [(code, r.get("content") or {}) for code, r in operation["responses"].items()]
            for where, content in bodies:
                for media_type, body in content.items():
                    if media_type != "application/octet-stream" and _untyped(body.get("schema"), components):
                        untyped.append(f"{method.upper()} {path} {where} {media_type}")
            tags[f"{method.upper()} {path}"] = operation["tags"]
    assert untyped == []
    assert tags["GET /api/runs/{run_id}/trials"] == ["runs"]
    assert tags["GET /api/runs/{run_id}/agreement"] == ["runs"]
    assert tags["GET /api/runs/{run_id}/updates"] == ["training"]
    assert tags["GET /api/interactions"] == ["proxy"]
    assert tags["POST /api/profiles/{name}/versions"] == ["profiles"]
    assert {t for ts in tags.values() for t in ts} == {"runs", "training", "proxy", "profiles", "datasets", "objects"}
    assert len(tags) >= 36


def _properties(schema: dict, name: str) -> set[str]:
    return set(schema["components"]["schemas"][name]["properties"])


def test_real_answers_have_exactly_the_documented_fields(alice, inputs):
    """The serializers describe dicts the views build by hand: the two must not drift."""
    from apps.runs.dispatch import run_dispatch
    from apps.runs.models import Run

    schema = _schema(alice)
    run = alice.client.post("/api/runs", inputs["body"], format="json").json()
    assert set(run) == _properties(schema, "Run")
    Run.objects.filter(pk=run["id"]).update(status="queued")
    run_dispatch(run_id=run["id"])
    page = alice.client.get(f"/api/runs/{run['id']}/trials").json()
    assert set(page) == _properties(schema, "PagedTrials")
    assert page["results"] and set(page["results"][0]) == _properties(schema, "Trial")
    groups = alice.client.get(f"/api/runs/{run['id']}/groups").json()["results"]
    assert set(groups[0]) == _properties(schema, "SamplingGroup")
    events = alice.client.get(f"/api/runs/{run['id']}/events").json()
    assert set(events) == _properties(schema, "RunEventsPage")
    assert set(events["results"][0]) == _properties(schema, "RunEvent")
    listed = alice.client.get("/api/runs").json()
    assert set(listed) == _properties(schema, "PagedRuns")
    error = alice.client.get("/api/runs/run_missing").json()
    assert set(error) == _properties(schema, "Error") and set(error["error"]) == _properties(schema, "ErrorDetail")
    profile = alice.client.get(f"/api/profiles/{inputs['actor'].profile.name}").json()
    assert set(profile) == _properties(schema, "ProfileWithVersions")


def test_the_agreement_query_documents_its_with_parameter(alice):
    operation = _schema(alice)["paths"]["/api/runs/{run_id}/agreement"]["get"]
    query = {p["name"]: p for p in operation["parameters"] if p["in"] == "query"}
    assert query["with"]["required"] is True and "threshold" in query
