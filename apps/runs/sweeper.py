"""The sweeper: one beat task that re-drives what a lost message or a dead process left behind.

Every piece of work the control plane hands to a queue is also visible in the database as
a state that should not last: an accepted run is scheduled within seconds, a queued run is
expanded, a queued trial is claimed, a settled trial settles its group, and so on. A tick
looks for such states older than a grace period (longer than the message normally takes),
does again what the message would have done (the services are state-guarded, so doing it
twice is harmless), and writes a ``sweep.redriven`` event saying what and why on each run it
touched. A second tick then finds nothing. Each kind of work is bounded per tick.

How "the message was lost" is known, kind by kind:

* accepted runs: still accepted ``SYNTH_SWEEP_GRACE_SECONDS`` after admission;
* queued runs: queued that long with no trial made and no lease held;
* trials: pending ``SYNTH_SWEEP_TRIAL_GRACE_SECONDS`` after they were handed to the trials
  queue (``queued_at``): a delivered message claims the trial (pending -> waiting) at once,
  so a pending trial that old was never delivered. Handing it over again is harmless: a
  duplicate delivery finds it claimed or ended. Trials never handed over (their run's
  enqueue chain broke) are handed over when their run has room;
* cancelled runs whose not-started trials are still pending after the grace period;
* groups whose trials have all ended but which are not settled, and runs whose trials and
  leases have all ended but which are not finished (no grace: these never last);
* reservations whose lease ended or whose trial ended, on any node.

Leases whose holder stopped heartbeating are reaped first (apps.runs.leases.leases_reap);
apps built on runs (training) add their own re-drives through ``signals.sweep_tick``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from apps.runs import signals
from apps.runs.dispatch import run_dispatch, trials_enqueue
from apps.runs.events import event_append, event_append_alone
from apps.runs.leases import leases_reap
from apps.runs.models import (
    TRIAL_TERMINAL,
    GroupStatus,
    Lease,
    LeaseStatus,
    Reservation,
    ReservationStatus,
    Run,
    RunKind,
    RunStatus,
    SamplingGroup,
    Trial,
    TrialStatus,
)
from apps.runs.services import run_schedule
from apps.runs.settlement import LIVE_TRIAL, groups_settle_ended, run_cancel_settle, run_end_if_idle

logger = logging.getLogger(__name__)

# Expanding a run is the heaviest re-drive: fewer of them per tick.
DISPATCHES_PER_TICK = 10


def sweep_note(*, run_id: str, action: str, why: str, ids: list[str] | None = None) -> None:
    """The sweeper's event on a run it touched: what it did, to what, and why."""
    data: dict[str, Any] = {"action": action, "why": why}
    if ids is not None:
        data["count"] = len(ids)
        data["ids"] = ids[:50]
    if transaction.get_connection().in_atomic_block:  # noted with the re-drive's writes
        event_append(run_id=run_id, type="sweep.redriven", data=data)
    else:
        event_append_alone(run_id=run_id, type="sweep.redriven", data=data)


def _noted(*, run_id: str, action: str, why: str, redrive: Callable[[], bool]) -> bool:
    """Note, then re-drive, in one transaction (the note comes before the events the re-drive
    writes, e.g. the run's last one); both are rolled back if it did nothing."""
    with transaction.atomic():
        sweep_note(run_id=run_id, action=action, why=why)
        if redrive():
            return True
        transaction.set_rollback(True)
    return False


def _grace() -> timedelta:
    return timedelta(seconds=settings.SYNTH_SWEEP_GRACE_SECONDS)


def _each(*, counts: dict[str, int], what: str, items: list[Any], redrive: Callable[[Any], int]) -> None:
    """Re-drive each item (``redrive`` returns how many records it moved); one that fails
    is logged and left for the next tick, the rest go on."""
    for item in items:
        try:
            moved = int(redrive(item))
            if moved:
                counts[what] = counts.get(what, 0) + moved
        except Exception:
            logger.exception("sweep: %s of %s failed", what, item)
            counts["errors"] = counts.get("errors", 0) + 1


def sweep_tick(*, now: datetime | None = None, limit: int | None = None) -> dict[str, int]:
    """One pass of the sweeper; returns {what: count} of what it re-drove."""
    now = now or timezone.now()
    limit = limit or settings.SYNTH_SWEEP_BATCH
    counts: dict[str, int] = {}
    _leases(counts=counts, now=now, limit=limit)
    _reservations(counts=counts, limit=limit)
    _runs_accepted(counts=counts, now=now, limit=limit)
    _runs_queued(counts=counts, now=now, limit=min(limit, DISPATCHES_PER_TICK))
    _runs_cancelling(counts=counts, now=now, limit=limit)
    _trials_lost_messages(counts=counts, now=now, limit=limit)
    _trials_never_handed_over(counts=counts, limit=limit)
    _groups_ended(counts=counts, limit=limit)
    _runs_ended(counts=counts, limit=limit)
    for _receiver, result in signals.sweep_tick.send_robust(sender=Run, now=now, limit=limit):
        if isinstance(result, Exception):
            logger.error("sweep: a receiver failed: %r", result)
            counts["errors"] = counts.get("errors", 0) + 1
        else:
            for what, n in (result or {}).items():
                counts[what] = counts.get(what, 0) + n
    if counts:
        logger.info("sweep: %s", ", ".join(f"{what} {n}" for what, n in sorted(counts.items())))
    return counts


