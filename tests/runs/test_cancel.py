"""Cancel at any scale: the run is marked in one short transaction, its trials that have not
started are settled in batches of bulk statements (each its own transaction), running trials
keep their leases and heartbeat through it, and the run ends cancelled with its last trial."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.accounts.services import worker_get_or_create
from apps.runs import services, settlement
from apps.runs.dispatch import run_dispatch
from apps.runs.leases import lease_heartbeat, trial_claim, trial_complete, trial_mark_running
from apps.runs.models import Lease, Run, RunEvent, RunStatus, SamplingGroup, Trial, TrialStatus
from apps.runs.services import run_cancel, run_schedule, run_submit
from apps.runs.settlement import TrialOutcome, run_cancel_settle
from apps.runs.tasks import run_cancel_settle_task
from apps.runs.transitions import run_transition
from tests.factories import make_dataset_version


def big_run(member, inputs, *, tasks: int, attempts: int) -> Run:
    dataset = make_dataset_version(org=member.org, name=f"big-{tasks}", tasks=tasks)
    body = dict(inputs["body"], dataset=dataset.reference, plan={"attempts_per_task": attempts})
    run, _ = run_submit(org=member.org, user=None, idempotency_key=f"big-{tasks}", body=body)
    run_schedule(run_id=run.id)
    run_dispatch(run_id=run.id)
    return Run.objects.get(pk=run.pk)


def started(run: Run) -> tuple[Lease, Trial]:
    """One trial of the run claimed and running under a live lease, as a trials worker has it."""
    worker = worker_get_or_create(name="trials@test")
    trial = run.trials.order_by("pk").first()
    lease = trial_claim(worker=worker, trial_id=trial.id, node_name="n")
    trial_mark_running(worker=worker, lease=lease, trial_id=trial.id, data={})
    return lease, trial


def count(run: Run, **filters) -> int:
    return Trial.objects.filter(run=run, **filters).count()


@pytest.mark.django_db
def test_a_cancel_settles_in_batches_and_hands_the_rest_to_the_control_queue(
    alice, inputs, monkeypatch, django_capture_on_commit_callbacks
):
    run = big_run(alice, inputs, tasks=30, attempts=2)
    lease, running_trial = started(run)
    monkeypatch.setattr(settlement, "CANCEL_BATCH_SIZE", 25)
    monkeypatch.setattr(services, "CANCEL_INLINE_BATCHES", 1)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert run_cancel(org=alice.org, run_id=run.id).status == RunStatus.CANCELLING
    assert count(run, status=TrialStatus.CANCELLED) == 25  # one batch in the caller
    assert [c for c in callbacks if "run_cancel" in c.__qualname__]  # ...and the rest to the control queue

    run_cancel_settle_task(run.id)  # what the control worker does with that message
    assert count(run, status=TrialStatus.CANCELLED) == 59
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLING  # the running trial is still live...
    assert Lease.objects.get(pk=lease.pk).status == "active"  # ...under its lease
    worker = worker_get_or_create(name="trials@test")
    assert lease_heartbeat(worker=worker, lease_id=lease.id, fence=lease.fence).cancel_requested is True

    trial_complete(
        worker=worker,
        lease=lease,
        trial_id=running_trial.id,
        outcome=TrialOutcome(status=TrialStatus.CANCELLED, error_type="Cancelled", error_message="stopped"),
    )
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED  # with its last trial
    types = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert types.count("trial.finished") == 60
    assert types.count("group.settled") == 30
    assert types[-1] == "run.cancelled"
    assert set(SamplingGroup.objects.filter(run=run).values_list("status", flat=True)) == {"settled"}
    assert run.summary["statuses"] == {"cancelled": 60}


@pytest.mark.django_db
def test_a_batch_is_bulk_statements_not_statements_per_trial(alice, inputs):
    run = big_run(alice, inputs, tasks=60, attempts=1)  # one trial per group: each batch settles its groups
    # A cancel's first transaction, without the settling that follows it.
    run_transition(
        run=run.pk,
        to=RunStatus.CANCELLING,
        event="run.cancel_requested",
        values={"cancel_requested_at": timezone.now()},
    )
    statements = []
    for size in (10, 40):
        with CaptureQueriesContext(connection) as queries:
            assert run_cancel_settle(run_id=run.id, batch_size=size, max_batches=1) is False
        statements.append(len(queries))
    assert statements[0] == statements[1], statements  # four times the trials, the same statements
    assert run_cancel_settle(run_id=run.id) is True
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_does_not_wait_for_the_run_row_a_cancel_batch_holds(alice, inputs):
    assert connection.vendor == "postgresql"
    run = big_run(alice, inputs, tasks=2, attempts=1)
    lease, _ = started(run)
    locked, release = threading.Event(), threading.Event()

    def cancel_batch_holding_the_run() -> None:
        try:
            with transaction.atomic():
                Run.objects.select_for_update().get(pk=run.pk)  # what every cancel batch holds
                locked.set()
                release.wait(60)
        finally:
            connections.close_all()

    holder = threading.Thread(target=cancel_batch_holding_the_run)
    holder.start()
    try:
        assert locked.wait(30)
        outcome: list[object] = []

        def heartbeat() -> None:
            try:
                with connection.cursor() as cursor:
                    # A heartbeat that queued behind the run lock would fail here, not hang.
                    cursor.execute("SET lock_timeout = '5s'")
                outcome.append(
                    lease_heartbeat(worker=worker_get_or_create(name="trials@test"), lease_id=lease.id, fence=1)
                )
            except Exception as exc:  # noqa: BLE001 - reported below
                outcome.append(exc)
            finally:
                connections.close_all()

        beat = threading.Thread(target=heartbeat)
        beat.start()
        beat.join(60)
        assert len(outcome) == 1 and not isinstance(outcome[0], Exception), outcome
    finally:
        release.set()
        holder.join(60)


@pytest.mark.django_db(transaction=True)
def test_a_running_trials_lease_survives_the_cancel_of_a_big_run(alice, inputs):
    assert connection.vendor == "postgresql"
    run = big_run(alice, inputs, tasks=600, attempts=4)  # 2,400 trials
    lease, running_trial = started(run)
    worker = worker_get_or_create(name="trials@test")
    stop = threading.Event()
    beats: list[bool] = []
    failures: list[Exception] = []

    def keep_heartbeating() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '5s'")
            while not stop.is_set():
                try:
                    beats.append(lease_heartbeat(worker=worker, lease_id=lease.id, fence=1).cancel_requested)
                except Exception as exc:  # noqa: BLE001 - counted
                    failures.append(exc)
                stop.wait(0.02)
        finally:
            connections.close_all()

    keeper = threading.Thread(target=keep_heartbeating)
    keeper.start()
    try:
        assert run_cancel(org=alice.org, run_id=run.id).status == RunStatus.CANCELLING
        run_cancel_settle_task(run.id)  # the rest, as the control worker settles it
    finally:
        stop.set()
        keeper.join(60)
    assert beats and beats[-1] is True  # it heartbeated through the cancel, and learned of it
    assert not failures, failures
    assert count(run, status=TrialStatus.CANCELLED) == 2399
    assert Lease.objects.get(pk=lease.pk).status == "active"
    assert Trial.objects.get(pk=running_trial.pk).status == TrialStatus.RUNNING
    assert lease_heartbeat(worker=worker, lease_id=lease.id, fence=1).cancel_requested is True
    trial_complete(
        worker=worker,
        lease=lease,
        trial_id=running_trial.id,
        outcome=TrialOutcome(status=TrialStatus.CANCELLED, error_type="Cancelled", error_message="stopped"),
    )
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED
    assert RunEvent.objects.filter(run=run, type="trial.finished").count() == 2400
