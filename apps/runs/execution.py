"""Runs to groups to trials: expansion, bounded enqueueing, trial leases, settlement.

A trial is claimed under a lease on the unit ``trial:<id>`` (same fencing rules as any
lease); its completion, its group's settlement and the run's completion are written in
the one transaction that checks the lease, so a trial is never counted twice. Every status
move goes through apps.runs.transitions. A cancel settles the trials that have not started
in batches (`run_cancel_settle`), each batch one short transaction of bulk statements.
"""

from __future__ import annotations

import fnmatch
import logging
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import models, transaction
from django.db.models import F, Max, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.accounts.models import WorkerIdentity
from apps.core.errors import StaleLease
from apps.datasets.models import TaskVersion
from apps.runs import signals
from apps.runs.evaluation import group_summarize, run_summarize
from apps.runs.events import event_append
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
from apps.runs.services import _lease_ttl, _locked_active_lease, lease_lapse
from apps.runs.transitions import (
    group_transition,
    groups_settle,
    lease_transition,
    run_transition,
    trial_transition,
    trials_transition,
)

logger = logging.getLogger(__name__)

# Trials one cancel batch settles: a few hundred keep each transaction to a fraction of a second.
CANCEL_BATCH_SIZE = 250
LIVE_TRIAL = (TrialStatus.PENDING, TrialStatus.WAITING, TrialStatus.RUNNING)
ENDING = (RunStatus.RUNNING, RunStatus.CANCELLING)


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
        if run.kind == RunKind.TRAIN:
            return _train_run_start(run=run)
        if run.kind == RunKind.REGRADE:
            groups, trials = _regrade_build(run=run, source_id=plan["source_run"])
            return _run_start(run=run, groups=groups, trials=trials)
        attempts = plan.get("attempts_per_task", 1)
        patterns = plan.get("task_names") or []
        entries = spec.dataset_version.entries.select_related("task_version").order_by("position")
        selected = (
            (entry.position, entry.task_version)
            for entry in entries.iterator(chunk_size=500)  # paged over the dataset version
            if not patterns or any(fnmatch.fnmatchcase(entry.task_version.name, p) for p in patterns)
        )
        groups, trials = _groups_build(run=run, step=0, tasks=selected, attempts=attempts, sampler=spec.model_binding)
        return _run_start(run=run, groups=groups, trials=trials)


def _run_mark_started(*, run: Run, data: dict[str, Any]) -> None:
    run_transition(run=run, to=RunStatus.RUNNING, source={RunStatus.QUEUED}, event="run.started", data=data)


def _run_start(*, run: Run, groups: list[SamplingGroup], trials: list[Trial]) -> int:
    _run_mark_started(run=run, data={"groups": len(groups), "trials": len(trials)})
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