# --------------------------------------------------------------------------- dead processes


def _leases(*, counts: dict[str, int], now: datetime, limit: int) -> None:
    by_run: dict[str, list[str]] = defaultdict(list)
    for run_id, lease_id in leases_reap(now=now, limit=limit):
        by_run[run_id].append(lease_id)
    for run_id, ids in by_run.items():
        sweep_note(run_id=run_id, action="leases_expired", why="their holders stopped heartbeating", ids=ids)
    if by_run:
        counts["leases_expired"] = sum(len(ids) for ids in by_run.values())


def _reservations(*, counts: dict[str, int], limit: int) -> None:
    """Reservations still open although their lease or their trial has ended (a holder that
    died between ending its trial and releasing, a lease that ended outside the reaper)."""
    from apps.trials.admission import admission_release

    stale = list(
        Reservation.objects.filter(status__in=[ReservationStatus.WAITING, ReservationStatus.HELD])
        .filter(
            Q(lease__status__in=[LeaseStatus.COMPLETED, LeaseStatus.RELEASED, LeaseStatus.EXPIRED])
            | Q(trial__status__in=TRIAL_TERMINAL)
        )
        .select_related("trial")
        .order_by("pk")[:limit]
    )

    def release(reservation: Reservation) -> bool:
        return admission_release(reservation=reservation, why="its lease or trial had ended (sweep)")

    _each(counts=counts, what="reservations_released", items=stale, redrive=release)


# --------------------------------------------------------------------------- lost messages


def _runs_accepted(*, counts: dict[str, int], now: datetime, limit: int) -> None:
    stuck = list(
        Run.objects.filter(status=RunStatus.ACCEPTED, created_at__lt=now - _grace())
        .order_by("created_at")
        .values_list("pk", flat=True)[:limit]
    )

    def schedule(run_id: str) -> bool:
        return _noted(
            run_id=run_id,
            action="scheduled",
            why=f"accepted for over {_grace().seconds} s and never scheduled (its message was lost)",
            redrive=lambda: run_schedule(run_id=run_id).status != RunStatus.ACCEPTED,
        )

    _each(counts=counts, what="runs_scheduled", items=stuck, redrive=schedule)


def _runs_queued(*, counts: dict[str, int], now: datetime, limit: int) -> None:
    stuck = list(
        Run.objects.filter(status=RunStatus.QUEUED, updated_at__lt=now - _grace())
        .exclude(Exists(Trial.objects.filter(run=OuterRef("pk"))))
        .exclude(Exists(Lease.objects.filter(run=OuterRef("pk"), status=LeaseStatus.ACTIVE)))
        .order_by("updated_at")
        .values_list("pk", flat=True)[:limit]
    )

    def dispatch(run_id: str) -> bool:
        def redrive() -> bool:
            run_dispatch(run_id=run_id)
            return not Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).exists()

        return _noted(
            run_id=run_id,
            action="dispatched",
            why=f"queued for over {_grace().seconds} s and never expanded (its message was lost)",
            redrive=redrive,
        )

    _each(counts=counts, what="runs_dispatched", items=stuck, redrive=dispatch)


def _runs_cancelling(*, counts: dict[str, int], now: datetime, limit: int) -> None:
    stuck = list(
        Run.objects.filter(status=RunStatus.CANCELLING, cancel_requested_at__lt=now - _grace())
        .filter(Exists(Trial.objects.filter(run=OuterRef("pk"), status=TrialStatus.PENDING)))
        .order_by("cancel_requested_at")
        .values_list("pk", flat=True)[:limit]
    )

    def settle(run_id: str) -> int:
        pending = Trial.objects.filter(run_id=run_id, status=TrialStatus.PENDING).count()
        # Noted first (the run's last event may come from the settlement); batches are each
        # their own transaction, as in a cancel.
        sweep_note(
            run_id=run_id,
            action="cancel_continued",
            why=f"cancelled over {_grace().seconds} s ago with {pending} trials not yet settled "
            "(the cancel's message was lost)",
        )
        run_cancel_settle(run_id=run_id, max_batches=4)
        return pending - Trial.objects.filter(run_id=run_id, status=TrialStatus.PENDING).count()

    _each(counts=counts, what="trials_cancelled", items=stuck, redrive=settle)


