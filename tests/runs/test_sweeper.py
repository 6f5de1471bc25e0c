"""The sweeper: each stuck state is made directly in the database, one tick re-drives it
and says why on the run, a second tick does nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.services import worker_get_or_create
from apps.runs.dispatch import run_dispatch, trials_enqueue
from apps.runs.leases import trial_claim
from apps.runs.models import (
    GroupStatus,
    Lease,
    Reservation,
    Run,
    RunEvent,
    RunStatus,
    SamplingGroup,
    Trial,
    TrialStatus,
)
from apps.runs.services import run_schedule, run_submit
from apps.runs.sweeper import sweep_tick
from apps.runs.transitions import run_transition
from apps.training.models import LearningUpdate, Trainer, TrainerStatus, UpdateStatus
from apps.training.services import training_start
from apps.trials.admission import Budget, node_register
from tests.factories import make_train_run

pytestmark = pytest.mark.django_db

LONG_AGO = timedelta(hours=1)


def ago() -> object:
    return timezone.now() - LONG_AGO


def submitted(member, inputs, **plan) -> Run:
    body = dict(inputs["body"], plan={**inputs["body"]["plan"], **plan})
    run, _ = run_submit(org=member.org, user=None, idempotency_key="k", body=body)
    return run  # on_commit never fires in these tests: nothing was scheduled


def running(member, inputs, **plan) -> Run:
    """Expanded, its trials handed to the trials queue (as the enqueue after commit does)."""
    run = submitted(member, inputs, **plan)
    run_schedule(run_id=run.id)
    run_dispatch(run_id=run.id)
    trials_enqueue(run_id=run.id)
    return Run.objects.get(pk=run.pk)


def notes(run_id: str) -> list[dict]:
    return list(
        RunEvent.objects.filter(run_id=run_id, type="sweep.redriven").order_by("seq").values_list("data", flat=True)
    )


def types(run_id: str) -> list[str]:
    return list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("type", flat=True))


def second_tick_does_nothing(run_id: str) -> None:
    before = RunEvent.objects.filter(run_id=run_id).count()
    assert sweep_tick() == {}
    assert RunEvent.objects.filter(run_id=run_id).count() == before


def test_an_accepted_run_whose_schedule_message_was_lost_is_scheduled(alice, inputs):
    run = submitted(alice, inputs)
    assert sweep_tick() == {}  # young: its message may still be on its way
    Run.objects.filter(pk=run.pk).update(created_at=ago())
    counts = sweep_tick()
    assert counts["runs_scheduled"] == 1
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    (note,) = notes(run.id)
    assert note["action"] == "scheduled" and "never scheduled" in note["why"]
    assert types(run.id)[-2:] == ["sweep.redriven", "run.queued"]
    second_tick_does_nothing(run.id)


def test_a_queued_run_whose_dispatch_message_was_lost_is_expanded(alice, inputs, django_capture_on_commit_callbacks):
    run = submitted(alice, inputs)
    run_schedule(run_id=run.id)
    Run.objects.filter(pk=run.pk).update(updated_at=ago())
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        counts = sweep_tick()
    assert counts["runs_dispatched"] == 1
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.trials.count() == 4
    assert notes(run.id)[0]["action"] == "dispatched"
    # Its trials were never handed to the trials queue (that enqueue came after commit): now they are.
    assert counts["trials_handed_over"] == 4 and callbacks
    assert not Trial.objects.filter(run=run, queued_at__isnull=True).exists()
    second_tick_does_nothing(run.id)


def test_pending_trials_whose_messages_were_lost_are_handed_over_again(
    alice, inputs, django_capture_on_commit_callbacks
):
    run = running(alice, inputs)
    handed = list(run.trials.values_list("pk", flat=True))
    assert sweep_tick() == {}  # just handed over: a worker will claim them
    Trial.objects.filter(run=run).update(queued_at=ago())
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        counts = sweep_tick()
    assert counts == {"trials_requeued": 4}
    assert len(callbacks) == 1  # the four messages, sent after commit
    (note,) = notes(run.id)
    assert note["action"] == "trials_requeued" and note["count"] == 4 and "never claimed" in note["why"]
    assert sorted(note["ids"]) == sorted(handed)
    assert Trial.objects.filter(run=run, queued_at__gt=timezone.now() - timedelta(minutes=1)).count() == 4
    second_tick_does_nothing(run.id)


def test_a_claimed_trial_is_not_handed_over_again(alice, inputs):
    run = running(alice, inputs)
    trial = run.trials.order_by("pk").first()
    trial_claim(worker=worker_get_or_create(name="w"), trial_id=trial.id, node_name="n")
    Trial.objects.filter(run=run).update(queued_at=ago())
    assert sweep_tick() == {"trials_requeued": 3}


def test_groups_whose_trials_all_ended_are_settled_and_the_run_finished(alice, inputs):
    run = running(alice, inputs)
    Trial.objects.filter(run=run).update(status=TrialStatus.SUCCEEDED, reward=1.0, finished_at=timezone.now())
    counts = sweep_tick()
    assert counts == {"groups_settled": 2, "runs_finished": 1}
    assert set(SamplingGroup.objects.filter(run=run).values_list("status", flat=True)) == {GroupStatus.SETTLED}
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.summary["mean_reward"] == 1.0
    actions = [n["action"] for n in notes(run.id)]
    assert actions == ["groups_settled", "finished"]
    assert types(run.id)[-1] == "run.succeeded"  # the note comes before the run's last event
    second_tick_does_nothing(run.id)


def test_a_run_whose_groups_all_settled_is_finished(alice, inputs):
    run = running(alice, inputs)
    Trial.objects.filter(run=run).update(status=TrialStatus.FAILED, error_type="X", finished_at=timezone.now())
    SamplingGroup.objects.filter(run=run).update(status=GroupStatus.SETTLED)
    assert sweep_tick() == {"runs_finished": 1}
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.error == "every trial failed"
    assert "was not finished" in notes(run.id)[-1]["why"]
    second_tick_does_nothing(run.id)


def test_a_cancel_whose_settling_message_was_lost_is_continued(alice, inputs):
    run = running(alice, inputs)
    # A cancel's first transaction, without the settling that follows it.
    run_transition(
        run=run.pk, to=RunStatus.CANCELLING, event="run.cancel_requested", values={"cancel_requested_at": ago()}
    )
    assert sweep_tick() == {"trials_cancelled": 4}
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert set(run.trials.values_list("status", flat=True)) == {TrialStatus.CANCELLED}
    assert notes(run.id)[0]["action"] == "cancel_continued"
    assert types(run.id)[-1] == "run.cancelled"
    second_tick_does_nothing(run.id)


def test_a_reservation_of_an_ended_trial_is_released(alice, inputs):
    run = running(alice, inputs)
    trial = run.trials.first()
    node = node_register(name="n1", budget=Budget(slots=1, cpus=1, memory_mb=512, storage_mb=512))
    held = Reservation.objects.create(node=node, trial=trial, cpus=1, memory_mb=1, storage_mb=1, status="held")
    assert sweep_tick() == {}
    Trial.objects.filter(pk=trial.pk).update(status=TrialStatus.FAILED)
    assert sweep_tick()["reservations_released"] == 1
    held.refresh_from_db()
    assert held.status == "released"
    event = RunEvent.objects.filter(run=run, type="reservation.released").get()
    assert event.data["reservation"] == held.pk and "had ended" in event.data["why"]


def test_a_lapsed_lease_is_reaped_and_noted(alice, inputs):
    run = running(alice, inputs)
    trial = run.trials.order_by("pk").first()
    lease = trial_claim(worker=worker_get_or_create(name="w"), trial_id=trial.id, node_name="n")
    Lease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    counts = sweep_tick()
    assert counts["leases_expired"] == 1
    trial.refresh_from_db()
    assert trial.status == TrialStatus.PENDING  # plan max_retries=1: it runs again
    note = next(n for n in notes(run.id) if n["action"] == "leases_expired")
    assert note["ids"] == [lease.id] and "stopped heartbeating" in note["why"]


# --------------------------------------------------------------------------- training


def train_run(member) -> Run:
    return make_train_run(org=member.org)


def updating(member) -> tuple[Run, Trainer]:
    run = train_run(member)
    training_start(run_id=run.id)
    Trial.objects.filter(run=run).update(status=TrialStatus.SUCCEEDED, reward=1.0)
    SamplingGroup.objects.filter(run=run).update(status=GroupStatus.SETTLED)
    Trainer.objects.filter(run=run).update(status=TrainerStatus.UPDATING, updated_at=ago())
    return run, Trainer.objects.get(run=run)


def test_a_train_run_whose_start_message_was_lost_gets_its_learner(alice):
    run = train_run(alice)
    assert not Trainer.objects.filter(run=run).exists()
    Run.objects.filter(pk=run.pk).update(updated_at=ago())
    assert sweep_tick() == {"training_started": 1}
    assert Trainer.objects.get(run=run).status == TrainerStatus.SAMPLING
    assert [n["action"] for n in notes(run.id)] == ["training_started"]
    trials_enqueue(run_id=run.id)  # what the first batch's commit does
    second_tick_does_nothing(run.id)


def test_a_step_whose_settled_message_was_lost_moves_to_its_update(alice, django_capture_on_commit_callbacks):
    run = train_run(alice)
    training_start(run_id=run.id)
    Trial.objects.filter(run=run).update(status=TrialStatus.SUCCEEDED, reward=1.0, queued_at=timezone.now())
    SamplingGroup.objects.filter(run=run).update(status=GroupStatus.SETTLED)
    Trainer.objects.filter(run=run).update(updated_at=ago())
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert sweep_tick() == {"steps_settled": 1}
    assert Trainer.objects.get(run=run).status == TrainerStatus.UPDATING
    assert callbacks  # the step's update is handed to the training queue
    assert "was not told" in notes(run.id)[-1]["why"]
    second_tick_does_nothing(run.id)


def test_an_update_never_taken_is_handed_over_again(alice, django_capture_on_commit_callbacks):
    run, _ = updating(alice)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert sweep_tick() == {"updates_requeued": 1}
    assert len(callbacks) == 1
    assert "never taken" in notes(run.id)[-1]["why"]
    second_tick_does_nothing(run.id)  # the grace period restarted


def test_an_update_whose_worker_died_while_gathering_is_redone(alice, django_capture_on_commit_callbacks):
    run, _ = updating(alice)
    update = LearningUpdate.objects.create(
        run=run, step=0, sampler={}, holder="elsewhere/b/1/1", heartbeat_at=timezone.now()
    )
    assert sweep_tick() == {}  # its holder heartbeats: alive
    LearningUpdate.objects.filter(pk=update.pk).update(heartbeat_at=ago())
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert sweep_tick() == {"updates_requeued": 1}
    assert callbacks
    update.refresh_from_db()
    assert update.status == UpdateStatus.PENDING and update.holder == "" and update.heartbeat_at is None
    assert "elsewhere/b/1/1" in notes(run.id)[-1]["why"]
    second_tick_does_nothing(run.id)


def test_an_unresolved_update_whose_worker_died_blocks_the_run_with_the_reason(alice):
    run, trainer = updating(alice)
    update = LearningUpdate.objects.create(
        run=run,
        step=0,
        sampler={},
        status=UpdateStatus.UNRESOLVED,
        holder="elsewhere/b/7/9",
        heartbeat_at=timezone.now(),
    )
    assert sweep_tick() == {}  # heartbeating: the optimizer step is still in flight
    LearningUpdate.objects.filter(pk=update.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=90))
    assert sweep_tick() == {"updates_blocked": 1}
    trainer.refresh_from_db()
    run.refresh_from_db()
    update.refresh_from_db()
    assert trainer.status == TrainerStatus.BLOCKED
    assert update.status == UpdateStatus.UNRESOLVED and update.holder == ""
    assert run.status == RunStatus.FAILED
    assert "elsewhere/b/7/9" in run.error and "stopped heartbeating" in run.error and "weights are unknown" in run.error
    blocked = RunEvent.objects.get(run=run, type="training.blocked")
    assert blocked.data["update"] == update.id
    assert types(run.id)[-1] == "run.failed"
    second_tick_does_nothing(run.id)
