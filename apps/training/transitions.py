"""How trainers and learning updates move between states, each move with its run event."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.core.transitions import TransitionTable
from apps.runs.models import Run
from apps.runs.services import event_append
from apps.training.models import LearningUpdate, Trainer, TrainerStatus, UpdateStatus

TRAINER_TRANSITIONS = TransitionTable(
    model=Trainer,
    moves={
        TrainerStatus.SAMPLING: {TrainerStatus.UPDATING, TrainerStatus.DONE, TrainerStatus.FAILED},
        TrainerStatus.UPDATING: {
            TrainerStatus.SAMPLING,
            TrainerStatus.DONE,
            TrainerStatus.FAILED,
            TrainerStatus.BLOCKED,
        },
    },
)

UPDATE_TRANSITIONS = TransitionTable(
    model=LearningUpdate,
    moves={
        UpdateStatus.PENDING: {UpdateStatus.UNRESOLVED, UpdateStatus.SKIPPED, UpdateStatus.FAILED},
        # An unresolved update that cannot be confirmed stays unresolved: its trainer blocks.
        UpdateStatus.UNRESOLVED: {UpdateStatus.APPLIED},
    },
)

UPDATE_ENDED = (UpdateStatus.APPLIED, UpdateStatus.SKIPPED, UpdateStatus.FAILED)


def trainer_transition(*, trainer: Trainer, to: str, event: str, data: dict[str, Any] | None = None) -> bool:
    """Move a trainer and append ``event`` on its run, in one transaction."""
    with transaction.atomic():
        list(Run.objects.select_for_update(no_key=True).filter(pk=trainer.run_id).values_list("pk", flat=True))
        if not TRAINER_TRANSITIONS.claim(pk=trainer.pk, to=to, values={"updated_at": timezone.now()}, instance=trainer):
            return False
        event_append(run_id=trainer.run_id, type=event, data={"step": trainer.step, **(data or {})})
    return True


def update_transition(
    *,
    update: LearningUpdate,
    to: str,
    event: str,
    data: dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
    holder: str | None = None,
) -> bool:
    """Move a learning update and append ``event`` on its run, in one transaction. With
    ``holder``, only while that process still holds the update (not taken over)."""
    changes = dict(values or {})
    if to in UPDATE_ENDED:
        changes.setdefault("finished_at", timezone.now())
    with transaction.atomic():
        list(Run.objects.select_for_update(no_key=True).filter(pk=update.run_id).values_list("pk", flat=True))
        if not UPDATE_TRANSITIONS.claim(
            pk=update.pk,
            to=to,
            values=changes,
            where={"holder": holder} if holder is not None else None,
            instance=update,
        ):
            return False
        event_append(run_id=update.run_id, type=event, data={"step": update.step, "update": update.id, **(data or {})})
    return True