def _train_run_start(*, run: Run) -> int:
    """A train run's batches are made by its learner (the training app), which hears of the
    run through a signal; without a learner installed the run fails clearly."""
    if not signals.train_run_started.has_listeners():
        error = "train runs need the training app, which this deployment does not have installed"
        run_transition(run=run, to=RunStatus.FAILED, event="run.failed", data={"error": error}, values={"error": error})
        return 0
    _run_mark_started(run=run, data={"kind": "train"})
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
    from apps.trials.tasks import trial_execute_task

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
        run_id = Trial.objects.filter(pk=trial_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return None
        run = Run.objects.select_for_update(of=("self",)).select_related("spec").get(pk=run_id)
        trial = Trial.objects.select_for_update(of=("self",)).select_related("group", "task_version").get(pk=trial_id)
        if trial.is_terminal:
            return None
        unit = trial_unit(trial.id)
        active = Lease.objects.select_for_update().filter(run=run, unit=unit, status=LeaseStatus.ACTIVE).first()
        if active is not None:
            if active.expires_at > now:
                return None  # a duplicate delivery: the holder is alive
            # Its holder vanished and the reaper has not come by yet: do its job for this lease.
            lease_lapse(run=run, lease=active, now=now)
            trial.refresh_from_db(fields=["status", "tries", "queued_at"])
        if trial.status != TrialStatus.PENDING:
            return None
        if run.cancel_requested_at is not None or run.is_terminal:
            _trial_cancel(run=run, trial=trial, why="the run was cancelled before this trial started")
            return None
        fence = (Lease.objects.filter(run=run, unit=unit).aggregate(m=Max("fence"))["m"] or 0) + 1
        lease = Lease.objects.create(
            run=run, unit=unit, worker=worker, fence=fence, heartbeat_at=now, expires_at=now + _lease_ttl()
        )
        trial_transition(
            trial=trial,
            to=TrialStatus.WAITING,
            source={TrialStatus.PENDING},
            event="trial.claimed",
            data={"lease": lease.id, "fence": fence, "node": node_name, "tries": trial.tries + 1},
            # A requeued trial taken by a duplicate message counts as in flight again.
            values={
                "tries": F("tries") + 1,
                "worker_node": node_name,
                "queued_at": Coalesce(F("queued_at"), Value(now, output_field=models.DateTimeField())),
            },
        )
        if trial.group.status == GroupStatus.PENDING:
            group_transition(group=trial.group, to=GroupStatus.RUNNING, event="group.started")
    return lease


def trial_mark_running(*, worker: WorkerIdentity, lease: Lease, trial_id: str, data: dict[str, Any]) -> None:
    with transaction.atomic():
        _locked_active_lease(lease_id=lease.id, fence=lease.fence, worker=worker)
        trial = Trial.objects.select_for_update().get(pk=trial_id)
        if not trial_transition(
            trial=trial,
            to=TrialStatus.RUNNING,
            source={TrialStatus.WAITING},
            event="trial.started",
            data=data,
            values={"need": data.get("need", {})},
        ):
            raise StaleLease(f"trial {trial_id} is {trial.status}, not waiting to start")


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
    """Record a trial's end under its lease; settle its group and the run when they end.
    The lease's reservations are released in the same transaction."""
    from apps.trials.admission import reservations_release

    with transaction.atomic():
        run, locked = _locked_active_lease(lease_id=lease.id, fence=lease.fence, worker=worker)
        lease_transition(lease=locked, to=LeaseStatus.COMPLETED, event="lease.completed")
        reservations_release(lease=locked, why="its trial ended")
        trial = Trial.objects.select_for_update(of=("self",)).select_related("task_version").get(pk=trial_id)
        _trial_settle(
            run=run,
            trial=trial,
            status=outcome.status,
            rewards=outcome.rewards,
            error_type=outcome.error_type,
            error_message=outcome.error_message,
            timings=outcome.timings,
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
    timings: dict[str, Any] | None = None,
) -> bool:
    """Move a trial to a terminal status and settle what that completes. Caller holds the
    run lock. False if the trial had ended already (nothing is counted twice)."""
    values: dict[str, Any] = {
        "rewards": rewards,
        "reward": _primary_reward(rewards),
        "error_type": error_type[:200],
        "error_message": error_message[:20_000],
    }
    if timings is not None:
        values["timings"] = timings
    data = {
        "group": trial.group_id,
        "task": trial.task_version.name,
        "attempt": trial.attempt,
        "status": status,
        "rewards": rewards,
        "error_type": error_type or None,
    }
    if not trial_transition(trial=trial, to=status, event="trial.finished", data=data, values=values):
        return False
    groups_settle_ended(run=run, group_ids=[trial.group_id])
    if run.kind != RunKind.TRAIN or run.cancel_requested_at is not None:
        # A train run ends when its learner says so (after the last update), unless cancelled.
        _run_end_if_idle(run=run)
    return True


def _trial_cancel(*, run: Run, trial: Trial, why: str) -> bool:
    return _trial_settle(run=run, trial=trial, status=TrialStatus.CANCELLED, error_type="Cancelled", error_message=why)


def groups_settle_ended(*, run: Run, group_ids: Iterable[str]) -> list[str]:
    """Settle those of the groups whose every trial has ended (with their summaries and
    ``group.settled`` events); announce each after commit. Caller holds the run lock."""
    ids = set(group_ids)
    live = set(
        Trial.objects.filter(group_id__in=ids, status__in=LIVE_TRIAL).values_list("group_id", flat=True).distinct()
    )
    ended = ids - live
    if not ended:
        return []
    by_group: dict[str, list[Trial]] = defaultdict(list)
    for trial in Trial.objects.filter(group_id__in=ended).only("group_id", "reward", "error_type"):
        by_group[trial.group_id].append(trial)
    settled = groups_settle(
        run_id=run.id, summaries={gid: group_summarize(trials=by_group[gid]) for gid in ended if by_group[gid]}
    )
    if settled:
        steps = dict(SamplingGroup.objects.filter(pk__in=settled).values_list("pk", "step"))
        run_id, kind = run.id, run.kind
        transaction.on_commit(
            lambda: [
                signals.group_settled.send(
                    sender=SamplingGroup, run_id=run_id, group_id=gid, step=steps[gid], kind=kind
                )
                for gid in settled
            ]
        )
    return settled


def _run_end_if_idle(*, run: Run) -> bool:
    """End a run that execution expanded once nothing of it is live: no trial unsettled and
    no lease held (a run leased whole through the worker API is its holder's to end)."""
    if run.is_terminal or run.trials.filter(status__in=LIVE_TRIAL).exists():
        return False
    if Lease.objects.filter(run=run, status=LeaseStatus.ACTIVE).exists():
        return False
    if not run.groups.exists() and run.cancel_requested_at is None:
        return False  # not expanded yet (or leased whole): nothing has ended
    _run_finalize(run=run)
    return True


@dataclass(frozen=True)
class _TaskName:
    name: str


@dataclass(frozen=True)
class _TrialFacts:
    """What a run's summary reads of a trial (plain rows: a big run ends under its lock)."""

    group_id: str
    status: str
    reward: float | None
    error_type: str
    task_version: _TaskName


def _run_finalize(*, run: Run, error: str = "", extra_summary: dict[str, Any] | None = None) -> None:
    trials = [
        _TrialFacts(group_id=g, status=st, reward=r, error_type=e, task_version=_TaskName(name=n))
        for g, st, r, e, n in Trial.objects.filter(run_id=run.id).values_list(
            "group_id", "status", "reward", "error_type", "task_version__name"
        )
    ]
    summary = {**run_summarize(trials=trials, scored=run.kind != RunKind.EXECUTE), **(extra_summary or {})}
    if run.cancel_requested_at is not None:
        status, error = RunStatus.CANCELLED, run.error
    elif error:
        status = RunStatus.FAILED
    elif trials and all(t.status in (TrialStatus.FAILED, TrialStatus.LOST) for t in trials):
        status, error = RunStatus.FAILED, "every trial failed"
    else:
        status = RunStatus.SUCCEEDED
    run_transition(
        run=run,
        to=status,
        source=ENDING,
        event=f"run.{status}",
        data={"summary": summary},
        values={"summary": summary, "error": error},
    )


def run_cancel_settle(*, run_id: str, batch_size: int | None = None, max_batches: int | None = None) -> bool:
    """Settle a cancelled run's trials that have not started, one short transaction per
    batch (bulk UPDATEs and bulk event inserts), and end the run once nothing of it is
    live. Running trials keep their leases: their holders learn of the cancel by heartbeat.
    True when nothing is left to settle; False when batches remain (call again)."""
    batch_size = batch_size or CANCEL_BATCH_SIZE
    done = 0
    while max_batches is None or done < max_batches:
        with transaction.atomic():
            run = Run.objects.select_for_update(of=("self",)).get(pk=run_id)
            if run.cancel_requested_at is None or run.is_terminal:
                return True
            if _trials_cancel_batch(run=run, limit=batch_size) < batch_size:
                _run_end_if_idle(run=run)
                return True
        done += 1
    return False


def _trials_cancel_batch(*, run: Run, limit: int) -> int:
    """Cancel up to ``limit`` of the run's pending trials; returns how many were pending."""
    rows = list(
        Trial.objects.filter(run=run, status=TrialStatus.PENDING)
        .order_by("pk")
        .values_list("pk", "group_id", "attempt", "task_version_id")[:limit]
    )
    if not rows:
        return 0
    info = {pk: (group_id, attempt, tv) for pk, group_id, attempt, tv in rows}
    names = dict(TaskVersion.objects.filter(pk__in={tv for _, _, tv in info.values()}).values_list("pk", "name"))
    why = "the run was cancelled before this trial started"
    moved = trials_transition(
        run_id=run.id,
        trial_ids=list(info),
        to=TrialStatus.CANCELLED,
        source={TrialStatus.PENDING},
        event="trial.finished",
        data=lambda pk: {
            "group": info[pk][0],
            "task": names[info[pk][2]],
            "attempt": info[pk][1],
            "status": TrialStatus.CANCELLED.value,
            "rewards": None,
            "error_type": "Cancelled",
        },
        values={"rewards": None, "reward": None, "error_type": "Cancelled", "error_message": why},
    )
    groups_settle_ended(run=run, group_ids={info[pk][0] for pk in moved})
    return len(rows)


def trial_lease_lapsed(*, run: Run, lease: Lease) -> bool:
    """The reaper's decision for a trial whose worker vanished: run it again (the plan's
    on_lost/max_retries) or mark it lost. Caller holds the run and lease locks."""
    trial = (
        Trial.objects.select_for_update(of=("self",))
        .select_related("task_version")
        .get(pk=lease.unit.removeprefix("trial:"))
    )
    if trial.is_terminal:
        return False
    plan = run.spec.plan
    if run.cancel_requested_at is not None:
        _trial_cancel(run=run, trial=trial, why="the run was cancelled while this trial's worker was gone")
        return False
    if plan.get("on_lost", "retry") == "retry" and trial.tries <= plan.get("max_retries", 1):
        if trial_transition(
            trial=trial,
            to=TrialStatus.PENDING,
            event="trial.requeued",
            data={"tries": trial.tries},
            values={"queued_at": None},
        ):
            transaction.on_commit(lambda: trials_enqueue(run_id=run.id))
            return True
        return False
    _trial_settle(
        run=run,
        trial=trial,
        status=TrialStatus.LOST,
        error_type="WorkerLost",
        error_message=f"its worker stopped heartbeating (after {trial.tries} tries)",
    )
    return False
