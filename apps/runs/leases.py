"""Leases: claims, heartbeats and the writes made under them, and the reaper.

A lease is one holder's right to a unit of a run's work: the whole run (``run``, through the
worker API) or one trial (``trial:<id>``, by a trials worker). Every lease is made by
`lease_create` with the next fence of its unit; every write under it checks, inside its
transaction, that the caller holds the active lease at that fence (a stale holder gets
StaleLease). Completion locks the run, then the lease, and moves both together.

A heartbeat takes no run lock: it is one conditional UPDATE of its lease, so it never waits
behind a cancel or a settlement of the run. The reaper expires a lease under that row's
lock, so the two cannot both win; what an expired or released lease held goes back (its
reservations are released, its trial requeued, lost or cancelled, its run queued again).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from apps.accounts.models import WorkerIdentity
from apps.core.errors import Conflict, NotFound, StaleLease, ValidationFailed
from apps.runs.dispatch import trials_enqueue
from apps.runs.events import event_append, events_append, run_locked
from apps.runs.models import (
    TRIAL_TERMINAL,
    GroupStatus,
    Lease,
    LeaseStatus,
    LeaseWrite,
    Run,
    RunStatus,
    Trial,
    TrialStatus,
)
from apps.runs.settlement import TrialOutcome, trial_cancel, trial_settle
from apps.runs.transitions import group_transition, lease_transition, run_transition, trial_transition

logger = logging.getLogger(__name__)

# Event types a worker may append through its lease; lifecycle events are the platform's.
WORKER_EVENT_PREFIXES = (
    "progress.",
    "group.",
    "trial.",
    "admission.",
    "artifact.",
    "log.",
)


def trial_unit(trial_id: str) -> str:
    return f"trial:{trial_id}"


def lease_ttl() -> timedelta:
    return timedelta(seconds=settings.SYNTH_LEASE_TTL_SECONDS)


def lease_create(*, run: Run, unit: str, worker: WorkerIdentity, now: datetime, fence: int | None = None) -> Lease:
    """A new active lease on the run's unit, at the unit's next fence (``fence``, when the
    caller has read the unit's latest lease under the run lock). Caller holds the run lock
    (the fence is read and used under it) and has ended the unit's previous lease."""
    if fence is None:
        fence = (Lease.objects.filter(run=run, unit=unit).aggregate(m=Max("fence"))["m"] or 0) + 1
    return Lease.objects.create(
        run=run, unit=unit, worker=worker, fence=fence, heartbeat_at=now, expires_at=now + lease_ttl()
    )


# --------------------------------------------------------------------------- claims


def lease_claim(*, worker: WorkerIdentity, unit: str = "run") -> Lease | None:
    """Claim the oldest queued run this worker may serve; None when there is none."""
    now = timezone.now()
    with transaction.atomic():
        candidates = Run.objects.filter(status=RunStatus.QUEUED)
        if worker.org_id is not None:
            candidates = candidates.filter(org_id=worker.org_id)
        # SKIP LOCKED: concurrent claimers take different runs instead of queueing behind
        # one another (a no-op on SQLite, where writers are serialized anyway).
        run = candidates.select_for_update(no_key=True, skip_locked=True).order_by("id").first()
        if run is None:
            return None
        lease = lease_create(run=run, unit=unit, worker=worker, now=now)
        first_start = run.started_at is None
        run_transition(
            run=run,
            to=RunStatus.RUNNING,
            source={RunStatus.QUEUED},
            event="lease.acquired",
            data={"lease": lease.id, "unit": unit, "fence": lease.fence, "worker": worker.name},
        )
        if first_start:
            event_append(run_id=run.id, type="run.started", data={})
    return lease


def trial_claim(*, worker: WorkerIdentity, trial_id: str, node_name: str) -> Lease | None:
    """Lease a trial for this worker, or None if it is settled or someone holds it."""
    claimed = trial_claim_read(worker=worker, trial_id=trial_id, node_name=node_name)
    return claimed[0] if claimed is not None else None


def trial_claim_read(
    *, worker: WorkerIdentity, trial_id: str, node_name: str, related: Sequence[str] = ()
) -> tuple[Lease, Trial] | None:
    """``trial_claim``, and the claimed trial as it now is, with its ``related`` rows read
    in the same statement (a worker's claim then needs no read of its own).

    The trial and its related rows are read before the run's lock (every trial transition
    of the run queues on that lock): none of what they hold changes while the trial waits to
    be claimed but its status, tries and queue time, which are read again under the lock."""
    now = timezone.now()
    trial = Trial.objects.select_related("group", "task_version", *related).filter(pk=trial_id).first()
    if trial is None or trial.is_terminal:
        return None
    with transaction.atomic():
        run = Run.objects.select_for_update(no_key=True, of=("self",)).select_related("spec").get(pk=trial.run_id)
        with run_locked(run_id=run.id):
            trial.status, trial.tries, trial.queued_at = (
                Trial.objects.select_for_update(no_key=True)
                .filter(pk=trial_id)
                .values_list("status", "tries", "queued_at")
                .get()
            )
            if trial.is_terminal:
                return None
            unit = trial_unit(trial.id)
            # The unit's latest lease: the only one that can be active (each is ended before the
            # next is made), and the fence the next one follows.
            latest = Lease.objects.select_for_update(no_key=True).filter(run=run, unit=unit).order_by("-fence").first()
            if latest is not None and latest.status == LeaseStatus.ACTIVE:
                if latest.expires_at > now:
                    return None  # a duplicate delivery: the holder is alive
                # Its holder vanished and the reaper has not come by yet: do its job for this lease.
                lease_lapse(run=run, lease=latest, now=now)
                trial.refresh_from_db(fields=["status", "tries", "queued_at"])
            if trial.status != TrialStatus.PENDING:
                return None
            if run.cancel_requested_at is not None or run.is_terminal:
                trial_cancel(run=run, trial=trial, why="the run was cancelled before this trial started")
                return None
            lease = lease_create(
                run=run, unit=unit, worker=worker, now=now, fence=(latest.fence if latest is not None else 0) + 1
            )
            trial_transition(
                trial=trial,
                to=TrialStatus.WAITING,
                source={TrialStatus.PENDING},
                event="trial.claimed",
                data={"lease": lease.id, "fence": lease.fence, "node": node_name, "tries": trial.tries + 1},
                # Values, not expressions: the row is locked and was read under the lock, and the
                # instance needs no read-back. A requeued trial taken by a duplicate message
                # counts as in flight again.
                values={"tries": trial.tries + 1, "worker_node": node_name, "queued_at": trial.queued_at or now},
            )
            if trial.group.status == GroupStatus.PENDING:
                group_transition(group=trial.group, to=GroupStatus.RUNNING, event="group.started")
    return lease, trial


# --------------------------------------------------------------------------- the holder's writes


def _locked_active_lease(
    *, lease_id: str, fence: int, worker: WorkerIdentity, run_id: str | None = None
) -> tuple[Run, Lease]:
    """Lock run then lease and check that the caller holds the active lease at `fence`.
    ``run_id``: the lease's run, when the caller has the lease (one read fewer; a lease
    never changes run or holder, and both are checked again under the lock)."""
    if run_id is None:
        run_id = Lease.objects.filter(pk=lease_id, worker=worker).values_list("run_id", flat=True).first()
        if run_id is None:
            raise NotFound(f"lease {lease_id} not found")
    run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
    return run, _active_lease_locked(lease_id=lease_id, fence=fence, worker=worker, run_id=run_id)


def _active_lease_locked(*, lease_id: str, fence: int, worker: WorkerIdentity, run_id: str) -> Lease:
    """Lock the lease and check that the caller holds it, active at ``fence``. Caller holds
    the lock of the lease's run."""
    lease = Lease.objects.select_for_update(no_key=True).filter(pk=lease_id).first()
    if lease is None or lease.worker_id != worker.pk or lease.run_id != run_id:
        raise NotFound(f"lease {lease_id} not found")
    _lease_check(lease=lease, fence=fence)
    return lease


def _lease_check(*, lease: Lease, fence: int) -> None:
    if lease.fence != fence:
        raise StaleLease(
            f"fence {fence} does not match lease {lease.id} (fence {lease.fence})",
            field="fence",
        )
    if lease.status != LeaseStatus.ACTIVE:
        raise StaleLease(f"lease {lease.id} is {lease.status}; a newer holder may own this work")
    if lease.expires_at <= timezone.now():
        raise StaleLease(f"lease {lease.id} expired at {lease.expires_at.isoformat()}")


@dataclass(frozen=True)
class HeartbeatResult:
    expires_at: Any
    cancel_requested: bool


def lease_heartbeat(*, worker: WorkerIdentity, lease_id: str, fence: int) -> HeartbeatResult:
    """Extend the caller's live lease. One conditional UPDATE of the lease row and no run
    lock: a heartbeat never queues behind a cancel or a settlement of the same run. The
    reaper expires a lease under that row's lock, so the two cannot both win."""
    now = timezone.now()
    expires_at = now + lease_ttl()
    extended = Lease.objects.filter(
        pk=lease_id, worker=worker, fence=fence, status=LeaseStatus.ACTIVE, expires_at__gt=now
    ).update(heartbeat_at=now, expires_at=expires_at)
    if not extended:
        lease = Lease.objects.filter(pk=lease_id, worker=worker).first()
        if lease is None:
            raise NotFound(f"lease {lease_id} not found")
        _lease_check(lease=lease, fence=fence)
        raise StaleLease(f"lease {lease.id} could not be extended")  # it changed between the two reads
    cancel_requested = Run.objects.filter(leases__pk=lease_id, cancel_requested_at__isnull=False).exists()
    return HeartbeatResult(expires_at=expires_at, cancel_requested=cancel_requested)


def lease_report(
    *,
    worker: WorkerIdentity,
    lease_id: str,
    fence: int,
    local_seq: int,
    events: list[dict[str, Any]],
) -> bool:
    """Apply a progress write under the lease. Returns False when (lease, local_seq) was
    already applied: a retried write is acknowledged, not repeated."""
    for i, event in enumerate(events):
        etype = event.get("type") if isinstance(event, dict) else None
        if not isinstance(etype, str) or not etype.startswith(WORKER_EVENT_PREFIXES):
            raise ValidationFailed(
                f"events[{i}].type must start with one of {', '.join(WORKER_EVENT_PREFIXES)}",
                field=f"events[{i}].type",
            )
        if not isinstance(event.get("data", {}), dict):
            raise ValidationFailed(f"events[{i}].data must be an object", field=f"events[{i}].data")
    with transaction.atomic():
        run, lease = _locked_active_lease(lease_id=lease_id, fence=fence, worker=worker)
        if LeaseWrite.objects.filter(lease=lease, local_seq=local_seq).exists():
            return False
        LeaseWrite.objects.create(lease=lease, local_seq=local_seq)
        # One statement for the whole burst (apps.runs.events).
        events_append(run_id=run.id, events=[(event["type"], event.get("data") or {}) for event in events])
    return True


def lease_complete(
    *,
    worker: WorkerIdentity,
    lease_id: str,
    fence: int,
    outcome: str,
    summary: dict[str, Any] | None = None,
    error: str = "",
) -> Run:
    """End the run under its active lease: both move together in one transaction."""
    if outcome not in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED):
        raise ValidationFailed("outcome must be succeeded, failed or cancelled", field="outcome")
    with transaction.atomic():
        run, lease = _locked_active_lease(lease_id=lease_id, fence=fence, worker=worker)
        if lease.unit.startswith("trial:"):
            raise Conflict(f"lease {lease.id} holds one trial: it ends with that trial, not with the run")
        lease_transition(lease=lease, to=LeaseStatus.COMPLETED, event="lease.completed")
        summary = summary or {}
        run_transition(
            run=run,
            to=outcome,
            source={RunStatus.RUNNING, RunStatus.CANCELLING},
            event=f"run.{outcome}",
            data={"summary": summary, "error": error or None},
            values={"summary": summary, "error": error},
        )
    return run