def _trials_lost_messages(*, counts: dict[str, int], now: datetime, limit: int) -> None:
    """Pending trials handed to the trials queue long ago and never claimed: hand them over
    again (queued_at restarts, so each is handed over at most once per grace period)."""
    from apps.trials.tasks import trial_execute_task

    grace = timedelta(seconds=settings.SYNTH_SWEEP_TRIAL_GRACE_SECONDS)
    cutoff = now - grace
    stale = list(
        Trial.objects.filter(status=TrialStatus.PENDING, queued_at__lt=cutoff, run__status=RunStatus.RUNNING)
        .order_by("queued_at")
        .values_list("run_id", "pk")[:limit]
    )
    by_run: dict[str, list[str]] = defaultdict(list)
    for run_id, trial_id in stale:
        by_run[run_id].append(trial_id)

    def requeue(run_id: str) -> int:
        with transaction.atomic():
            list(Run.objects.select_for_update(no_key=True).filter(pk=run_id).values_list("pk", flat=True))
            ids = list(
                Trial.objects.filter(pk__in=by_run[run_id], status=TrialStatus.PENDING, queued_at__lt=cutoff)
                .order_by("pk")
                .values_list("pk", flat=True)
            )
            if not ids:
                return 0
            Trial.objects.filter(pk__in=ids).update(queued_at=timezone.now())
            event_append(
                run_id=run_id,
                type="sweep.redriven",
                data={
                    "action": "trials_requeued",
                    "why": f"handed to the trials queue over {grace.seconds} s ago and never claimed "
                    "(the message was lost)",
                    "count": len(ids),
                    "ids": ids[:50],
                },
            )
            transaction.on_commit(lambda: [trial_execute_task.delay(tid) for tid in ids])
        return len(ids)

    _each(counts=counts, what="trials_requeued", items=list(by_run), redrive=requeue)


def _trials_never_handed_over(*, counts: dict[str, int], limit: int) -> None:
    """Running runs with trials never handed over while they have room: the enqueue that
    follows a trial's end (or requeue) was lost with its process."""
    candidates = list(
        Run.objects.filter(status=RunStatus.RUNNING)
        .filter(Exists(Trial.objects.filter(run=OuterRef("pk"), status=TrialStatus.PENDING, queued_at__isnull=True)))
        .order_by("updated_at")
        .values_list("pk", flat=True)[:limit]
    )

    def enqueue(run_id: str) -> int:
        with transaction.atomic():
            ids = trials_enqueue(run_id=run_id)
            if ids:  # none when at capacity: the trials in flight hand over the rest
                sweep_note(
                    run_id=run_id,
                    action="trials_handed_over",
                    why="the run had room for more trials and nothing was handing them over",
                    ids=ids,
                )
        return len(ids)

    _each(counts=counts, what="trials_handed_over", items=candidates, redrive=enqueue)


# --------------------------------------------------------------------------- unfinished settlements


def _groups_ended(*, counts: dict[str, int], limit: int) -> None:
    stuck = list(
        SamplingGroup.objects.filter(status__in=[GroupStatus.PENDING, GroupStatus.RUNNING])
        .filter(Exists(Trial.objects.filter(group=OuterRef("pk"))))
        .exclude(Exists(Trial.objects.filter(group=OuterRef("pk"), status__in=LIVE_TRIAL)))
        .order_by("pk")
        .values_list("run_id", "pk")[:limit]
    )
    by_run: dict[str, list[str]] = defaultdict(list)
    for run_id, group_id in stuck:
        by_run[run_id].append(group_id)

    def settle(run_id: str) -> int:
        with transaction.atomic():
            run = Run.objects.select_for_update(no_key=True, of=("self",)).get(pk=run_id)
            settled = groups_settle_ended(run=run, group_ids=by_run[run_id])
            if not settled:
                return 0
            event_append(
                run_id=run_id,
                type="sweep.redriven",
                data={
                    "action": "groups_settled",
                    "why": "every trial of these groups had ended but the groups were not settled",
                    "count": len(settled),
                    "ids": settled[:50],
                },
            )
        return len(settled)

    _each(counts=counts, what="groups_settled", items=list(by_run), redrive=settle)


def _runs_ended(*, counts: dict[str, int], limit: int) -> None:
    stuck = list(
        Run.objects.filter(status__in=[RunStatus.RUNNING, RunStatus.CANCELLING])
        # A running train run ends when its learner says so (the training sweep covers it).
        .filter(~Q(kind=RunKind.TRAIN) | Q(cancel_requested_at__isnull=False))
        .filter(Q(Exists(SamplingGroup.objects.filter(run=OuterRef("pk")))) | Q(cancel_requested_at__isnull=False))
        .exclude(Exists(Trial.objects.filter(run=OuterRef("pk"), status__in=LIVE_TRIAL)))
        .exclude(Exists(Lease.objects.filter(run=OuterRef("pk"), status=LeaseStatus.ACTIVE)))
        .order_by("updated_at")
        .values_list("pk", flat=True)[:limit]
    )

    def finish(run_id: str) -> bool:
        def redrive() -> bool:
            return run_end_if_idle(run=Run.objects.select_for_update(no_key=True, of=("self",)).get(pk=run_id))

        return _noted(
            run_id=run_id,
            action="finished",
            why="every trial and lease of the run had ended but it was not finished",
            redrive=redrive,
        )

    _each(counts=counts, what="runs_finished", items=stuck, redrive=finish)
