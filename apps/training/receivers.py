"""Training listens to execution: a started train run and settled groups (enqueue only)."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from apps.runs import signals


@receiver(signals.train_run_started, dispatch_uid="training.train_run_started")
def on_train_run_started(*, run_id: str, **_: Any) -> None:
    from apps.training.tasks import training_start_task

    training_start_task.delay(run_id)


@receiver(signals.group_settled, dispatch_uid="training.group_settled")
def on_group_settled(*, run_id: str, step: int, **_: Any) -> None:
    from apps.runs.models import Run, RunKind

    # Evaluation and execution groups settle too; only train runs have a learner.
    if Run.objects.filter(pk=run_id, kind=RunKind.TRAIN).exists():
        from apps.training.tasks import group_settled_task

        group_settled_task.delay(run_id, step)
