"""Another organization's objects are 404 on every endpoint, never 403."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_every_run_endpoint_hides_other_orgs_runs(alice, bob, inputs):
    run_id = alice.client.post("/api/runs", inputs["body"], format="json").json()["id"]
    for method, url in [
        ("get", f"/api/runs/{run_id}"),
        ("post", f"/api/runs/{run_id}/cancel"),
        ("get", f"/api/runs/{run_id}/events"),
        ("get", f"/api/runs/{run_id}/events?follow=1"),
    ]:
        resp = getattr(bob.client, method)(url)
        assert resp.status_code == 404, (url, resp.status_code)
        assert resp.json()["error"]["type"] == "not_found"
    assert bob.client.get("/api/runs").json()["results"] == []
    # bob cannot submit against alice's dataset or profile either: both are 404 to him.
    resp = bob.client.post("/api/runs", inputs["body"], format="json")
    assert resp.status_code == 404
    assert alice.client.get(f"/api/runs/{run_id}").json()["status"] != "cancelled"


def test_unauthenticated_and_bad_tokens_are_401(alice):
    from tests.conftest import make_client

    assert make_client(None).get("/api/runs").status_code == 401
    resp = make_client("syn_nothere_xxxxxxxx").get("/api/runs")
    assert resp.status_code == 401
    assert resp.json()["error"]["type"] == "authentication_failed"
    assert make_client(alice.secret + "x").get("/api/runs").status_code == 401
