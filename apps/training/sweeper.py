"""The learner's part of the sweeper's tick (apps.runs.sweeper): what lost messages and
dead training workers left behind is driven again."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from apps.runs.models import GroupStatus, Run, RunKind, RunStatus, SamplingGroup
from apps.runs.sweeper import sweep_note
from apps.training.models import LearningUpdate, Trainer, TrainerStatus, UpdateStatus
from apps.training.services import step_settled, training_start
from apps.training.updates import holder_gone, update_fail, update_ttl

logger = logging.getLogger(__name__)


def training_sweep(*, now: datetime, limit: int) -> dict[str, int]:
    """The learner's part of the sweeper's tick (see apps.runs.sweeper): train runs whose
    start or step message was lost, and learning updates whose worker is gone."""
    counts: dict[str, int] = {}
    grace = timedelta(seconds=settings.SYNTH_SWEEP_GRACE_SECONDS)
    queue_grace = timedelta(seconds=settings.SYNTH_SWEEP_TRIAL_GRACE_SECONDS)
    for what, redrive in (
        ("training_started", lambda: _sweep_unstarted(now=now, grace=grace, limit=limit)),
        ("steps_settled", lambda: _sweep_unsettled_steps(now=now, grace=grace, limit=limit)),
        ("updates_blocked", lambda: _sweep_dead_updates(now=now, limit=limit)),
        # Updates queue behind other runs' on the one training worker: the longer grace.
        ("updates_requeued", lambda: _sweep_unheld_updates(now=now, grace=queue_grace, limit=limit)),
    ):
        try:
            moved = redrive()
        except Exception:
            logger.exception("training sweep: %s failed", what)
            counts["errors"] = counts.get("errors", 0) + 1
            continue
        if moved:
            counts[what] = moved
    return counts


def _sweep_unstarted(*, now: datetime, grace: timedelta, limit: int) -> int:
    runs = list(
        Run.objects.filter(kind=RunKind.TRAIN, status=RunStatus.RUNNING, updated_at__lt=now - grace)
        .exclude(Exists(Trainer.objects.filter(run=OuterRef("pk"))))
        .values_list("pk", flat=True)[:limit]
    )
    started = 0
    for run_id in runs:
        if training_start(run_id=run_id) is not None:
            sweep_note(
                run_id=run_id, action="training_started", why="started but its learner never set up (lost message)"
            )
            started += 1
    return started


def _sweep_unsettled_steps(*, now: datetime, grace: timedelta, limit: int) -> int:
    trainers = list(
        Trainer.objects.filter(status=TrainerStatus.SAMPLING, updated_at__lt=now - grace)
        .filter(Exists(SamplingGroup.objects.filter(run=OuterRef("run"), step=OuterRef("step"))))
        .exclude(
            Exists(
                SamplingGroup.objects.filter(run=OuterRef("run"), step=OuterRef("step")).exclude(
                    status=GroupStatus.SETTLED
                )
            )
        )
        .values_list("run_id", "step")[:limit]
    )
    moved = 0
    for run_id, step in trainers:
        if step_settled(run_id=run_id, step=step):
            sweep_note(
                run_id=run_id,
                action="step_settled",
                why=f"every group of step {step} had settled but the learner was not told (lost message)",
            )
            moved += 1
    return moved


def _sweep_dead_updates(*, now: datetime, limit: int) -> int:
    """Unresolved updates whose worker is gone: the optimizer step was in flight, so the
    weights are unknown. Block the run now, with the reason, instead of waiting for the
    broker to redeliver the message hours later."""
    candidates = list(
        LearningUpdate.objects.filter(status=UpdateStatus.UNRESOLVED)
        .filter(
            Exists(Trainer.objects.filter(run=OuterRef("run"), step=OuterRef("step"), status=TrainerStatus.UPDATING))
        )
        .order_by("pk")[:limit]
    )
    blocked = 0
    for update in candidates:
        if not holder_gone(update=update, now=now):
            continue
        seen = f"{int((now - update.heartbeat_at).total_seconds())} s ago" if update.heartbeat_at else "never"
        error = (
            f"the training worker applying step {update.step} ({update.holder or 'unknown'}) stopped heartbeating "
            f"(last heard {seen}) with its optimizer step in flight: the weights are unknown; continue from the "
            "last checkpoint with a new train run"
        )
        with transaction.atomic():
            # Under the run and trainer locks, so that two overlapping ticks block it once.
            list(Run.objects.select_for_update(no_key=True).filter(pk=update.run_id).values_list("pk", flat=True))
            trainer = Trainer.objects.select_for_update(no_key=True).get(run_id=update.run_id)
            if trainer.status != TrainerStatus.UPDATING or trainer.step != update.step:
                continue
            sweep_note(run_id=update.run_id, action="update_blocked", why=error)
            update_fail(update=update, trainer=trainer, error=error, blocked=True)
        blocked += 1
    return blocked


def _sweep_unheld_updates(*, now: datetime, grace: timedelta, limit: int) -> int:
    """Trainers updating whose update no live process holds: never taken (the message was
    lost) or its holder died while gathering data (nothing changed the weights). Hand the
    step to the training queue again; the trainer's updated_at restarts the grace period."""
    from apps.training.tasks import update_apply_task

    held = LearningUpdate.objects.filter(
        run=OuterRef("run"), step=OuterRef("step"), heartbeat_at__gte=now - update_ttl()
    ).exclude(status=UpdateStatus.UNRESOLVED)
    trainers = list(
        Trainer.objects.filter(status=TrainerStatus.UPDATING, updated_at__lt=now - grace)
        .exclude(Exists(held))
        .exclude(
            Exists(
                LearningUpdate.objects.filter(
                    run=OuterRef("run"), step=OuterRef("step"), status=UpdateStatus.UNRESOLVED
                )
            )
        )
        .values_list("run_id", "step")[:limit]
    )
    requeued = 0
    for run_id, step in trainers:
        with transaction.atomic():
            touched = Trainer.objects.filter(
                run_id=run_id, step=step, status=TrainerStatus.UPDATING, updated_at__lt=now - grace
            ).update(updated_at=timezone.now())
            if not touched:
                continue
            update = LearningUpdate.objects.filter(run_id=run_id, step=step).first()
            if update is not None and update.holder:
                why = f"its training worker ({update.holder}) stopped heartbeating while gathering data; redone"
            else:
                why = f"step {step}'s update was never taken by a training worker (lost message)"
            LearningUpdate.objects.filter(run_id=run_id, step=step, status=UpdateStatus.PENDING).update(
                holder="", heartbeat_at=None
            )
            sweep_note(run_id=run_id, action="update_requeued", why=why)
            transaction.on_commit(lambda run_id=run_id, step=step: update_apply_task.delay(run_id, step))
        requeued += 1
    return requeued