def lease_release(*, worker: WorkerIdentity, lease_id: str, fence: int, reason: str = "") -> Run:
    """Give the work back (e.g. a worker shutting down): the run is queued again."""
    with transaction.atomic():
        run, lease = _locked_active_lease(lease_id=lease_id, fence=fence, worker=worker)
        lease_transition(lease=lease, to=LeaseStatus.RELEASED, event="lease.released", data={"reason": reason})
        _work_return(run=run, lease=lease, why="its lease was released")
    return run


def trial_mark_running(
    *,
    worker: WorkerIdentity,
    lease: Lease,
    trial_id: str,
    data: dict[str, Any],
    events: Sequence[tuple[str, dict[str, Any]]] = (),
    trial: Trial | None = None,
) -> None:
    """The trial's attempt starts (admitted on its node) under the caller's lease; ``events``
    (the worker's own, e.g. its admission grant) are appended before the start, in the same
    transaction: the slot the grant freed is not idle for their round trips. ``trial``: the
    trial as the caller read it under this lease (its claim), not read again: the move
    itself checks that it is still waiting to start.

    In the caller's transaction without a savepoint (the grant's, which it belongs to: an
    error here undoes the grant too)."""
    for etype, _ in events:
        if not etype.startswith(WORKER_EVENT_PREFIXES):
            raise ValidationFailed(f"event type {etype} is not a worker's", field="events")
    with transaction.atomic(savepoint=False), run_locked(run_id=lease.run_id, lock=True):
        _active_lease_locked(lease_id=lease.id, fence=lease.fence, worker=worker, run_id=lease.run_id)
        events_append(run_id=lease.run_id, events=list(events))
        if trial is None:
            trial = Trial.objects.select_for_update(no_key=True).get(pk=trial_id)
        if not trial_transition(
            trial=trial,
            to=TrialStatus.RUNNING,
            source={TrialStatus.WAITING},
            event="trial.started",
            data=data,
            values={"need": data.get("need", {})},
        ):
            status = Trial.objects.filter(pk=trial_id).values_list("status", flat=True).first()
            raise StaleLease(f"trial {trial_id} is {status}, not waiting to start")


