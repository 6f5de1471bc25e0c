"""Runs of several actors (`actors`): admission checks, the round-robin of groups over the
actors, each attempt launching its group's actor, and the per-actor figures of the summary."""

from __future__ import annotations

import pytest
from django.db import transaction

from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
from apps.runs.dispatch import batch_extend, run_dispatch
from apps.runs.models import Run, RunEvent, RunSpec, SamplingGroup, Trial
from apps.runs.services import run_schedule, run_submit
from apps.runs.settlement import trial_settle
from apps.training.services import training_start
from apps.trials.launch import actor_recipe
from tests.factories import NOOP_RECIPE, TRAIN_RECIPE, make_dataset_version, make_profile_version

pytestmark = pytest.mark.django_db

SECOND_RECIPE = {**TRAIN_RECIPE, "args": ["--max-turns", "2"]}


def ref(version):
    return {"profile": version.profile.name, "version": version.version}


def post(member, body, key="k1"):
    return member.client.post("/api/runs", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.fixture
def mixed(alice):
    route_upsert(**DEFAULT_ROUTE)
    first = make_profile_version(org=alice.org, name="mini", recipe=TRAIN_RECIPE)
    second = make_profile_version(org=alice.org, name="mini-long", recipe=SECOND_RECIPE)
    dataset = make_dataset_version(org=alice.org, tasks=5)
    body = {
        "kind": "train",
        "dataset": dataset.reference,
        "actors": [ref(first), ref(second)],
        "plan": {"steps": 1, "batch_size": 5, "group_size": 2},
    }
    return {"first": first, "second": second, "dataset": dataset, "body": body}


def test_a_mixed_train_run_pins_every_actor(alice, mixed):
    resp = post(alice, mixed["body"])
    assert resp.status_code == 201, resp.content
    data = resp.json()
    first, second = mixed["first"], mixed["second"]
    assert data["actor"] == {"profile": "mini", "version": 1, "digest": first.digest}
    assert data["actors"] == [
        {"profile": "mini", "version": 1, "digest": first.digest},
        {"profile": "mini-long", "version": 1, "digest": second.digest},
    ]
    spec = RunSpec.objects.get(run_id=data["id"])
    assert [a["id"] for a in spec.actors] == [first.pk, second.pk]
    assert [a["engine"] for a in spec.actors] == ["synth-mini", "synth-mini"]
    assert spec.actor_version == first and spec.model_binding == {"route": "qwen3-8b"}
    created = RunEvent.objects.get(run_id=data["id"], type="run.created")
    assert [a["profile"] for a in created.data["actors"]] == ["mini", "mini-long"]
    # The same body again is the same request.
    assert post(alice, mixed["body"]).json()["id"] == data["id"]


def test_a_one_actor_run_shows_no_actors(alice, inputs):
    resp = post(alice, inputs["body"])
    assert resp.status_code == 201, resp.content
    assert resp.json()["actors"] == []
    assert RunSpec.objects.get(run_id=resp.json()["id"]).actors == []


def test_actors_on_another_model_are_refused_naming_the_actor(alice, mixed):
    other = make_profile_version(org=alice.org, name="elsewhere", recipe={**TRAIN_RECIPE, "model": {"route": "other"}})
    body = {**mixed["body"], "actors": [ref(mixed["first"]), ref(mixed["second"]), ref(other)]}
    resp = post(alice, body)
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["field"] == "actors[2].model" and "same model" in error["message"]
    unbound = make_profile_version(org=alice.org, name="unbound", recipe=NOOP_RECIPE)
    resp = post(alice, {**mixed["body"], "actors": [ref(mixed["first"]), ref(unbound)]}, key="k2")
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "actors[1].model"
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("actors", "field", "words"),
    [
        (1, "actors", "2 to 8"),
        (9, "actors", "2 to 8"),
        ("x", "actors", "2 to 8"),
        ([{"profile": "mini"}, "mini-long"], "actors[1]", "must be"),
        ([{"profile": "mini"}, {"profile": "mini-long", "colour": 1}], "actors[1].colour", "unknown field"),
        ([{"profile": "mini"}, {"profile": "mini", "version": 1}], "actors[1]", "listed twice"),
    ],
)
def test_a_bad_list_of_actors_is_a_clear_400(alice, mixed, actors, field, words):
    if isinstance(actors, int):
        actors = [{"profile": "mini"}] * actors
    resp = post(alice, {**mixed["body"], "actors": actors})
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["field"] == field and words in error["message"], error


