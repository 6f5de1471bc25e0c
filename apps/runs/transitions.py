"""Status moves of runs, leases, trials, sampling groups and reservations.

One table of allowed moves and one transition function per record. Each move is a claim
(a conditional UPDATE, see apps.core.transitions) and writes its event in the same
transaction; a move that is not allowed from where the record is changes nothing and
returns False. Nothing else in the code assigns a status.

Lock order (as in apps.runs.services): the run row first, then its leases, trials, groups
and reservations. A transition of a run's record locks the run row before it claims the
record (a no-op when the caller holds it already, which most do).

Row locks of runs, leases, trials, groups, reservations' nodes and trainers are FOR NO KEY
UPDATE (``select_for_update(no_key=True)``), never FOR UPDATE: they
exclude each other and every UPDATE of the row as FOR UPDATE does, but not the KEY SHARE
lock a foreign-key check takes. So the insert of a row that refers to a locked one (a
trial's artifact or reservation, a lease, another transaction's event) does not wait for
that lock's transaction. Nothing deletes these rows or changes their keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.db import models, transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.core.transitions import TransitionTable
from apps.runs.events import event_append, events_append, run_row_lock
from apps.runs.models import (
    TERMINAL_STATUSES,
    TRIAL_TERMINAL,
    GroupStatus,
    Lease,
    LeaseStatus,
    Reservation,
    ReservationStatus,
    Run,
    RunStatus,
    SamplingGroup,
    Trial,
    TrialStatus,
)

RUN_TRANSITIONS = TransitionTable(
    model=Run,
    moves={
        RunStatus.ACCEPTED: {RunStatus.QUEUED, RunStatus.FAILED, RunStatus.CANCELLED},
        RunStatus.QUEUED: {RunStatus.RUNNING, RunStatus.FAILED, RunStatus.CANCELLED},
        # Back to queued: a whole-run lease was released or lapsed.
        RunStatus.RUNNING: {
            RunStatus.QUEUED,
            RunStatus.CANCELLING,
            RunStatus.SUCCEEDED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
        },
        # A holder may still report the outcome it reached before it learned of the cancel.
        RunStatus.CANCELLING: {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED},
    },
)

LEASE_TRANSITIONS = TransitionTable(
    model=Lease,
    moves={LeaseStatus.ACTIVE: {LeaseStatus.COMPLETED, LeaseStatus.RELEASED, LeaseStatus.EXPIRED}},
)

TRIAL_TRANSITIONS = TransitionTable(
    model=Trial,
    moves={
        # Claimed under a lease, or cancelled before any worker took it.
        TrialStatus.PENDING: {TrialStatus.WAITING, TrialStatus.CANCELLED},
        # Waiting for resources: it may fail (never fits), be cancelled or lose its worker.
        TrialStatus.WAITING: {
            TrialStatus.RUNNING,
            TrialStatus.PENDING,
            TrialStatus.FAILED,
            TrialStatus.CANCELLED,
            TrialStatus.LOST,
        },
        # Back to pending: its worker vanished and the plan retries.
        TrialStatus.RUNNING: {
            TrialStatus.PENDING,
            TrialStatus.SUCCEEDED,
            TrialStatus.FAILED,
            TrialStatus.CANCELLED,
            TrialStatus.LOST,
        },
    },
)

GROUP_TRANSITIONS = TransitionTable(
    model=SamplingGroup,
    moves={
        GroupStatus.PENDING: {GroupStatus.RUNNING, GroupStatus.SETTLED},
        GroupStatus.RUNNING: {GroupStatus.SETTLED},
    },
)

RESERVATION_TRANSITIONS = TransitionTable(
    model=Reservation,
    moves={
        ReservationStatus.WAITING: {ReservationStatus.HELD, ReservationStatus.RELEASED},
        ReservationStatus.HELD: {ReservationStatus.RELEASED},
    },
)


def _record(
    *,
    table: TransitionTable,
    run_id: str,
    obj: models.Model,
    to: str,
    event: str,
    data: dict[str, Any],
    source: Iterable[str] | None,
    values: Mapping[str, Any],
    where: Mapping[str, Any] | None = None,
) -> bool:
    # No savepoint of its own inside the caller's transaction (two round trips under the
    # run's lock, several times a trial): an error here fails that transaction, whose writes
    # before this move could not stand without it anyway.
    with transaction.atomic(savepoint=False):
        run_row_lock(run_id=run_id)
        if not table.claim(pk=obj.pk, to=to, source=source, values=values, where=where, instance=obj):
            return False
        event_append(run_id=run_id, type=event, data=data)
    return True


# --------------------------------------------------------------------------- run


def run_transition(
    *,
    run: Run | str,
    to: str,
    event: str,
    data: dict[str, Any] | None = None,
    source: Iterable[str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> bool:
    """Move a run and append ``event``. Sets finished_at on an ending, started_at on the
    first start; ``run`` (an instance) is updated in memory when the move happens."""
    now = timezone.now()
    changes: dict[str, Any] = {"updated_at": now, **(values or {})}
    if to in TERMINAL_STATUSES:
        changes.setdefault("finished_at", now)
    if to == RunStatus.RUNNING:
        changes.setdefault("started_at", Coalesce(F("started_at"), Value(now, output_field=models.DateTimeField())))
    instance = run if isinstance(run, Run) else None
    run_id = instance.pk if instance is not None else run
    with transaction.atomic():
        if not RUN_TRANSITIONS.claim(pk=run_id, to=to, source=source, values=changes, instance=instance):
            return False
        event_append(run_id=run_id, type=event, data=data or {})
    return True


# --------------------------------------------------------------------------- lease


def lease_transition(
    *,
    lease: Lease,
    to: str,
    event: str,
    data: dict[str, Any] | None = None,
    where: Mapping[str, Any] | None = None,
) -> bool:
    """End a lease (completed, released, expired) and append ``event`` on its run."""
    return _record(
        table=LEASE_TRANSITIONS,
        run_id=lease.run_id,
        obj=lease,
        to=to,
        event=event,
        data={"lease": lease.id, "unit": lease.unit, "fence": lease.fence, **(data or {})},
        source=None,
        values={"ended_at": timezone.now()},
        where=where,
    )


# --------------------------------------------------------------------------- trial


def _trial_values(*, to: str, values: Mapping[str, Any] | None) -> dict[str, Any]:
    now = timezone.now()
    changes = dict(values or {})
    if to in TRIAL_TERMINAL:
        changes.setdefault("finished_at", now)
    elif to == TrialStatus.RUNNING:
        changes.setdefault("started_at", now)
    return changes


def trial_transition(
    *,
    trial: Trial,
    to: str,
    event: str,
    data: dict[str, Any] | None = None,
    source: Iterable[str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> bool:
    """Move a trial and append ``event`` (its data always names the trial)."""
    return _record(
        table=TRIAL_TRANSITIONS,
        run_id=trial.run_id,
        obj=trial,
        to=to,
        event=event,
        data={"trial": trial.id, **(data or {})},
        source=source,
        values=_trial_values(to=to, values=values),
    )


def trials_transition(
    *,
    run_id: str,
    trial_ids: Iterable[str],
    to: str,
    event: str,
    data: Callable[[str], dict[str, Any]],
    source: Iterable[str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> list[str]:
    """Move many trials of one run with one UPDATE and one bulk insert of their events
    (``data(trial_id)`` each). Returns the ids that moved."""
    sources = TRIAL_TRANSITIONS.sources_of(to=to, source=source)
    with transaction.atomic():
        run_row_lock(run_id=run_id)
        moving = list(
            Trial.objects.select_for_update(no_key=True)
            .filter(run_id=run_id, pk__in=list(trial_ids), status__in=sources)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        if not moving:
            return []
        TRIAL_TRANSITIONS.claim_many(pks=moving, to=to, source=sources, values=_trial_values(to=to, values=values))
        events_append(run_id=run_id, events=[(event, {"trial": pk, **data(pk)}) for pk in moving])
    return moving


# --------------------------------------------------------------------------- group


def group_transition(
    *,
    group: SamplingGroup,
    to: str,
    event: str,
    data: dict[str, Any] | None = None,
    values: Mapping[str, Any] | None = None,
) -> bool:
    changes = dict(values or {})
    if to == GroupStatus.SETTLED:
        changes.setdefault("settled_at", timezone.now())
    return _record(
        table=GROUP_TRANSITIONS,
        run_id=group.run_id,
        obj=group,
        to=to,
        event=event,
        data={"group": group.id, **(data or {})},
        source=None,
        values=changes,
    )


# Groups per UPDATE of groups_settle (its CASE has a branch for each).
_SETTLE_BATCH = 500


def groups_settle(*, run_id: str, summaries: Mapping[str, dict[str, Any]]) -> dict[str, int]:
    """Settle many groups of one run at once (their summaries given), each with its
    ``group.settled`` event; returns the groups that moved, with their steps. In the
    caller's transaction without a savepoint of its own, as ``_record``."""
    sources = GROUP_TRANSITIONS.sources_of(to=GroupStatus.SETTLED)
    with transaction.atomic(savepoint=False):
        run_row_lock(run_id=run_id)
        moving = dict(
            SamplingGroup.objects.select_for_update(no_key=True)
            .filter(run_id=run_id, pk__in=list(summaries), status__in=sources)
            .order_by("pk")
            .values_list("pk", "step")
        )
        if not moving:
            return {}
        now = timezone.now()
        summary = SamplingGroup._meta.get_field("summary")
        ordered = list(moving)
        for i in range(0, len(ordered), _SETTLE_BATCH):
            pks = ordered[i : i + _SETTLE_BATCH]
            # The status, its time and each group's summary in one UPDATE (a CASE by key).
            GROUP_TRANSITIONS.claim_many(
                pks=pks,
                to=GroupStatus.SETTLED,
                values={
                    "settled_at": now,
                    "summary": Case(
                        *(When(pk=pk, then=Value(summaries[pk], output_field=summary)) for pk in pks),
                        output_field=summary,
                    ),
                },
            )
        events_append(run_id=run_id, events=[("group.settled", {"group": pk, **summaries[pk]}) for pk in moving])
    return moving


# --------------------------------------------------------------------------- reservation


def reservation_transition(*, reservation: Reservation, to: str, why: str = "", run_id: str | None = None) -> bool:
    """Grant (held) or release a reservation, with ``reservation.held`` / ``.released`` on
    its trial's run (``run_id``, when the caller knows it: one read fewer)."""
    if run_id is None:
        run_id = Trial.objects.filter(pk=reservation.trial_id).values_list("run_id", flat=True).get()
    values = {"granted_at": timezone.now()} if to == ReservationStatus.HELD else {"released_at": timezone.now()}
    data: dict[str, Any] = {"reservation": reservation.pk, "trial": reservation.trial_id, "node": reservation.node_id}
    if why:
        data["why"] = why
    return _record(
        table=RESERVATION_TRANSITIONS,
        run_id=run_id,
        obj=reservation,
        to=to,
        event=f"reservation.{to}",
        data=data,
        source=None,
        values=values,
    )
