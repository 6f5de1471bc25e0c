"""Dynamic sampling: a settled group without learning signal is replaced from the dataset
within the plan's bound (never more extra groups than max_refills in a step), every
replacement recorded; attempts with a response cut at max_tokens can be left out."""

from __future__ import annotations

import pytest

from apps.runs.models import RunEvent, SamplingGroup
from apps.training.models import GroupReplacement, LearningUpdate, Trainer, TrainerStatus, UpdateStatus
from apps.training.sampling import TRUNCATED
from apps.training.services import step_settled, training_start
from apps.training.updates import update_apply
from tests.factories import make_dataset_version, make_profile_version
from tests.training.learner_steps import alternating, groups_play, submit_train

pytestmark = pytest.mark.django_db


def flat(group, trial) -> float:
    return 0.5  # every attempt the same reward: no signal


def _run(member, *, tasks: int = 6, **plan):
    dataset = make_dataset_version(org=member.org, name="dyn", tasks=tasks)
    body = {"steps": 1, "batch_size": 2, "group_size": 2, "learning_rate": 0.05, "lora_rank": 2, **plan}
    run = submit_train(org=member.org, dataset=dataset, model={"route": "qwen3-8b"}, plan=body, key="dyn")
    training_start(run_id=run.id)
    return run


def _unsettled(run, step: int = 0) -> list[SamplingGroup]:
    return list(SamplingGroup.objects.filter(run=run, step=step).exclude(status="settled").order_by("position"))


def test_groups_without_signal_are_replaced_up_to_the_bound(alice):
    run = _run(alice, dynamic_sampling={"max_refills": 3})
    first = _unsettled(run)
    assert [g.position for g in first] == [0, 1]

    # Task 0 has no signal, task 1 has: only task 0's group is replaced (by task 2).
    groups_play(run=run, groups=first[:1], rewards=flat)
    assert not step_settled(run_id=run.id, step=0)
    groups_play(run=run, groups=first[1:], rewards=alternating)
    assert not step_settled(run_id=run.id, step=0)  # the replacement is still sampling
    (replacement,) = GroupReplacement.objects.filter(run=run)
    assert replacement.replaced_id == first[0].id and replacement.replacement.position == 2
    assert "same reward" in replacement.reason and replacement.rewards == [0.5, 0.5]
    assert replacement.replacement.sampler == first[0].sampler
    assert Trainer.objects.get(run=run).dataset_cursor == 3

    # The replacement has no signal either, and neither have the next two: three refills
    # are spent and the fourth empty group is not replaced.
    for _ in range(2):
        groups_play(run=run, groups=_unsettled(run), rewards=flat)
        assert not step_settled(run_id=run.id, step=0)
    groups_play(run=run, groups=_unsettled(run), rewards=flat)
    assert step_settled(run_id=run.id, step=0)  # bound reached: the step goes to its update
    groups = SamplingGroup.objects.filter(run=run, step=0)
    assert groups.count() == 2 + 3 and GroupReplacement.objects.filter(run=run).count() == 3
    assert [g.position for g in groups.order_by("created_at", "position")] == [0, 1, 2, 3, 4]
    events = RunEvent.objects.filter(run=run, type="training.group_replaced").order_by("seq")
    assert [e.data["refills_left"] for e in events] == [2, 1, 0]
    assert RunEvent.objects.filter(run=run, type="batch.extended").count() == 3

    update = update_apply(run_id=run.id, step=0)
    assert update.status == UpdateStatus.APPLIED
    used = [g for g in update.groups if not g["skipped"]]
    assert [g["group"] for g in used] == [first[1].id]
    run.refresh_from_db()
    summary = run.summary["training"]
    assert summary["groups_replaced"] == 3 and len(summary["replacements"]) == 3
    assert summary["replacements"][0] == {
        "step": 0, "replaced": first[0].id, "replacement": replacement.replacement_id, "reason": replacement.reason,
    }  # fmt: skip


def test_two_empty_groups_at_once_take_at_most_max_refills(alice):
    run = _run(alice, dynamic_sampling={"max_refills": 1})
    groups_play(run=run, groups=_unsettled(run), rewards=flat)
    assert not step_settled(run_id=run.id, step=0)
    assert SamplingGroup.objects.filter(run=run, step=0).count() == 3  # one extra group, not two
    groups_play(run=run, groups=_unsettled(run), rewards=flat)
    assert step_settled(run_id=run.id, step=0)
    assert GroupReplacement.objects.filter(run=run).count() == 1
    assert update_apply(run_id=run.id, step=0).status == UpdateStatus.SKIPPED