def trial_complete(
    *, worker: WorkerIdentity, lease: Lease, trial_id: str, outcome: TrialOutcome, trial: Trial | None = None
) -> None:
    """Record a trial's end under its lease; settle its group and the run when they end.
    The lease's reservations are released in the same transaction. ``trial``: the trial as
    the caller read it under this lease, with its task version (not read again: the move
    itself only ends a trial that has not ended)."""
    from apps.trials.admission import reservations_release

    with transaction.atomic():
        run, locked = _locked_active_lease(lease_id=lease.id, fence=lease.fence, worker=worker, run_id=lease.run_id)
        with run_locked(run_id=run.id):
            lease_transition(lease=locked, to=LeaseStatus.COMPLETED, event="lease.completed")
            reservations_release(lease=locked, why="its trial ended")
            if trial is None:
                trial = (
                    Trial.objects.select_for_update(no_key=True, of=("self",))
                    .select_related("task_version")
                    .get(pk=trial_id)
                )
            if not trial_settle(
                run=run,
                trial=trial,
                status=outcome.status,
                rewards=outcome.rewards,
                error_type=outcome.error_type,
                error_message=outcome.error_message,
                timings=outcome.timings,
            ):
                # Not moved: it ended already (a cancel), and then the lease ends with it; or
                # the outcome is not one it can have from where it is (a trial never started
                # cannot succeed), and then nothing changes: the lease ended alone would
                # leave the trial live with no holder, which nothing hands out again.
                status = Trial.objects.filter(pk=trial_id).values_list("status", flat=True).get()
                if status not in TRIAL_TERMINAL:
                    raise Conflict(f"trial {trial_id} is {status}: it cannot end as {outcome.status}")
    # The next trials are handed over once the end has committed (at once, or when a caller's
    # transaction does): its release and the NOTIFY that wakes a waiting trial are not held
    # back by the hand-over's work under the run's lock.
    transaction.on_commit(lambda: trials_enqueue(run_id=run.id))


