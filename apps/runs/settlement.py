"""Settling what has ended: a trial's terminal status, the groups it completes, the run.

Every function here runs under the run row's lock (its caller's transaction or its own),
so a trial is never counted twice and a group or run settles once. Every status move goes
through apps.runs.transitions. A cancel settles the trials that have not started in
batches (`run_cancel_settle`), each batch one short transaction of bulk statements.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from apps.datasets.models import TaskVersion
from apps.runs import signals
from apps.runs.evaluation import actors_summarize, group_summarize, run_summarize
from apps.runs.models import (
    TRIAL_TERMINAL,
    Lease,
    LeaseStatus,
    Run,
    RunKind,
    RunSpec,
    RunStatus,
    SamplingGroup,
    Trial,
    TrialStatus,
)
from apps.runs.transitions import groups_settle, run_transition, trial_transition, trials_transition

# Trials one cancel batch settles: a few hundred keep each transaction to a fraction of a second.
CANCEL_BATCH_SIZE = 250
LIVE_TRIAL = (TrialStatus.PENDING, TrialStatus.WAITING, TrialStatus.RUNNING)
ENDING = (RunStatus.RUNNING, RunStatus.CANCELLING)


@dataclass
class TrialOutcome:
    """How an attempt ended: the terminal status and what is recorded with it."""

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


# --------------------------------------------------------------------------- trials


def trial_settle(
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
        run_end_if_idle(run=run)
    return True


def trial_cancel(*, run: Run, trial: Trial, why: str) -> bool:
    return trial_settle(run=run, trial=trial, status=TrialStatus.CANCELLED, error_type="Cancelled", error_message=why)


# --------------------------------------------------------------------------- groups


def groups_settle_ended(*, run: Run, group_ids: Iterable[str]) -> list[str]:
    """Settle those of the groups whose every trial has ended (with their summaries and
    ``group.settled`` events); announce each after commit. Caller holds the run lock."""
    ids = set(group_ids)
    # One read of the groups' trials answers both which groups ended and their summaries (a
    # group has a handful of attempts; this runs under the run's lock at every trial's end).
    by_group: dict[str, list[Trial]] = defaultdict(list)
    live: set[str] = set()
    for trial in Trial.objects.filter(group_id__in=ids).only("group_id", "status", "reward", "error_type"):
        by_group[trial.group_id].append(trial)
        if trial.status in LIVE_TRIAL:
            live.add(trial.group_id)
    ended = ids - live
    if not ended:
        return []
    steps = groups_settle(
        run_id=run.id, summaries={gid: group_summarize(trials=by_group[gid]) for gid in ended if by_group[gid]}
    )
    if steps:
        run_id, kind = run.id, run.kind
        transaction.on_commit(
            lambda: [
                signals.group_settled.send(sender=SamplingGroup, run_id=run_id, group_id=gid, step=step, kind=kind)
                for gid, step in steps.items()
            ]
        )
    return list(steps)


# --------------------------------------------------------------------------- runs


def run_end_if_idle(*, run: Run) -> bool:
    """End a run that dispatch expanded once nothing of it is live: no trial unsettled and
    no lease held (a run leased whole through the worker API is its holder's to end)."""
    if run.is_terminal or run.trials.filter(status__in=LIVE_TRIAL).exists():
        return False
    if Lease.objects.filter(run=run, status=LeaseStatus.ACTIVE).exists():
        return False
    if not run.groups.exists() and run.cancel_requested_at is None:
        return False  # not expanded yet (or leased whole): nothing has ended
    run_finalize(run=run)
    return True


@dataclass(frozen=True)
class _TaskName:
    name: str


@dataclass(frozen=True)
class _TrialFacts:
    """What a run's summary reads of a trial (plain rows: a big run ends under its lock)."""

    group_id: str
    actor_id: str | None
    status: str
    reward: float | None
    error_type: str
    task_version: _TaskName


def run_finalize(*, run: Run, error: str = "", extra_summary: dict[str, Any] | None = None) -> None:
    """End a running (or cancelling) run with its summary: cancelled if a cancel was
    requested, failed with ``error`` or when every trial failed, else succeeded. Caller
    holds the run lock."""
    trials = [
        _TrialFacts(group_id=g, actor_id=a, status=st, reward=r, error_type=e, task_version=_TaskName(name=n))
        for g, a, st, r, e, n in Trial.objects.filter(run_id=run.id).values_list(
            "group_id", "group__actor_id", "status", "reward", "error_type", "task_version__name"
        )
    ]
    summary = run_summarize(trials=trials, scored=run.kind != RunKind.EXECUTE)
    actors = RunSpec.objects.filter(run_id=run.id).values_list("actors", flat=True).first()
    if actors:
        summary["per_actor"] = actors_summarize(trials=trials, actors=actors)
    summary.update(extra_summary or {})
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


def run_complete(*, run_id: str, error: str = "", extra_summary: dict[str, Any] | None = None) -> bool:
    """End a run whose trials have all ended (a train run, by its learner): succeeded, or
    failed with ``error``; cancelled if a cancel was requested. False if already ended."""
    with transaction.atomic():
        run = Run.objects.select_for_update(no_key=True, of=("self",)).get(pk=run_id)
        if run.is_terminal:
            return False
        if run.trials.exclude(status__in=TRIAL_TERMINAL).exists():
            raise ValueError(f"run {run_id} still has trials running")
        run_finalize(run=run, error=error, extra_summary=extra_summary)
    return True


# --------------------------------------------------------------------------- cancel


def run_cancel_settle(*, run_id: str, batch_size: int | None = None, max_batches: int | None = None) -> bool:
    """Settle a cancelled run's trials that have not started, one short transaction per
    batch (bulk UPDATEs and bulk event inserts), and end the run once nothing of it is
    live. Running trials keep their leases: their holders learn of the cancel by heartbeat.
    True when nothing is left to settle; False when batches remain (call again)."""
    batch_size = batch_size or CANCEL_BATCH_SIZE
    done = 0
    while max_batches is None or done < max_batches:
        with transaction.atomic():
            run = Run.objects.select_for_update(no_key=True, of=("self",)).get(pk=run_id)
            if run.cancel_requested_at is None or run.is_terminal:
                return True
            if _trials_cancel_batch(run=run, limit=batch_size) < batch_size:
                run_end_if_idle(run=run)
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
