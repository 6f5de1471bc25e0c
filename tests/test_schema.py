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