def test_replacements_are_tasks_the_step_does_not_have(alice):
    # Two tasks, both in the batch: nothing is left to draw, the step goes on as it is.
    run = _run(alice, tasks=2, dynamic_sampling={"max_refills": 4})
    groups_play(run=run, groups=_unsettled(run), rewards=flat)
    assert step_settled(run_id=run.id, step=0)
    assert not GroupReplacement.objects.filter(run=run).exists()


def test_without_dynamic_sampling_nothing_is_replaced(alice):
    run = _run(alice)
    groups_play(run=run, groups=_unsettled(run), rewards=flat)
    assert step_settled(run_id=run.id, step=0)
    assert SamplingGroup.objects.filter(run=run).count() == 2


def _first_truncated(trial) -> bool:
    return trial.group.position == 0 and trial.attempt == 0


@pytest.mark.parametrize("exclude", [True, False])
def test_truncated_attempts_are_left_out_when_the_plan_says_so(alice, exclude):
    # group_size 3, rewards 1, 0, 1: with attempt 0 cut and left out, task 0 still has
    # signal (0 vs 1); the learner records the exclusion.
    run = _run(alice, group_size=3, exclude_truncated=exclude)
    groups_play(run=run, groups=_unsettled(run), rewards=alternating, truncated=_first_truncated)
    assert step_settled(run_id=run.id, step=0)
    update = update_apply(run_id=run.id, step=0)
    assert update.status == UpdateStatus.APPLIED
    by_position = {g.position: g.id for g in SamplingGroup.objects.filter(run=run)}
    summary = {g["group"]: g for g in update.groups}[by_position[0]]
    cut = SamplingGroup.objects.get(pk=by_position[0]).trials.get(attempt=0).id
    if exclude:
        assert summary["excluded"] == {cut: TRUNCATED} and summary["qualified"] == 2
        assert update.metrics["attempts_truncated"] == 1
    else:
        assert summary["excluded"] == {} and summary["qualified"] == 3
        assert update.metrics["attempts_truncated"] == 0
    run.refresh_from_db()
    assert run.summary["training"]["attempts_truncated"] == (1 if exclude else 0)


def test_a_group_with_signal_only_from_a_truncated_attempt_is_replaced(alice):
    # group_size 2, rewards 1 (cut) and 0: without the cut attempt one usable attempt is
    # left, fewer than min_valid_per_group, so the group is replaced.
    run = _run(alice, exclude_truncated=True, dynamic_sampling={"max_refills": 1})
    first = _unsettled(run)
    groups_play(run=run, groups=first, rewards=alternating, truncated=_first_truncated)
    assert not step_settled(run_id=run.id, step=0)
    (replacement,) = GroupReplacement.objects.filter(run=run)
    assert replacement.replaced_id == first[0].id and replacement.rewards == [0.0]
    assert "fewer than min_valid_per_group=2" in replacement.reason
    assert Trainer.objects.get(run=run).status == TrainerStatus.SAMPLING
    assert not LearningUpdate.objects.filter(run=run).exists()


@pytest.mark.parametrize(
    ("plan", "field"),
    [
        ({"dynamic_sampling": {"max_refills": 0}}, "plan.dynamic_sampling.max_refills"),
        ({"dynamic_sampling": {"max_refills": 5000}}, "plan.dynamic_sampling.max_refills"),
        ({"dynamic_sampling": {"max_refills": 2.0}}, "plan.dynamic_sampling.max_refills"),
        ({"dynamic_sampling": {}}, "plan.dynamic_sampling"),
        ({"dynamic_sampling": {"max_refills": 2, "min": 1}}, "plan.dynamic_sampling.min"),
        ({"exclude_truncated": "yes"}, "plan.exclude_truncated"),
    ],
)
def test_bad_dynamic_sampling_plans_are_400s_naming_the_field(alice, plan, field):
    dataset = make_dataset_version(org=alice.org, name="bad", tasks=2)
    recipe = {"model": {"route": "qwen3-8b"}, "engine": {"name": "synth-mini", "version": "1"}}
    profile = make_profile_version(org=alice.org, name="mini-bad", recipe=recipe)
    body = {
        "kind": "train",
        "dataset": dataset.reference,
        "actor": {"profile": profile.profile.name, "version": profile.version},
        "plan": {"steps": 1, **plan},
    }
    resp = alice.client.post("/api/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="bad")
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["field"] == field
