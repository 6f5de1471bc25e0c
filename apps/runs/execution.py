"""Runs to groups to trials: expansion, bounded enqueueing, trial leases, settlement.

A trial is claimed under a lease on the unit ``trial:<id>`` (same fencing rules as any
lease); its completion, its group's settlement and the run's completion are written in
the one transaction that checks the lease, so a trial is never counted twice.
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from apps.accounts.models import WorkerIdentity
from apps.runs.evaluation import group_summarize, run_summarize
from apps.runs.models import (
    TRIAL_TERMINAL,
    GroupStatus,
    Lease,
    LeaseStatus,
    Run,
    RunKind,
    RunStatus,
    SamplingGroup,
    Trial,
    TrialStatus,
)
from apps.runs.services import _lease_ttl, _locked_active_lease, event_append

logger = logging.getLogger(__name__)


def trial_unit(trial_id: str) -> str:
    return f"trial:{trial_id}"


# --------------------------------------------------------------------------- expansion


def run_dispatch(*, run_id: str) -> int:
    """Expand a queued run into sampling groups and trials and start it. Returns the
    number of trials made; 0 when there was nothing to do (safe to run twice)."""
    with transaction.atomic():
        run = Run.objects.select_for_update(of=("self",)).select_related("spec").get(pk=run_id)
        if run.status != RunStatus.QUEUED or run.trials.exists():
            return 0
        spec = run.spec
        plan = spec.plan
        now = timezone.now()
        if run.kind == RunKind.TRAIN:
            # Training drives its own batches through these services (training issue).
            run.status = RunStatus.FAILED
            run.error = "train runs need the training service, which this deployment does not have yet"
            run.finished_at = now
            run.save(update_fields=["status", "error", "finished_at", "updated_at"])
            event_append(run_id=run.id, type="run.failed", data={"error": run.error})
            return 0
        attempts = plan.get("attempts_per_task", 1)
        patterns = plan.get("task_names") or []
        groups: list[SamplingGroup] = []
        trials: list[Trial] = []
        entries = spec.dataset_version.entries.select_related("task_version").order_by("position")
        for entry in entries.iterator(chunk_size=500):  # paged over the dataset version
            tv = entry.task_version
            if patterns and not any(fnmatch.fnmatchcase(tv.name, p) for p in patterns):
                continue
            group = SamplingGroup(
                run=run, position=entry.position, task_version=tv, attempts=attempts, sampler=spec.model_binding
            )
            groups.append(group)
            trials.extend(Trial(run=run, group=group, attempt=i, task_version=tv) for i in range(attempts))
        SamplingGroup.objects.bulk_create(groups, batch_size=500)
        Trial.objects.bulk_create(trials, batch_size=1000)
        run.status = RunStatus.RUNNING
        run.started_at = run.started_at or now
        run.save(update_fields=["status", "started_at", "updated_at"])
        event_append(run_id=run.id, type="run.started", data={"groups": len(groups), "trials": len(trials)})
        if not trials:
            _run_finalize(run=run)
        else:
            transaction.on_commit(lambda: trials_enqueue(run_id=run.id))
    return len(trials)


def trials_enqueue(*, run_id: str) -> list[str]:
    """Hand pending trials to the trials queue, keeping at most max_concurrency in flight."""
    from apps.runs.tasks import trial_execute_task

    with transaction.atomic():
        run = Run.objects.select_for_update(of=("self",)).select_related("spec").get(pk=run_id)
        if run.status != RunStatus.RUNNING:
            return []
        limit = run.spec.plan.get("max_concurrency", 8)
        in_flight = Trial.objects.filter(run=run, queued_at__isnull=False).exclude(status__in=TRIAL_TERMINAL).count()
        capacity = max(0, limit - in_flight)
        ids = list(
            Trial.objects.filter(run=run, status=TrialStatus.PENDING, queued_at__isnull=True)
            .order_by("id")
            .values_list("id", flat=True)[:capacity]
        )
        if ids:
            Trial.objects.filter(pk__in=ids).update(queued_at=timezone.now())
            transaction.on_commit(lambda: [trial_execute_task.delay(tid) for tid in ids])
    return ids


# --------------------------------------------------------------------------- trial leases


def trial_claim(*, worker: WorkerIdentity, trial_id: str, node_name: str) -> Lease | None:
    """Lease a trial for this worker, or None if it is settled or someone holds it."""
    now = timezone.now()
    with transaction.atomic():
        trial = Trial.objects.filter(pk=trial_id).only("run_id").first()
        if trial is None:
            return None
        run = Run.objects.select_for_update().get(pk=trial.run_id)
        trial = Trial.objects.select_for_update().get(pk=trial_id)
        if trial.is_terminal:
            return None
        unit = trial_unit(trial.id)
        if run.cancel_requested_at is not None or run.is_terminal:
            _trial_cancel(run=run, trial=trial, why="the run was cancelled before this trial started")
            return None
        active = Lease.objects.select_for_update().filter(run=run, unit=unit, status=LeaseStatus.ACTIVE).first()
        if active is not None:
            if active.expires_at > now:
                return None  # a duplicate delivery: the holder is alive
            active.status = LeaseStatus.EXPIRED
            active.ended_at = now
            active.save(update_fields=["status", "ended_at"])
        fence = (Lease.objects.filter(run=run, unit=unit).aggregate(m=Max("fence"))["m"] or 0) + 1
        lease = Lease.objects.create(
            run=run, unit=unit, worker=worker, fence=fence, heartbeat_at=now, expires_at=now + _lease_ttl()
        )
        trial.status = TrialStatus.WAITING
        trial.tries += 1
        trial.worker_node = node_name
        trial.save(update_fields=["status", "tries", "worker_node"])
    return lease


def trial_mark_running(*, worker: WorkerIdentity, lease: Lease, trial_id: str, data: dict[str, Any]) -> None:
    with transaction.atomic():
        run, _ = _locked_active_lease(lease_id=lease.id, fence=lease.fence, worker=worker)
        trial = Trial.objects.select_for_update().get(pk=trial_id)
        trial.status = TrialStatus.RUNNING
        trial.started_at = timezone.now()
        trial.need = data.get("need", {})
        trial.save(update_fields=["status", "started_at", "need"])
        event_append(run_id=run.id, type="trial.started", data={"trial": trial_id, **data})


@dataclass
class TrialOutcome:
    status: str
    rewards: dict[str, float] | None = None
    error_type: str = ""
    error_message: str = ""
    timings: dict[str, Any] = field(default_factory=dict)


def _primary_reward(rewards: dict[str, float] | None) -> float | None:
    if not rewards:
        return None
    if "reward" in rewards:
        return float(rewards["reward"])
    return sum(float(v) for v in rewards.values()) / len(rewards)


def trial_complete(*, worker: WorkerIdentity, lease: Lease, trial_id: str, outcome: TrialOutcome) -> None:
    """Record a trial's end under its lease; settle its group and the run when they end."""
    with transaction.atomic():
        run, locked = _locked_active_lease(lease_id=lease.id, fence=lease.fence, worker=worker)
        locked.status = LeaseStatus.COMPLETED
        locked.ended_at = timezone.now()
        locked.save(update_fields=["status", "ended_at"])
        trial = Trial.objects.select_for_update().get(pk=trial_id)
        trial.timings = outcome.timings
        _trial_settle(
            run=run,
            trial=trial,
            status=outcome.status,
            rewards=outcome.rewards,
            error_type=outcome.error_type,
            error_message=outcome.error_message,
        )
    transaction.on_commit(lambda: trials_enqueue(run_id=run.id))


