"""Runs to groups to trials: expansion, bounded enqueueing, trial leases, settlement.

A trial is claimed under a lease on the unit ``trial:<id>`` (same fencing rules as any
lease); its completion, its group's settlement and the run's completion are written in
the one transaction that checks the lease, so a trial is never counted twice.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from apps.accounts.models import WorkerIdentity
from apps.datasets.models import TaskVersion
from apps.runs import signals
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
            return _train_run_start(run=run, now=now)
        if run.kind == RunKind.REGRADE:
            groups, trials = _regrade_build(run=run, source_id=plan["source_run"])
            return _run_start(run=run, now=now, groups=groups, trials=trials)
        attempts = plan.get("attempts_per_task", 1)
        patterns = plan.get("task_names") or []
        entries = spec.dataset_version.entries.select_related("task_version").order_by("position")
        selected = (
            (entry.position, entry.task_version)
            for entry in entries.iterator(chunk_size=500)  # paged over the dataset version
            if not patterns or any(fnmatch.fnmatchcase(entry.task_version.name, p) for p in patterns)
        )
        groups, trials = _groups_build(run=run, step=0, tasks=selected, attempts=attempts, sampler=spec.model_binding)
        return _run_start(run=run, now=now, groups=groups, trials=trials)


def _run_mark_started(*, run: Run, now: Any, data: dict[str, Any]) -> None:
    run.status = RunStatus.RUNNING
    run.started_at = run.started_at or now
    run.save(update_fields=["status", "started_at", "updated_at"])
    event_append(run_id=run.id, type="run.started", data=data)


def _run_start(*, run: Run, now: Any, groups: list[SamplingGroup], trials: list[Trial]) -> int:
    _run_mark_started(run=run, now=now, data={"groups": len(groups), "trials": len(trials)})
    if not trials:
        _run_finalize(run=run)
    else:
        run_id = run.id
        transaction.on_commit(lambda: trials_enqueue(run_id=run_id))
    return len(trials)


def _regrade_build(*, run: Run, source_id: str) -> tuple[list[SamplingGroup], list[Trial]]:
    """A regrade's groups and trials mirror the source run's attempts that kept their
    workdir: same step, task and attempt number; each trial points at its source."""
    sources = list(
        Trial.objects.filter(run_id=source_id, artifacts__kind="work")
        .distinct()
        .select_related("group", "task_version")
        .order_by("group__step", "group__position", "attempt")
    )
    groups: dict[str, SamplingGroup] = {}
    trials: list[Trial] = []
    for source in sources:
        group = groups.get(source.group_id)
        if group is None:
            group = groups[source.group_id] = SamplingGroup(
                run=run,
                step=source.group.step,
                position=source.group.position,
                task_version=source.task_version,
                attempts=0,
                sampler=source.group.sampler,
            )
        group.attempts += 1
        trials.append(
            Trial(run=run, group=group, attempt=source.attempt, task_version=source.task_version, source=source)
        )
    SamplingGroup.objects.bulk_create(list(groups.values()), batch_size=500)
    Trial.objects.bulk_create(trials, batch_size=1000)
    return list(groups.values()), trials


def _groups_build(
    *, run: Run, step: int, tasks: Iterable[tuple[int, TaskVersion]], attempts: int, sampler: dict[str, Any]
) -> tuple[list[SamplingGroup], list[Trial]]:
    groups: list[SamplingGroup] = []
    trials: list[Trial] = []
    for position, task_version in tasks:
        group = SamplingGroup(
            run=run, step=step, position=position, task_version=task_version, attempts=attempts, sampler=sampler
        )
        groups.append(group)
        trials.extend(Trial(run=run, group=group, attempt=i, task_version=task_version) for i in range(attempts))
    SamplingGroup.objects.bulk_create(groups, batch_size=500)
    Trial.objects.bulk_create(trials, batch_size=1000)
    return groups, trials


def _train_run_start(*, run: Run, now: Any) -> int:
    """A train run's batches are made by its learner (the training app), which hears of the
    run through a signal; without a learner installed the run fails clearly."""
    if not signals.train_run_started.has_listeners():
        run.status = RunStatus.FAILED
        run.error = "train runs need the training app, which this deployment does not have installed"
        run.finished_at = now
        run.save(update_fields=["status", "error", "finished_at", "updated_at"])
        event_append(run_id=run.id, type="run.failed", data={"error": run.error})
        return 0
    _run_mark_started(run=run, now=now, data={"kind": "train"})
    run_id = run.id
    transaction.on_commit(lambda: signals.train_run_started.send(sender=Run, run_id=run_id))
    return 0


def batch_add(
    *, run_id: str, step: int, tasks: list[tuple[int, TaskVersion]], attempts: int, sampler: dict[str, Any]
) -> list[SamplingGroup]:
    """Add one batch of sampling groups to a running run (a train run's next step) and
    start its trials. Returns [] if the run is no longer running or the step exists."""
    with transaction.atomic():
        run = Run.objects.select_for_update(of=("self",)).get(pk=run_id)
        if run.status != RunStatus.RUNNING or run.groups.filter(step=step).exists():
            return []
        groups, trials = _groups_build(run=run, step=step, tasks=tasks, attempts=attempts, sampler=sampler)
        event_append(
            run_id=run.id,
            type="batch.started",
            data={"step": step, "groups": len(groups), "trials": len(trials), "sampler": sampler},
        )
        transaction.on_commit(lambda: trials_enqueue(run_id=run_id))
    return groups


def run_complete(*, run_id: str, error: str = "", extra_summary: dict[str, Any] | None = None) -> bool:
    """End a run whose trials have all ended (a train run, by its learner): succeeded, or
    failed with ``error``; cancelled if a cancel was requested. False if already ended."""
    with transaction.atomic():
        run = Run.objects.select_for_update(of=("self",)).get(pk=run_id)
        if run.is_terminal:
            return False
        if run.trials.exclude(status__in=TRIAL_TERMINAL).exists():
            raise ValueError(f"run {run_id} still has trials running")
        _run_finalize(run=run, error=error, extra_summary=extra_summary)
    return True


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
        run_id, group_id, step = run.id, group.id, group.step
        transaction.on_commit(
            lambda: signals.group_settled.send(sender=SamplingGroup, run_id=run_id, group_id=group_id, step=step)
        )
    elif group.status == GroupStatus.PENDING:
        group.status = GroupStatus.RUNNING
        group.save(update_fields=["status"])
    if not run.trials.exclude(status__in=TRIAL_TERMINAL).exists() and not run.is_terminal:
        # A train run ends when its learner says so (after the last update), unless cancelled.
        if run.kind != RunKind.TRAIN or run.cancel_requested_at is not None:
            _run_finalize(run=run)


def _trial_cancel(*, run: Run, trial: Trial, why: str) -> None:
    _trial_settle(run=run, trial=trial, status=TrialStatus.CANCELLED, error_type="Cancelled", error_message=why)


def _run_finalize(*, run: Run, error: str = "", extra_summary: dict[str, Any] | None = None) -> None:
    trials = list(run.trials.select_related("task_version"))
    run.summary = {**run_summarize(trials=trials, scored=run.kind != RunKind.EXECUTE), **(extra_summary or {})}
    if run.cancel_requested_at is not None:
        run.status = RunStatus.CANCELLED
    elif error:
        run.status = RunStatus.FAILED
        run.error = error
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
    # Nothing running on a run that execution expanded (a train run between batches): end it
    # now. A run leased whole through the worker API has no groups; its holder ends it.
    if not run.is_terminal and run.groups.exists() and not run.trials.exclude(status__in=TRIAL_TERMINAL).exists():
        _run_finalize(run=run)


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
