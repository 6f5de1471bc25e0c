"""Runs into groups and trials: expansion, and handing trials to the trials queue.

A run is expanded once (guarded by its status under the run row's lock) into sampling
groups of trials; a train run's batches are added by its learner (`batch_add`). Trials go
to the trials queue after commit, at most the plan's max_concurrency in flight; each
trial's end hands over the next (apps.runs.leases), and the sweeper hands over what a lost
message left.

A mixed run (several actors, ``RunSpec.actors``) shares each batch's groups among its
actors round-robin: the batch's groups in position order go to actor 0, 1, ..., n-1, 0, ...
(groups added to a batch later continue the count), so every group's attempts run one
actor's recipe and a batch of at least n groups samples every actor.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.datasets.models import TaskVersion
from apps.runs import signals
from apps.runs.events import event_append
from apps.runs.models import TRIAL_TERMINAL, Run, RunKind, RunStatus, SamplingGroup, Trial, TrialStatus
from apps.runs.settlement import run_finalize
from apps.runs.transitions import run_transition

# --------------------------------------------------------------------------- expansion


def run_dispatch(*, run_id: str) -> int:
    """Expand a queued run into sampling groups and trials and start it. Returns the
    number of trials made; 0 when there was nothing to do (safe to run twice)."""
    with transaction.atomic():
        run = Run.objects.select_for_update(no_key=True, of=("self",)).select_related("spec").get(pk=run_id)
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
        run_finalize(run=run)
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
                actor_id=source.group.actor_id,
            )
        group.attempts += 1
        trials.append(
            Trial(run=run, group=group, attempt=source.attempt, task_version=source.task_version, source=source)
        )
    SamplingGroup.objects.bulk_create(list(groups.values()), batch_size=500)
    Trial.objects.bulk_create(trials, batch_size=1000)
    return list(groups.values()), trials


def _groups_build(
    *,
    run: Run,
    step: int,
    tasks: Iterable[tuple[int, TaskVersion]],
    attempts: int,
    sampler: dict[str, Any],
    sampler_step: int = 0,
    first: int = 0,
) -> tuple[list[SamplingGroup], list[Trial]]:
    """The groups of ``tasks`` and their trials; ``first`` is how many groups the step has
    already (a mixed run's round-robin over its actors continues from there)."""
    actors = [a["id"] for a in run.spec.actors]
    groups: list[SamplingGroup] = []
    trials: list[Trial] = []
    for i, (position, task_version) in enumerate(sorted(tasks, key=lambda task: task[0])):
        group = SamplingGroup(
            run=run,
            step=step,
            position=position,
            task_version=task_version,
            attempts=attempts,
            sampler=sampler,
            sampler_step=sampler_step,
            actor_id=actors[(first + i) % len(actors)] if actors else None,
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
    *,
    run_id: str,
    step: int,
    tasks: list[tuple[int, TaskVersion]],
    attempts: int,
    sampler: dict[str, Any],
    sampler_step: int = 0,
) -> list[SamplingGroup]:
    """Add one batch of sampling groups to a running run (a train run's next step) and
    start its trials; ``sampler_step`` is the step whose weights ``sampler`` holds.
    Returns [] if the run is no longer running or the step exists."""
    return _batch_groups_add(
        run_id=run_id,
        step=step,
        tasks=tasks,
        attempts=attempts,
        sampler=sampler,
        sampler_step=sampler_step,
        extend=False,
    )


def batch_extend(
    *,
    run_id: str,
    step: int,
    tasks: list[tuple[int, TaskVersion]],
    attempts: int,
    sampler: dict[str, Any],
    sampler_step: int = 0,
) -> list[SamplingGroup]:
    """Add groups to a running run's existing batch (a train run drawing replacements for
    groups without learning signal) and start their trials. Tasks already in the step are
    left out (a step holds one group per task). Returns the groups made."""
    return _batch_groups_add(
        run_id=run_id,
        step=step,
        tasks=tasks,
        attempts=attempts,
        sampler=sampler,
        sampler_step=sampler_step,
        extend=True,
    )


def _batch_groups_add(
    *,
    run_id: str,
    step: int,
    tasks: list[tuple[int, TaskVersion]],
    attempts: int,
    sampler: dict[str, Any],
    sampler_step: int,
    extend: bool,
) -> list[SamplingGroup]:
    """Groups for ``step`` in one transaction with the run's row lock: a new batch (the step
    must not exist yet) or, ``extend``, more groups for an existing one (its tasks left out)."""
    with transaction.atomic():
        run = Run.objects.select_for_update(no_key=True, of=("self",)).get(pk=run_id)
        # The step's groups so far (none for a new batch): an extension leaves their tasks
        # out, and its groups continue the actors' round-robin after them.
        taken = set(run.groups.filter(step=step).values_list("position", flat=True))
        if run.status != RunStatus.RUNNING or bool(taken) != extend:
            return []
        if extend:
            tasks = [(position, task) for position, task in tasks if position not in taken]
            if not tasks:
                return []
        groups, trials = _groups_build(
            run=run,
            step=step,
            tasks=tasks,
            attempts=attempts,
            sampler=sampler,
            sampler_step=sampler_step,
            first=len(taken),
        )
        event_append(
            run_id=run.id,
            type="batch.extended" if extend else "batch.started",
            data={
                "step": step,
                "groups": len(groups),
                "trials": len(trials),
                "sampler": sampler,
                "sampler_step": sampler_step,
            },
        )
        transaction.on_commit(lambda: trials_enqueue(run_id=run_id))
    return groups


# --------------------------------------------------------------------------- enqueueing


def trials_enqueue(*, run_id: str) -> list[str]:
    """Hand pending trials to the trials queue, keeping at most max_concurrency in flight.

    Serialized per run by a lock of the hand-over's own, not the run's row: every trial
    transition of the run (claim, start, end, their events) takes the row, and a hand-over
    after each trial's end queued behind them, holding up the process that would take the
    next trial. What it reads unlocked can only be overtaken harmlessly: a trial cancelled,
    or claimed by another message, meanwhile is locked first (or skipped while another
    holds it) and re-read, and a message for a trial that is no longer pending is dropped
    by the claim."""
    from apps.trials.tasks import trial_execute_task

    with transaction.atomic():
        _dispatch_lock(run_id=run_id)
        run = Run.objects.select_related("spec").get(pk=run_id)
        if run.status != RunStatus.RUNNING:
            return []
        limit = run.spec.plan.get("max_concurrency", 8)
        in_flight = Trial.objects.filter(run=run, queued_at__isnull=False).exclude(status__in=TRIAL_TERMINAL).count()
        capacity = max(0, limit - in_flight)
        if not capacity:
            return []
        ids = list(
            Trial.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(run=run, status=TrialStatus.PENDING, queued_at__isnull=True)
            .order_by("id")
            .values_list("id", flat=True)[:capacity]
        )
        if ids:
            Trial.objects.filter(pk__in=ids).update(queued_at=timezone.now())
            transaction.on_commit(lambda: [trial_execute_task.delay(tid) for tid in ids])
    return ids


# A namespace for the hand-over's advisory locks (the first key of the two-key form).
DISPATCH_LOCK_SPACE = 0x5E71


def _dispatch_lock(*, run_id: str) -> None:
    """Lock the run's hand-over until the transaction ends. PostgreSQL: an advisory lock
    keyed by the run; SQLite's transactions are immediate (settings.py), serialized already."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [DISPATCH_LOCK_SPACE, run_id])