def _trial_settle(
    *,
    run: Run,
    trial: Trial,
    status: str,
    rewards: dict[str, float] | None = None,
    error_type: str = "",
    error_message: str = "",
) -> None:
    """Move a trial to a terminal status and settle what that completes. Caller holds the
    run and trial locks."""
    trial.status = status
    trial.rewards = rewards
    trial.reward = _primary_reward(rewards)
    trial.error_type = error_type[:200]
    trial.error_message = error_message[:20_000]
    trial.finished_at = timezone.now()
    trial.save(update_fields=["status", "rewards", "reward", "error_type", "error_message", "finished_at", "timings"])
    event_append(
        run_id=run.id,
        type="trial.finished",
        data={
            "trial": trial.id,
            "group": trial.group_id,
            "task": trial.task_version.name,
            "attempt": trial.attempt,
            "status": status,
            "rewards": rewards,
            "error_type": error_type or None,
        },
    )
    group = SamplingGroup.objects.select_for_update().get(pk=trial.group_id)
    if not group.trials.exclude(status__in=TRIAL_TERMINAL).exists():
        group.status = GroupStatus.SETTLED
        group.settled_at = timezone.now()
        group.summary = group_summarize(trials=list(group.trials.all()))
        group.save(update_fields=["status", "settled_at", "summary"])
        event_append(run_id=run.id, type="group.settled", data={"group": group.id, **group.summary})
    elif group.status == GroupStatus.PENDING:
        group.status = GroupStatus.RUNNING
        group.save(update_fields=["status"])
    if not run.trials.exclude(status__in=TRIAL_TERMINAL).exists() and not run.is_terminal:
        _run_finalize(run=run)