def test_an_unknown_actor_is_a_404_naming_it(alice, mixed):
    resp = post(alice, {**mixed["body"], "actors": [ref(mixed["first"]), {"profile": "nobody"}]})
    assert resp.status_code == 404, resp.content
    assert resp.json()["error"]["field"] == "actors[1]" and "nobody" in resp.json()["error"]["message"]


def test_actors_replace_actor_and_only_for_train_and_evaluate(alice, mixed):
    both = {**mixed["body"], "actor": ref(mixed["first"])}
    resp = post(alice, both)
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "actors"
    execute = {**mixed["body"], "kind": "execute", "plan": {}}
    resp = post(alice, execute, key="k2")
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "actors"
    assert "evaluate or train" in resp.json()["error"]["message"]


def test_every_actor_of_a_train_run_passes_the_train_checks(alice, mixed):
    # A harness that must be checked before training (none is checked in this database).
    claude = make_profile_version(
        org=alice.org, name="cc", recipe={**TRAIN_RECIPE, "engine": {"name": "claude-code", "version": "1"}}
    )
    resp = post(alice, {**mixed["body"], "actors": [ref(mixed["first"]), ref(claude)]})
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["field"] == "actors[1].engine" and "harness_check" in resp.json()["error"]["message"]
    # The same actors may evaluate: the gate is for training.
    resp = post(alice, {**mixed["body"], "kind": "evaluate", "plan": {}, "actors": [ref(mixed["first"]), ref(claude)]})
    assert resp.status_code == 201, resp.content


def _admit(alice, body, key="run"):
    run, _ = run_submit(org=alice.org, user=None, idempotency_key=key, body=body)
    run_schedule(run_id=run.id)
    run_dispatch(run_id=run.id)
    return Run.objects.get(pk=run.pk)


def test_a_train_batch_shares_its_groups_round_robin_and_attempts_launch_their_groups_actor(alice, mixed):
    run = _admit(alice, mixed["body"])
    training_start(run_id=run.id)
    first, second = mixed["first"], mixed["second"]
    groups = list(SamplingGroup.objects.filter(run=run, step=0).order_by("position"))
    assert [g.position for g in groups] == [0, 1, 2, 3, 4]
    assert [g.actor_id for g in groups] == [first.pk, second.pk, first.pk, second.pk, first.pk]
    for trial in Trial.objects.filter(run=run).select_related("group__actor", "run__spec__actor_version"):
        expected = SECOND_RECIPE["args"] if trial.group.actor_id == second.pk else None
        assert actor_recipe(trial=trial).get("args") == expected

    # Groups added to the batch later continue the count: the 6th group of the step is actor 1's.
    extra = make_dataset_version(org=alice.org, name="more", tasks=1).entries.get().task_version
    (added,) = batch_extend(
        run_id=run.id, step=0, tasks=[(9, extra)], attempts=2, sampler={"route": "qwen3-8b"}, sampler_step=0
    )
    assert added.actor_id == second.pk


def test_a_mixed_evaluation_summarizes_each_actor(alice, mixed):
    body = {**mixed["body"], "kind": "evaluate", "plan": {"attempts_per_task": 2}}
    run = _admit(alice, body)
    groups = list(SamplingGroup.objects.filter(run=run).order_by("position"))
    assert [g.actor_id for g in groups] == [mixed["first"].pk, mixed["second"].pk] * 2 + [mixed["first"].pk]
    trials = Trial.objects.filter(run=run).select_related("group").order_by("group__position", "attempt")
    trials.update(status="running")
    for trial in trials:
        # The first actor solves every task, the second none.
        reward = 1.0 if trial.group.actor_id == mixed["first"].pk else 0.0
        with transaction.atomic():
            trial_settle(run=Run.objects.get(pk=run.pk), trial=trial, status="succeeded", rewards={"reward": reward})
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert run.summary["per_actor"] == [
        {
            "profile": "mini",
            "version": 1,
            "engine": "synth-mini",
            "groups": 3,
            "trials": 6,
            "assessed": 6,
            "mean_reward": 1.0,
            "passed": 6,
            "errors": {},
        },
        {
            "profile": "mini-long",
            "version": 1,
            "engine": "synth-mini",
            "groups": 2,
            "trials": 4,
            "assessed": 4,
            "mean_reward": 0.0,
            "passed": 0,
            "errors": {},
        },
    ]
    listed = alice.client.get(f"/api/runs/{run.id}/groups").json()["results"]
    assert [g["actor"]["profile"] for g in sorted(listed, key=lambda g: g["position"])] == [
        "mini",
        "mini-long",
        "mini",
        "mini-long",
        "mini",
    ]
