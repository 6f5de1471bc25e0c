"""Query strings: a misspelt parameter or a value no record can hold is a 400 naming it,
never a 200 with an unfiltered or an empty page (apps.core.queries)."""

from __future__ import annotations

import json

import pytest

from tests.factories import make_train_run

pytestmark = pytest.mark.django_db


def submit(member, body, key):
    return member.client.post("/api/runs", json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


def refused(response, field):
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "invalid_request" and error["field"] == field, error
    return error["message"]


def test_a_status_no_run_can_hold_is_refused_with_the_known_ones(alice, inputs):
    submit(alice, inputs["body"], "k1")
    message = refused(alice.client.get("/api/runs?status=runing"), "status")
    assert '"runing" is not one of: accepted, queued, running' in message, message
    message = refused(alice.client.get("/api/runs?kind=evaluate,trian"), "kind")
    assert '"trian"' in message and "train" in message


def test_a_comma_separated_list_of_known_values_filters(alice, inputs):
    submit(alice, inputs["body"], "k1")
    submit(alice, {**inputs["body"], "kind": "execute"}, "k2")
    status = alice.client.get("/api/runs").json()["results"][0]["status"]
    kinds = {r["kind"] for r in alice.client.get("/api/runs?kind=execute,evaluate").json()["results"]}
    assert kinds == {"execute", "evaluate"}
    assert [r["kind"] for r in alice.client.get("/api/runs?kind=execute").json()["results"]] == ["execute"]
    assert len(alice.client.get(f"/api/runs?status=succeeded,{status}").json()["results"]) == 2
    assert alice.client.get("/api/runs?status=succeeded").json()["results"] == []


@pytest.mark.parametrize(
    ("path", "name", "takes"),
    [
        ("/api/runs?stauts=failed", "stauts", "cursor, kind, limit, status"),
        ("/api/profiles?name=noop", "name", "cursor, limit"),
        ("/api/datasets?page=2", "page", "cursor, limit"),
        ("/api/checkpoints?rn=x", "rn", "cursor, limit, run"),
        ("/api/interactions?trail=x", "trail", "cursor, limit, run, trial"),
    ],
)
def test_an_unknown_parameter_is_refused_by_name(alice, path, name, takes):
    message = refused(alice.client.get(path), name)
    assert message == f"{name}: unknown query parameter; this endpoint takes {takes}", message


def test_the_paging_parameters_and_the_format_override_are_known(alice, inputs):
    for i in range(3):
        submit(alice, inputs["body"], f"k{i}")
    page = alice.client.get("/api/runs?limit=2&format=json").json()
    assert len(page["results"]) == 2 and "cursor=" in page["next"]
    assert len(alice.client.get(page["next"]).json()["results"]) == 1
    name = inputs["actor"].profile.name
    assert alice.client.get(f"/api/profiles/{name}?limit=1").status_code == 200


def test_a_run_collection_refuses_what_it_does_not_filter_by(alice):
    run = make_train_run(org=alice.org)
    refused(alice.client.get(f"/api/runs/{run.id}/trials?status=done"), "status")
    refused(alice.client.get(f"/api/runs/{run.id}/trials?task=x"), "task")
    refused(alice.client.get(f"/api/runs/{run.id}/updates?step=0"), "step")
    # Events page by `after`, not by cursor.
    refused(alice.client.get(f"/api/runs/{run.id}/events?cursor=abc"), "cursor")
    refused(alice.client.get(f"/api/runs/{run.id}/agreement?with={run.id}&limit=1"), "limit")


def test_groups_filter_by_step_and_status(alice, inputs):
    from apps.runs.dispatch import run_dispatch
    from apps.runs.models import Run

    run_id = submit(alice, inputs["body"], "k1").json()["id"]
    Run.objects.filter(pk=run_id).update(status="queued")  # as its prerequisites would
    run_dispatch(run_id=run_id)  # 2 tasks: 2 groups, at step 0 as an evaluation's are
    groups = f"/api/runs/{run_id}/groups"
    assert [g["step"] for g in alice.client.get(f"{groups}?step=0").json()["results"]] == [0, 0]
    assert alice.client.get(f"{groups}?step=1").json()["results"] == []
    statuses = {g["status"] for g in alice.client.get(groups).json()["results"]}
    other = next(s for s in ("pending", "running", "settled") if s not in statuses)
    assert len(alice.client.get(f"{groups}?status={other},{','.join(statuses)}").json()["results"]) == 2
    assert alice.client.get(f"{groups}?status={other}").json()["results"] == []
    refused(alice.client.get(f"{groups}?step=abc"), "step")
    refused(alice.client.get(f"{groups}?step=-1"), "step")
    refused(alice.client.get(f"{groups}?status=done"), "status")