def _trial_cancel(*, run: Run, trial: Trial, why: str) -> None:
    _trial_settle(run=run, trial=trial, status=TrialStatus.CANCELLED, error_type="Cancelled", error_message=why)


def _run_finalize(*, run: Run) -> None:
    trials = list(run.trials.select_related("task_version"))
    run.summary = run_summarize(trials=trials, scored=run.kind != RunKind.EXECUTE)
    if run.cancel_requested_at is not None:
        run.status = RunStatus.CANCELLED
    elif trials and all(t.status in (TrialStatus.FAILED, TrialStatus.LOST) for t in trials):
        run.status = RunStatus.FAILED
        run.error = "every trial failed"
    else:
        run.status = RunStatus.SUCCEEDED
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "summary", "error", "finished_at", "updated_at"])
    event_append(run_id=run.id, type=f"run.{run.status}", data={"summary": run.summary})


def run_cancel_trials(*, run: Run) -> None:
    """On cancel: trials that have not started end now; running ones learn it through
    their lease heartbeat. Caller holds the run lock."""
    for trial in run.trials.select_for_update().filter(status=TrialStatus.PENDING):
        _trial_cancel(run=run, trial=trial, why="the run was cancelled before this trial started")
        if run.is_terminal:  # the last pending trial settled the run
            return


def trial_lease_lapsed(*, run: Run, lease: Lease) -> bool:
    """The reaper's decision for a trial whose worker vanished: run it again (the plan's
    on_lost/max_retries) or mark it lost. Caller holds the run and lease locks."""
    trial = Trial.objects.select_for_update().get(pk=lease.unit.removeprefix("trial:"))
    if trial.is_terminal:
        return False
    plan = run.spec.plan
    if run.cancel_requested_at is not None:
        _trial_cancel(run=run, trial=trial, why="the run was cancelled while this trial's worker was gone")
        return False
    if plan.get("on_lost", "retry") == "retry" and trial.tries <= plan.get("max_retries", 1):
        trial.status = TrialStatus.PENDING
        trial.queued_at = None
        trial.save(update_fields=["status", "queued_at"])
        event_append(run_id=run.id, type="trial.requeued", data={"trial": trial.id, "tries": trial.tries})
        transaction.on_commit(lambda: trials_enqueue(run_id=run.id))
        return True
    _trial_settle(
        run=run,
        trial=trial,
        status=TrialStatus.LOST,
        error_type="WorkerLost",
        error_message=f"its worker stopped heartbeating (after {trial.tries} tries)",
    )
    return False
