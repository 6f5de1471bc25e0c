from __future__ import annotations

import copy
import json

import pytest

from apps.runs.models import Run, RunEvent, RunSpec

pytestmark = pytest.mark.django_db


def submit(member, body, key="k1"):
    # Encoded here, ASCII-escaped as most clients send it (a lone surrogate stays a \ud800 escape).
    data = json.dumps(body)
    return member.client.post("/api/runs", data, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


def test_it_admits_a_run_with_pinned_spec_and_created_event(alice, inputs):
    resp = submit(alice, inputs["body"])
    assert resp.status_code == 201, resp.content
    data = resp.json()
    assert data["id"].startswith("run_")
    assert data["status"] in ("accepted", "queued")
    assert data["dataset"] == inputs["dataset_version"].reference
    assert data["actor"] == {"profile": "noop", "version": 1, "digest": inputs["actor"].digest}
    # Defaults are written out in the pinned plan.
    assert data["plan"]["attempts_per_task"] == 2
    assert type(data["plan"]["attempts_per_task"]) is int
    assert data["plan"]["timeout_multiplier"] == 1.0
    spec = RunSpec.objects.get(run_id=data["id"])
    assert spec.dataset_digest == inputs["dataset_version"].digest
    assert spec.actor_digest == inputs["actor"].digest
    first = RunEvent.objects.get(run_id=data["id"], seq=1)
    assert first.type == "run.created"
    assert first.data["dataset_digest"] == inputs["dataset_version"].digest


def test_same_key_same_body_returns_the_same_run(alice, inputs):
    first = submit(alice, inputs["body"])
    again = submit(alice, copy.deepcopy(inputs["body"]))
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert Run.objects.count() == 1


def test_explicit_defaults_are_the_same_request(alice, inputs):
    first = submit(alice, inputs["body"])
    body = copy.deepcopy(inputs["body"])
    body["plan"]["timeout_multiplier"] = 1.0
    assert submit(alice, body).json()["id"] == first.json()["id"]


def test_same_key_other_body_is_a_conflict(alice, inputs):
    submit(alice, inputs["body"])
    body = copy.deepcopy(inputs["body"])
    body["plan"]["attempts_per_task"] = 3
    resp = submit(alice, body)
    assert resp.status_code == 409
    assert resp.json()["error"]["type"] == "conflict"
    assert resp.json()["error"]["field"] == "Idempotency-Key"
    assert Run.objects.count() == 1


def test_a_replay_answers_its_run_even_when_its_inputs_no_longer_admit(alice, inputs, monkeypatch):
    # The key is looked up once admission fails (not before it): a replay whose inputs are
    # now refused, or resolve to another version, still answers with its first run.
    from apps.core.errors import ValidationFailed
    from apps.runs import services
    from tests.factories import NOOP_RECIPE, make_profile_version

    body = copy.deepcopy(inputs["body"])
    del body["actor"]["version"]  # the latest version
    first = submit(alice, body)
    assert first.status_code == 201, first.content
    make_profile_version(org=alice.org, recipe={**NOOP_RECIPE, "description": "v2"})
    replay = submit(alice, copy.deepcopy(body))
    assert replay.status_code == 200
    assert replay.json()["id"] == first.json()["id"] and replay.json()["actor"]["version"] == 1

    # Published versions are immutable: a refusal the deployment's settings brought about
    # (its default environment now the local sandbox, which cannot run a task) stands in.
    def refuse(**kwargs):
        raise ValidationFailed("the local sandbox cannot run it", field="dataset")

    monkeypatch.setattr(services, "dataset_version_local_check", refuse)
    assert submit(alice, copy.deepcopy(body), key="new").status_code == 400
    refused = submit(alice, copy.deepcopy(body))
    assert refused.status_code == 200 and refused.json()["id"] == first.json()["id"]
    other = copy.deepcopy(body)
    other["plan"]["attempts_per_task"] = 3
    conflict = submit(alice, other)
    assert conflict.status_code == 409 and conflict.json()["error"]["field"] == "Idempotency-Key"
    assert Run.objects.count() == 1


def test_without_a_key_each_submission_is_new(alice, inputs):
    a = alice.client.post("/api/runs", inputs["body"], format="json")
    b = alice.client.post("/api/runs", inputs["body"], format="json")
    assert a.status_code == b.status_code == 201
    assert a.json()["id"] != b.json()["id"]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b.update(kind="explore"), "kind"),
        (lambda b: b["plan"].update(attempts_per_tsk=2), "plan.attempts_per_tsk"),
        (lambda b: b["plan"].update(attempts_per_task=0), "plan.attempts_per_task"),
        (lambda b: b["plan"].update(sampling={"temperature": "hot"}), "plan.sampling.temperature"),
        (lambda b: b.update(actor="noop"), "actor"),
        (lambda b: b.update(dataset=7), "dataset"),
        (lambda b: b.update(extra=1), "extra"),
        # Integers are JSON integers: 2.0, "8" and true are refused, not normalized.
        (lambda b: b["plan"].update(attempts_per_task=2.0), "plan.attempts_per_task"),
        (lambda b: b["plan"].update(max_concurrency="8"), "plan.max_concurrency"),
        (lambda b: b["plan"].update(resources={"memory_mb": 1024.0}), "plan.resources.memory_mb"),
        (lambda b: b["plan"].update(sampling={"max_tokens": True}), "plan.sampling.max_tokens"),
        (lambda b: b["actor"].update(version=1.0), "actor.version"),
        # Text the database cannot store, anywhere in the body.
        (lambda b: b["plan"].update(task_names=["ok", "a\x00b"]), "plan.task_names[1]"),
        (lambda b: b["plan"].update(environment="\ud800"), "plan.environment"),
        (lambda b: b["plan"].update({"\x00": 1}), "plan"),
        (lambda b: b.update(dataset="team/evaluation@v1\x00"), "dataset"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(alice, inputs, mutate, field):
    body = copy.deepcopy(inputs["body"])
    mutate(body)
    resp = submit(alice, body)
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["field"] == field
    assert Run.objects.count() == 0


def test_train_plan_requires_steps(alice, inputs):
    body = copy.deepcopy(inputs["body"])
    body.update(kind="train", plan={"batch_size": 2})
    resp = submit(alice, body)
    assert resp.status_code == 400
    assert "steps" in resp.json()["error"]["message"]


@pytest.mark.parametrize("value", [-1, 9, 1.5, "1"])
def test_a_bad_max_staleness_is_400_naming_it(alice, inputs, value):
    body = copy.deepcopy(inputs["body"])
    body.update(kind="train", plan={"steps": 2, "max_staleness": value})
    resp = submit(alice, body)
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["field"] == "plan.max_staleness"


def test_max_staleness_defaults_to_the_strict_boundary():
    from apps.runs.plans import plan_normalize

    assert plan_normalize(kind="train", plan={"steps": 2})["max_staleness"] == 0
    assert plan_normalize(kind="train", plan={"steps": 2, "max_staleness": 1})["max_staleness"] == 1


def test_unknown_dataset_and_profile_are_404(alice, inputs):
    body = copy.deepcopy(inputs["body"])
    body["dataset"] = "team/evaluation@v9"
    assert submit(alice, body, key="a").status_code == 404
    body = copy.deepcopy(inputs["body"])
    body["actor"]["version"] = 9
    assert submit(alice, body, key="b").status_code == 404


def test_actor_digest_must_match_the_pinned_version(alice, inputs):
    body = copy.deepcopy(inputs["body"])
    body["actor"]["digest"] = "sha256:" + "0" * 64
    resp = submit(alice, body)
    assert resp.status_code == 409
    assert resp.json()["error"]["field"] == "actor.digest"
    body["actor"]["digest"] = "sha256:" + inputs["actor"].digest
    assert submit(alice, body, key="k2").status_code == 201


def test_viewer_cannot_submit(viewer, inputs):
    assert submit(viewer, inputs["body"]).status_code == 403


def test_list_filters_and_pages(alice, inputs):
    for i in range(5):
        submit(alice, inputs["body"], key=f"k{i}")
    body = copy.deepcopy(inputs["body"])
    body.update(kind="execute")
    submit(alice, body, key="exec")
    resp = alice.client.get("/api/runs?kind=evaluate&limit=2")
    page = resp.json()
    assert len(page["results"]) == 2 and page["next"]
    seen = [r["id"] for r in page["results"]]
    while page["next"]:
        page = alice.client.get(page["next"]).json()
        seen += [r["id"] for r in page["results"]]
    assert len(seen) == len(set(seen)) == 5
    assert alice.client.get("/api/runs?kind=execute").json()["results"][0]["kind"] == "execute"
    assert alice.client.get("/api/runs?status=succeeded").json()["results"] == []


def test_a_cancel_records_its_reason_and_refuses_what_it_does_not_take(alice, inputs):
    run_id = submit(alice, inputs["body"]).json()["id"]
    cancel = f"/api/runs/{run_id}/cancel"
    for body, field in (({"reason": "x", "force": True}, "force"), ({"reason": "x" * 501}, "reason")):
        resp = alice.client.post(cancel, json.dumps(body), content_type="application/json")
        assert resp.status_code == 400 and resp.json()["error"]["field"] == field, resp.content
    assert alice.client.get(f"/api/runs/{run_id}").json()["status"] != "cancelled"  # nothing done
    resp = alice.client.post(cancel, json.dumps({"reason": "wrong dataset"}), content_type="application/json")
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    event = RunEvent.objects.filter(run_id=run_id).order_by("-seq").first()
    assert (event.type, event.data["reason"]) == ("run.cancelled", "wrong dataset")


def test_cancel_of_a_queued_run_ends_it(alice, inputs):
    run_id = submit(alice, inputs["body"]).json()["id"]
    resp = alice.client.post(f"/api/runs/{run_id}/cancel")
    assert resp.status_code == 200
    assert resp.json()["status"] == "cancelled"
    types = list(RunEvent.objects.filter(run_id=run_id).values_list("type", flat=True))
    assert types[-1] == "run.cancelled"
    # Cancelling again is harmless and adds nothing.
    assert alice.client.post(f"/api/runs/{run_id}/cancel").json()["status"] == "cancelled"
    assert RunEvent.objects.filter(run_id=run_id).count() == len(types)
