"""Trial leases without workers: the reaper's decision and never counting twice."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.services import worker_get_or_create
from apps.core.errors import StaleLease
from apps.runs.dispatch import run_dispatch
from apps.runs.leases import lease_reap, trial_claim, trial_complete
from apps.runs.models import Lease, Run, RunEvent
from apps.runs.services import run_schedule
from apps.runs.settlement import TrialOutcome

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(alice, inputs, django_capture_on_commit_callbacks):
    body = dict(inputs["body"], plan={"attempts_per_task": 1, "max_retries": 1})
    run_id = alice.client.post("/api/runs", body, format="json").json()["id"]
    run_schedule(run_id=run_id)
    run_dispatch(run_id=run_id)
    return Run.objects.get(pk=run_id)


def test_a_lapsed_trial_is_requeued_then_lost_and_counted_once(run, django_capture_on_commit_callbacks):
    w1 = worker_get_or_create(name="w1")
    trial = run.trials.order_by("id").first()
    lease = trial_claim(worker=w1, trial_id=trial.id, node_name="n")
    assert trial_claim(worker=w1, trial_id=trial.id, node_name="n") is None  # held
    Lease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert lease_reap() == 1
    trial.refresh_from_db()
    assert trial.status == "pending" and trial.queued_at is None and trial.tries == 1
    assert callbacks, "the requeued trial must be handed to the trials queue after commit"
    # The old holder finishing late is refused: its lease is gone.
    with pytest.raises(StaleLease):
        trial_complete(worker=w1, lease=lease, trial_id=trial.id, outcome=TrialOutcome(status="succeeded"))
    second = trial_claim(worker=w1, trial_id=trial.id, node_name="n")
    assert second.fence == 2
    Lease.objects.filter(pk=second.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    lease_reap()
    trial.refresh_from_db()
    assert trial.status == "lost" and trial.error_type == "WorkerLost"  # max_retries=1 used up
    assert RunEvent.objects.filter(run=run, type="trial.finished", data__trial=trial.id).count() == 1


def test_a_released_trial_lease_gives_back_the_trial_not_the_run(run):
    from apps.core.errors import Conflict
    from apps.runs.leases import lease_complete, lease_release

    w1 = worker_get_or_create(name="w1")
    trial = run.trials.order_by("id").first()
    lease = trial_claim(worker=w1, trial_id=trial.id, node_name="n")
    with pytest.raises(Conflict):  # a trial's lease cannot end the whole run
        lease_complete(worker=w1, lease_id=lease.id, fence=lease.fence, outcome="succeeded")
    lease_release(worker=w1, lease_id=lease.id, fence=lease.fence, reason="shutting down")
    trial.refresh_from_db()
    run.refresh_from_db()
    assert trial.status == "pending" and run.status == "running"
    types = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))
    assert types[-2:] == ["lease.released", "trial.requeued"]


def test_a_claim_reads_the_trial_as_claimed_with_what_it_asks_for(run, django_assert_num_queries):
    from apps.runs.leases import trial_claim_read

    trial = run.trials.select_related("task_version").order_by("id").first()
    actor_version, archive = run.spec.actor_version_id, trial.task_version.archive_id
    claimed = trial_claim_read(
        worker=worker_get_or_create(name="w1"),
        trial_id=trial.id,
        node_name="n",
        related=("run__spec__actor_version", "task_version__archive"),
    )
    assert claimed is not None
    lease, got = claimed
    with django_assert_num_queries(0):  # read with the claim, and as it now is
        assert (got.id, got.status, got.tries, got.worker_node) == (trial.id, "waiting", 1, "n")
        assert got.group.status == "running" and got.run.spec.actor_version_id == actor_version
        assert got.task_version.archive_id == archive
    assert (
        lease.unit == f"trial:{trial.id}"
        and trial_claim_read(worker=worker_get_or_create(name="w2"), trial_id=trial.id, node_name="n") is None
    )  # held


def test_a_claim_reads_what_the_attempt_needs_before_the_runs_lock_and_the_rest_under_it(run):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.runs.leases import trial_claim_read

    trial = run.trials.order_by("id").first()
    with CaptureQueriesContext(connection) as claim:
        claimed = trial_claim_read(
            worker=worker_get_or_create(name="w1"), trial_id=trial.id, node_name="n", related=("run__spec",)
        )
    assert claimed is not None and claimed[1].status == "waiting" and claimed[0].fence == 1
    sql = [q["sql"] for q in claim.captured_queries]
    locked = next(i for i, s in enumerate(sql) if 'FROM "runs_run"' in s and "FOR NO KEY UPDATE" in s)
    # Every trial transition of the run waits for that lock: the joined read of the trial
    # with its related rows comes before it; under it, the trial's status and the unit's
    # latest lease (the active one, if any, and the next fence) are one light read each.
    assert any(s.startswith("SELECT") and 'FROM "runs_trial"' in s and "JOIN" in s for s in sql[:locked])
    assert not any(s.startswith("SELECT") and 'FROM "runs_trial"' in s and "JOIN" in s for s in sql[locked:])
    assert sum(s.startswith("SELECT") and 'FROM "runs_lease"' in s for s in sql[locked:]) == 1


def test_a_claim_of_an_ended_trial_takes_no_lock(run):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.runs.leases import trial_claim_read, trial_mark_running
    from apps.runs.models import Trial

    w1 = worker_get_or_create(name="w1")
    trial = run.trials.order_by("id").first()
    lease = trial_claim(worker=w1, trial_id=trial.id, node_name="n")
    trial_mark_running(worker=w1, lease=lease, trial_id=trial.id, data={})
    trial_complete(worker=w1, lease=lease, trial_id=trial.id, outcome=TrialOutcome(status="succeeded"))
    assert Trial.objects.get(pk=trial.id).status == "succeeded"
    with CaptureQueriesContext(connection) as repeat:  # a message delivered again after the trial ended
        assert trial_claim_read(worker=w1, trial_id=trial.id, node_name="n") is None
    assert not any("FOR NO KEY UPDATE" in q["sql"] for q in repeat.captured_queries)
    assert len(repeat.captured_queries) == 1


def test_an_end_a_trial_cannot_have_is_refused_and_changes_nothing(run):
    from apps.core.errors import Conflict
    from apps.runs.models import Trial

    w1 = worker_get_or_create(name="w1")
    trial = run.trials.order_by("id").first()
    lease = trial_claim(worker=w1, trial_id=trial.id, node_name="n")  # waiting: never started
    events = RunEvent.objects.filter(run=run).count()
    with pytest.raises(Conflict, match="is waiting: it cannot end as succeeded"):
        trial_complete(worker=w1, lease=lease, trial_id=trial.id, outcome=TrialOutcome(status="succeeded"))
    # Its lease still holds it (ended alone, it would leave a live trial nobody hands out).
    assert Lease.objects.get(pk=lease.pk).status == "active"
    assert Trial.objects.get(pk=trial.id).status == "waiting"
    assert RunEvent.objects.filter(run=run).count() == events
    # An end it can have from there is recorded.
    trial_complete(worker=w1, lease=lease, trial_id=trial.id, outcome=TrialOutcome(status="failed"))
    assert Trial.objects.get(pk=trial.id).status == "failed"
    assert Lease.objects.get(pk=lease.pk).status == "completed"