# --------------------------------------------------------------------------- lapse and reaper


def _work_return(*, run: Run, lease: Lease, why: str) -> None:
    """What a lease held goes back when the lease ends without an outcome: its reservations
    are released, a trial is requeued (or lost, or cancelled), a whole run queued again."""
    from apps.trials.admission import reservations_release

    reservations_release(lease=lease, why=why)
    if lease.unit.startswith("trial:"):
        trial_lease_lapsed(run=run, lease=lease)
    else:
        _return_to_queue(run=run)


def _return_to_queue(*, run: Run) -> None:
    """A whole-run lease ended without an outcome: queue the run again, or end it if a
    cancel was requested meanwhile. Caller holds the run lock."""
    if run.cancel_requested_at is not None:
        run_transition(
            run=run,
            to=RunStatus.CANCELLED,
            source={RunStatus.CANCELLING},
            event="run.cancelled",
            data={"reason": "cancelled while its holder was gone"},
        )
    else:
        run_transition(run=run, to=RunStatus.QUEUED, source={RunStatus.RUNNING}, event="run.requeued")


def trial_lease_lapsed(*, run: Run, lease: Lease) -> bool:
    """The reaper's decision for a trial whose worker vanished: run it again (the plan's
    on_lost/max_retries) or mark it lost. Caller holds the run and lease locks."""
    trial = (
        Trial.objects.select_for_update(no_key=True, of=("self",))
        .select_related("task_version")
        .get(pk=lease.unit.removeprefix("trial:"))
    )
    if trial.is_terminal:
        return False
    plan = run.spec.plan
    if run.cancel_requested_at is not None:
        trial_cancel(run=run, trial=trial, why="the run was cancelled while this trial's worker was gone")
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
    trial_settle(
        run=run,
        trial=trial,
        status=TrialStatus.LOST,
        error_type="WorkerLost",
        error_message=f"its worker stopped heartbeating (after {trial.tries} tries)",
    )
    return False


