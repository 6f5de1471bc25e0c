"""The learner's state machine without workers: start checks, skipped updates, the end of
a run, cancellation between batches, and an unresolved update blocking continuation."""

from __future__ import annotations

import pytest
from django.db import transaction

from apps.proxy.models import ModelRoute
from apps.proxy.routes import DEFAULT_ROUTE, route_upsert
from apps.runs.models import Run, RunStatus, SamplingGroup, Trial
from apps.runs.services import run_cancel
from apps.runs.settlement import trial_settle
from apps.training.models import LearningUpdate, Trainer, TrainerStatus, UpdateStatus
from apps.training.services import step_settled, training_start
from apps.training.updates import update_apply
from tests.factories import make_train_run

pytestmark = pytest.mark.django_db


def _train_run(member, **plan) -> Run:
    return make_train_run(org=member.org, **plan)


def _settle_step(run: Run, step: int, rewards: list[float]) -> None:
    trials = (
        Trial.objects.filter(run=run, group__step=step)
        .select_related("task_version")
        .order_by("group__position", "attempt")
    )
    # The attempts ran (made directly in the database: no workers here); now they end.
    trials.update(status="running")
    for trial, reward in zip(trials, rewards * 10, strict=False):
        with transaction.atomic():
            trial_settle(run=Run.objects.get(pk=run.pk), trial=trial, status="succeeded", rewards={"reward": reward})


def test_batches_walk_the_dataset_and_updates_without_signal_are_skipped(alice):
    run = _train_run(alice)
    trainer = training_start(run_id=run.id)
    assert trainer.status == TrainerStatus.SAMPLING and trainer.sampler == {"route": "qwen3-8b"}
    groups = SamplingGroup.objects.filter(run=run, step=0).order_by("position")
    assert [g.position for g in groups] == [0, 1] and all(g.attempts == 2 for g in groups)
    assert training_start(run_id=run.id) is None  # idempotent

    assert not step_settled(run_id=run.id, step=0)  # nothing has settled yet
    _settle_step(run, 0, [1.0, 0.0])
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING  # a train run waits for its learner
    assert step_settled(run_id=run.id, step=0)
    assert not step_settled(run_id=run.id, step=0)  # only once

    update = update_apply(run_id=run.id, step=0)
    # Rewards vary, but no attempt made a model call: nothing to train on.
    assert update.status == UpdateStatus.SKIPPED
    assert {g["skipped"] for g in update.groups} == {"no attempt with a non-zero advantage made a model call"}
    next_groups = SamplingGroup.objects.filter(run=run, step=1).order_by("position")
    assert [g.position for g in next_groups] == [0, 2]  # tasks 2, then 0: the cursor wraps into the next epoch
    assert all(g.sampler == {"route": "qwen3-8b"} for g in next_groups)  # weights unchanged

    _settle_step(run, 1, [0.5])
    assert step_settled(run_id=run.id, step=1)
    assert update_apply(run_id=run.id, step=1).status == UpdateStatus.SKIPPED
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    assert run.summary["training"] == {
        "first_step": 0,
        "steps": 2,
        "applied": 0,
        "skipped": 2,
        "reward_by_step": [0.5, 0.5],
        "groups_replaced": 0,
        "replacements": [],
        "attempts_truncated": 0,
        "checkpoints": [],
        "final_checkpoint": None,
    }
    assert run.summary["trials"] == 8
    assert Trainer.objects.get(run=run).status == TrainerStatus.DONE


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"route": False}, "is not trainable"),
        ({"plan": {"loss": "cispo"}}, "the local backend does not compute the loss 'cispo'"),
        ({"plan": {"backend": "tinker"}}, "the tinker backend trains routes served by the tinker sampler"),
    ],
)
def test_a_train_run_that_cannot_train_fails_at_once_with_the_reason(alice, change, error):
    run = _train_run(alice, **change.get("plan", {}))
    if "route" in change:
        ModelRoute.objects.filter(name="qwen3-8b").update(trainable=False)
    training_start(run_id=run.id)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and error in run.error
    assert Trainer.objects.get(run=run).status == TrainerStatus.FAILED
    assert not SamplingGroup.objects.filter(run=run).exists()


def test_the_tinker_backend_without_an_api_key_is_a_clear_failure(alice, monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    route_upsert(**{**DEFAULT_ROUTE, "sampler_backend": "tinker", "sampler_config": {"base_model": "Qwen/Qwen3-8B"}})
    run = _train_run(alice, backend="tinker")
    ModelRoute.objects.filter(name="qwen3-8b").update(
        sampler_backend="tinker", sampler_config={"base_model": "Qwen/Qwen3-8B"}
    )
    training_start(run_id=run.id)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "needs an API key in $TINKER_API_KEY" in run.error


def test_the_local_backend_trains_a_vllm_route_only_with_its_train_base(alice, tmp_path):
    from apps.training.backends import local_base_spec

    vllm = {"base_url": "http://127.0.0.1:1", "model": "tiny", "adapter_root": str(tmp_path)}
    run = _train_run(alice)
    ModelRoute.objects.filter(name="qwen3-8b").update(sampler_backend="openai", sampler_config=vllm)
    training_start(run_id=run.id)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "is served by 'openai' without train_base" in run.error
    # With it, the local backend trains the weights the server serves.
    route = ModelRoute(
        name="v", sampler_backend="openai", sampler_config={**vllm, "train_base": DEFAULT_ROUTE["sampler_config"]}
    )
    assert local_base_spec(route=route) == DEFAULT_ROUTE["sampler_config"]


def test_cancelling_between_batches_ends_the_run_and_the_learner(alice):
    run = _train_run(alice)
    training_start(run_id=run.id)
    _settle_step(run, 0, [1.0, 0.0])
    assert step_settled(run_id=run.id, step=0)  # the learner is updating: no trial is live
    run_cancel(org=alice.org, run_id=run.id)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    update_apply(run_id=run.id, step=0)
    assert Trainer.objects.get(run=run).status == TrainerStatus.DONE
    assert not SamplingGroup.objects.filter(run=run, step=1).exists()


def test_an_unresolved_update_blocks_the_run(alice):
    run = _train_run(alice)
    training_start(run_id=run.id)
    _settle_step(run, 0, [1.0, 0.0])
    assert step_settled(run_id=run.id, step=0)
    # A worker died after submitting the optimizer step, before the checkpoint was saved.
    LearningUpdate.objects.create(run=run, step=0, status=UpdateStatus.UNRESOLVED, sampler={})
    update = update_apply(run_id=run.id, step=0)
    assert update.status == UpdateStatus.UNRESOLVED
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "left unresolved" in run.error
    assert Trainer.objects.get(run=run).status == TrainerStatus.BLOCKED
    assert not SamplingGroup.objects.filter(run=run, step=1).exists()