def lease_lapse(*, run: Run, lease: Lease, now: Any) -> bool:
    """Expire a lapsed lease with what it held, in the caller's transaction: its
    reservations are released, and its work is requeued, lost or cancelled. False if the
    lease was not lapsed (its holder heartbeated or ended it meanwhile). Caller holds the
    run and lease locks."""
    if not lease_transition(
        lease=lease,
        to=LeaseStatus.EXPIRED,
        event="lease.expired",
        data={"reason": "no heartbeat"},
        where={"expires_at__lte": now},
    ):
        return False
    _work_return(run=run, lease=lease, why="its lease expired")
    return True


def leases_reap(*, now: Any = None, limit: int = 500) -> list[tuple[str, str]]:
    """Expire lapsed leases and return their work to the queue; returns the (run, lease)
    pairs reaped. Safe to run concurrently (each lease is re-checked under its lock)."""
    now = now or timezone.now()
    reaped = []
    lapsed = list(
        Lease.objects.filter(status=LeaseStatus.ACTIVE, expires_at__lte=now)
        .order_by("expires_at")
        .values_list("id", "run_id")[:limit]
    )
    for lease_id, run_id in lapsed:
        with transaction.atomic():
            run = Run.objects.select_for_update(no_key=True, of=("self",)).select_related("spec").get(pk=run_id)
            lease = Lease.objects.select_for_update(no_key=True).get(pk=lease_id)
            if lease_lapse(run=run, lease=lease, now=now):
                reaped.append((run_id, lease_id))
    if reaped:
        logger.info("reaped %d lapsed leases", len(reaped))
    return reaped


def lease_reap(*, now: Any = None) -> int:
    return len(leases_reap(now=now))
